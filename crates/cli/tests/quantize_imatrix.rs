//! `minfer quantize --imatrix` is byte-identical to `llama-quantize --imatrix` (issue 17).
//!
//! The importance matrices in `fixtures/imatrix/` were written by llama-imatrix
//! (`scripts/make-imatrix-fixtures.sh`): `synth-imatrix.gguf` and `synth-imatrix.dat`
//! (the GGUF and legacy formats) for the `minfer synth` model of `tests/quantize.rs`, and
//! `demo-imatrix.dat` for the demo model. Both tools run from that directory with the bare
//! file name, because llama-quantize records the name it was given in
//! `quantize.imatrix.file`.
//!
//! Every case's sha256 is in `fixtures/quantize-imatrix-sha256.txt` so CI checks the bytes
//! without the peer; with the peer build each case also runs through llama-quantize and the
//! files are compared. `MINFER_REGEN_QUANT_FIXTURE=1` rewrites the fixture from
//! llama-quantize's outputs.

use minfer_gguf::{GgmlType, GgufModel, GgufWriter, Value};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn minfer() -> Command {
    Command::new(env!("CARGO_BIN_EXE_minfer"))
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn imatrix_dir() -> PathBuf {
    fixtures().join("imatrix")
}

fn fixture_path() -> PathBuf {
    fixtures().join("quantize-imatrix-sha256.txt")
}

fn llama_quantize() -> Option<PathBuf> {
    let root = std::env::var_os("MINFER_PEER")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/minfer/peer"))
        })?;
    let bin = root.join("build/bin/llama-quantize");
    bin.is_file().then_some(bin)
}

fn sha256(path: &Path) -> String {
    Sha256::digest(std::fs::read(path).unwrap())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn read_fixture(path: &Path) -> BTreeMap<String, String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split_once(' '))
        .map(|(k, v)| (k.to_string(), v.trim().to_string()))
        .collect()
}

fn regen_requested() -> bool {
    std::env::var_os("MINFER_REGEN_QUANT_FIXTURE").is_some()
}

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("minfer-imatrix-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The synth model of `tests/quantize.rs` (its hash is checked against that fixture).
fn synth_input(dir: &Path) -> PathBuf {
    let input = dir.join("synth-f16.gguf");
    let o = minfer()
        .args(["synth", "--arch", "qwen2", "--layers", "8", "--embd", "256"])
        .args([
            "--heads",
            "4",
            "--kv-heads",
            "1",
            "--ffn",
            "288",
            "--type",
            "f16",
        ])
        .args(["--seed", "7", "-o"])
        .arg(&input)
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let want = read_fixture(&fixtures().join("quantize-sha256.txt"));
    assert_eq!(
        Some(&sha256(&input)),
        want.get("synth-input"),
        "`minfer synth` no longer writes the model the imatrix fixtures were made for; \
         rerun scripts/make-imatrix-fixtures.sh and regenerate the fixtures"
    );
    input
}

struct Case {
    name: String,
    flags: Vec<String>,
    ftype: String,
}

fn case(name: String, imatrix: &str, extra: &[&str], ftype: &str) -> Case {
    let mut flags = vec!["--imatrix".to_string(), imatrix.to_string()];
    flags.extend(extra.iter().map(|s| s.to_string()));
    Case {
        name,
        flags,
        ftype: ftype.into(),
    }
}

fn synth_cases() -> Vec<Case> {
    let mut v = Vec::new();
    for (fmt, file) in [("gguf", "synth-imatrix.gguf"), ("dat", "synth-imatrix.dat")] {
        for t in [
            "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K_S", "Q4_K_S", "Q5_K_S", "Q6_K",
            "IQ4_NL", "IQ4_XS",
        ] {
            v.push(case(format!("synth-{fmt}-pure-{t}"), file, &["--pure"], t));
        }
        for t in [
            "Q4_0", "Q5_0", "Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S", "Q4_K_M", "Q5_K_M",
            "IQ4_NL", "IQ4_XS",
        ] {
            v.push(case(format!("synth-{fmt}-{t}"), file, &[], t));
        }
    }
    v.push(case(
        "synth-dat-Q4_K_M-exclude-attn_v".into(),
        "synth-imatrix.dat",
        &["--exclude-weights", "attn_v"],
        "Q4_K_M",
    ));
    v.push(case(
        "synth-gguf-Q4_K_M-include-ffn".into(),
        "synth-imatrix.gguf",
        &["--include-weights", "ffn"],
        "Q4_K_M",
    ));
    v
}

/// Runs one tool with options before IN OUT TYPE, from the imatrix directory.
fn run_ours(flags: &[String], input: &Path, out: &Path, ftype: &str) -> Output {
    minfer()
        .current_dir(imatrix_dir())
        .arg("quantize")
        .args(flags)
        // The cases write the same outputs again (each case's file, then the controls').
        .args(["-t", "2", "--force"])
        .arg(input)
        .arg(out)
        .arg(ftype)
        .output()
        .unwrap()
}

fn run_peer(bin: &Path, c: &Case, input: &Path, out: &Path) {
    let o = Command::new(bin)
        .current_dir(imatrix_dir())
        .args(&c.flags)
        .arg(input)
        .arg(out)
        .arg(&c.ftype)
        .arg("2")
        .output()
        .unwrap();
    assert!(o.status.success(), "llama-quantize {}: {o:?}", c.name);
}

/// Runs the cases against the peer (when built) and the fixture; returns peer hashes.
fn check(cases: &[Case], input: &Path, dir: &Path) -> BTreeMap<String, String> {
    let fixture = read_fixture(&fixture_path());
    let bin = llama_quantize();
    if bin.is_none() {
        println!("SKIP: llama-quantize not built (peer comparison); checking the fixture only");
    }
    let mut peer = BTreeMap::new();
    for c in cases {
        let mine = dir.join(format!("{}.ours.gguf", c.name));
        let o = run_ours(&c.flags, input, &mine, &c.ftype);
        assert!(o.status.success(), "{}: {o:?}", c.name);
        let got = sha256(&mine);
        if let Some(bin) = &bin {
            let theirs = dir.join(format!("{}.peer.gguf", c.name));
            run_peer(bin, c, input, &theirs);
            let want = sha256(&theirs);
            assert_eq!(got, want, "{}: bytes differ from llama-quantize's", c.name);
            peer.insert(c.name.clone(), want);
            std::fs::remove_file(&theirs).ok();
        }
        if !regen_requested() {
            let want = fixture.get(&c.name).unwrap_or_else(|| {
                panic!(
                    "{} missing from {}; regenerate with MINFER_REGEN_QUANT_FIXTURE=1 \
                     (needs the peer build)",
                    c.name,
                    fixture_path().display()
                )
            });
            assert_eq!(&got, want, "{}: sha256 differs from the fixture", c.name);
        }
        std::fs::remove_file(&mine).ok();
    }
    peer
}

fn regen(new: BTreeMap<String, String>) {
    if !regen_requested() || new.is_empty() {
        return;
    }
    let mut all = read_fixture(&fixture_path());
    all.extend(new);
    let mut text = String::from(
        "# sha256 of llama-quantize --imatrix output per case (crates/cli/tests/quantize_imatrix.rs).\n\
         # Regenerate: MINFER_REGEN_QUANT_FIXTURE=1 cargo test --release -p minfer-cli --test quantize_imatrix -- --test-threads=1\n",
    );
    for (k, v) in all {
        text += &format!("{k} {v}\n");
    }
    std::fs::write(fixture_path(), text).unwrap();
}

#[test]
fn imatrix_quantize_of_a_synth_model_matches_llama_quantize_bytes() {
    let dir = tmpdir("synth");
    let input = synth_input(&dir);
    regen(check(&synth_cases(), &input, &dir));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn imatrix_requantize_of_the_demo_model_matches_llama_quantize_bytes() {
    let Some(demo) = minfer_testkit::models::qwen() else {
        return;
    };
    let dir = tmpdir("demo");
    let cases: Vec<Case> = ["Q4_K_M", "Q4_0"]
        .into_iter()
        .map(|t| {
            case(
                format!("demo-dat-requant-{t}"),
                "demo-imatrix.dat",
                &["--allow-requantize"],
                t,
            )
        })
        .collect();
    regen(check(&cases, &demo, &dir));
    std::fs::remove_dir_all(&dir).ok();
}

/// Writes a legacy imatrix: entries (name, ncall, values), then chunk count and dataset.
fn write_dat(path: &Path, entries: &[(&str, i32, Vec<f32>)], trailer: Option<(i32, &str)>) {
    let mut b = Vec::new();
    b.extend((entries.len() as i32).to_le_bytes());
    for (name, ncall, values) in entries {
        b.extend((name.len() as i32).to_le_bytes());
        b.extend(name.as_bytes());
        b.extend(ncall.to_le_bytes());
        b.extend((values.len() as i32).to_le_bytes());
        for v in values {
            b.extend(v.to_le_bytes());
        }
    }
    if let Some((chunks, dataset)) = trailer {
        b.extend(chunks.to_le_bytes());
        b.extend((dataset.len() as i32).to_le_bytes());
        b.extend(dataset.as_bytes());
    }
    std::fs::write(path, b).unwrap();
}

/// The bytes of one tensor of a GGUF file.
fn tensor_bytes(path: &Path, name: &str) -> Vec<u8> {
    let m = GgufModel::open(path).unwrap();
    m.tensor_data(name).unwrap().1.to_vec()
}

/// Controls for the byte-identity gate: the imatrix changes the quantized weights of every
/// weighted type (not only the metadata) and leaves Q8_0's alone, as ggml ignores it there;
/// a perturbed entry changes that tensor's bytes; the metadata records the file.
#[test]
fn the_imatrix_changes_the_weights_it_should() {
    let dir = tmpdir("controls");
    let input = synth_input(&dir);
    let t = "blk.0.attn_q.weight";
    let quantize = |flags: &[&str], ftype: &str, out: &Path| {
        let flags: Vec<String> = flags.iter().map(|s| s.to_string()).collect();
        let o = run_ours(&flags, &input, out, ftype);
        assert!(o.status.success(), "{o:?}");
    };
    for ty in [
        "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K_S", "Q4_K_S", "Q5_K_S", "Q6_K", "IQ4_NL",
        "IQ4_XS", "Q8_0",
    ] {
        let (plain, weighted) = (dir.join("plain.gguf"), dir.join("weighted.gguf"));
        quantize(&["--pure"], ty, &plain);
        quantize(
            &["--pure", "--imatrix", "synth-imatrix.gguf"],
            ty,
            &weighted,
        );
        let same = tensor_bytes(&plain, t) == tensor_bytes(&weighted, t);
        assert_eq!(
            same,
            ty == "Q8_0",
            "{ty}: the imatrix should change {t} unless Q8_0"
        );
    }
    let weighted = dir.join("weighted.gguf");
    quantize(
        &["--pure", "--imatrix", "synth-imatrix.dat"],
        "Q4_K_S",
        &weighted,
    );
    let m = GgufModel::open(&weighted).unwrap();
    let md = m.metadata();
    assert_eq!(
        md.get_str("quantize.imatrix.file"),
        Some("synth-imatrix.dat")
    );
    assert_eq!(md.get_str("quantize.imatrix.dataset"), Some("text.txt"));
    assert_eq!(
        md.get("quantize.imatrix.entries_count"),
        Some(&Value::U32(57))
    );
    assert_eq!(
        md.get("quantize.imatrix.chunks_count"),
        Some(&Value::U32(4))
    );
    // One column of one entry made 1000 times more important.
    let mut entries: Vec<(&str, i32, Vec<f32>)> = Vec::new();
    let mut names = Vec::new();
    let src = GgufModel::open(&input).unwrap();
    for tt in src.tensors() {
        if tt.info.dims.len() == 2 && tt.info.name.starts_with("blk.") {
            names.push((tt.info.name.clone(), tt.info.dims[0] as usize));
        }
    }
    for (n, cols) in &names {
        let mut v: Vec<f32> = (0..*cols).map(|i| 1.0 + (i % 7) as f32).collect();
        if n == t {
            v[5] *= 1000.0;
        }
        entries.push((n.as_str(), 1, v));
    }
    let a = dir.join("a.dat");
    write_dat(&a, &entries, Some((1, "x")));
    let perturbed = dir.join("perturbed.gguf");
    quantize(
        &["--pure", "--imatrix", a.to_str().unwrap()],
        "Q4_K_S",
        &perturbed,
    );
    for e in entries.iter_mut() {
        if e.0 == t {
            e.2[5] /= 1000.0;
        }
    }
    let b = dir.join("b.dat");
    write_dat(&b, &entries, Some((1, "x")));
    let base = dir.join("base.gguf");
    quantize(
        &["--pure", "--imatrix", b.to_str().unwrap()],
        "Q4_K_S",
        &base,
    );
    assert_ne!(tensor_bytes(&perturbed, t), tensor_bytes(&base, t));
    let other = "blk.1.attn_q.weight";
    assert_eq!(tensor_bytes(&perturbed, other), tensor_bytes(&base, other));
    std::fs::remove_dir_all(&dir).ok();
}

/// Malformed files and entries that do not fit are refused, naming the file or entry; each
/// refusal has a control that passes.
#[test]
fn malformed_imatrices_are_refused_by_name() {
    let dir = tmpdir("refuse");
    let input = synth_input(&dir);
    let out = dir.join("out.gguf");
    let quantize = |im: &Path, ftype: &str| -> Output {
        let flags = vec!["--imatrix".to_string(), im.to_str().unwrap().to_string()];
        run_ours(&flags, &input, &out, ftype)
    };
    let refused = |o: &Output, needles: &[&str]| {
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "accepted: {err}");
        for n in needles {
            assert!(err.contains(n), "{n:?} not in: {err}");
        }
        assert!(!out.exists(), "a refused run left {}", out.display());
    };
    let q: Vec<f32> = (0..256).map(|i| 1.0 + i as f32).collect();
    let good = dir.join("good.dat");
    write_dat(
        &good,
        &[("blk.0.attn_q.weight", 2, q.clone())],
        Some((3, "d")),
    );
    let o = quantize(&good, "Q4_K_M");
    assert!(o.status.success(), "control: {o:?}");
    std::fs::remove_file(&out).unwrap();

    // Truncated: the values stop early.
    let bytes = std::fs::read(&good).unwrap();
    let cut = dir.join("cut.dat");
    std::fs::write(&cut, &bytes[..bytes.len() - 600]).unwrap();
    refused(
        &quantize(&cut, "Q4_K_M"),
        &["cut.dat", "truncated", "blk.0.attn_q.weight"],
    );
    // No entries.
    let empty = dir.join("empty.dat");
    std::fs::write(&empty, 0i32.to_le_bytes()).unwrap();
    refused(&quantize(&empty, "Q4_K_M"), &["empty.dat", "no data"]);
    // A size that does not match the tensor (token_embd is the exception llama makes).
    let wrong = dir.join("wrong.dat");
    write_dat(&wrong, &[("blk.0.attn_q.weight", 1, vec![1.0; 100])], None);
    refused(
        &quantize(&wrong, "Q4_K_M"),
        &["blk.0.attn_q.weight", "100 values", "256 columns"],
    );
    let embd = dir.join("embd.dat");
    write_dat(&embd, &[("token_embd.weight", 1, vec![1.0; 100])], None);
    let o = quantize(&embd, "Q4_K_M");
    assert!(o.status.success(), "token_embd control: {o:?}");
    std::fs::remove_file(&out).unwrap();
    // Non-finite values.
    let mut nan = q.clone();
    nan[9] = f32::NAN;
    let bad = dir.join("nan.dat");
    write_dat(&bad, &[("blk.0.attn_q.weight", 1, nan)], None);
    refused(
        &quantize(&bad, "Q4_K_M"),
        &["nan.dat", "blk.0.attn_q.weight", "non-finite"],
    );
    // As in llama-quantize, an entry left out by --exclude-weights is not looked at.
    let flags: Vec<String> = [
        "--imatrix",
        bad.to_str().unwrap(),
        "--exclude-weights",
        "attn_q",
    ]
    .map(String::from)
    .to_vec();
    let o = run_ours(&flags, &input, &out, "Q4_K_M");
    assert!(o.status.success(), "excluded NaN control: {o:?}");
    std::fs::remove_file(&out).unwrap();
    // GGUF: sums without counts, and a file without the imatrix.* keys.
    let mut w = GgufWriter::new();
    w.metadata.set(
        "imatrix.datasets",
        Value::Array(minfer_gguf::Array::String(vec!["d".to_string()].into())),
    );
    w.metadata.set("imatrix.chunk_count", Value::U32(1));
    w.metadata.set("imatrix.chunk_size", Value::U32(64));
    let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    w.add_tensor(
        "blk.0.attn_q.weight.in_sum2",
        &[256, 1],
        GgmlType::F32,
        f32s(&q),
    )
    .unwrap();
    let lonely = dir.join("lonely.gguf");
    w.write_to(&lonely).unwrap();
    refused(
        &quantize(&lonely, "Q4_K_M"),
        &[
            "lonely.gguf",
            "mismatched sums and counts",
            "blk.0.attn_q.weight",
        ],
    );
    w.add_tensor(
        "blk.0.attn_q.weight.counts",
        &[1, 1],
        GgmlType::F32,
        f32s(&[4.0]),
    )
    .unwrap();
    let paired = dir.join("paired.gguf");
    w.write_to(&paired).unwrap();
    let o = quantize(&paired, "Q4_K_M");
    assert!(o.status.success(), "paired control: {o:?}");
    std::fs::remove_file(&out).unwrap();
    w.metadata.remove("imatrix.chunk_size");
    let nokeys = dir.join("nokeys.gguf");
    w.write_to(&nokeys).unwrap();
    refused(
        &quantize(&nokeys, "Q4_K_M"),
        &["nokeys.gguf", "missing imatrix metadata"],
    );
    // Types llama.cpp requires an imatrix for (IQ1/IQ2) stay refused with one.
    let o = run_ours(
        &[
            "--imatrix".into(),
            good.to_str().unwrap().into(),
            "--tensor-type".into(),
            "attn_q=iq2_xxs".into(),
        ],
        &input,
        &out,
        "Q4_K_M",
    );
    refused(&o, &["cannot quantize to IQ2_XXS"]);
    // --include-weights needs --imatrix.
    let o = run_ours(
        &["--include-weights".into(), "ffn".into()],
        &input,
        &out,
        "Q4_K_M",
    );
    refused(&o, &["--imatrix"]);
    std::fs::remove_dir_all(&dir).ok();
}
