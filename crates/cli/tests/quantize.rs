//! `minfer quantize` is byte-identical to llama-quantize (issue 17).
//!
//! Inputs: an f16 model made by `minfer synth` (8 layers, GQA 4, an FFN width of 288 so that
//! ffn_down's rows are not whole K-quant blocks and take the fallback path, an untied
//! output), and the demo model (Q4_K_M, tied embeddings) with `--allow-requantize`.
//!
//! Every case's sha256 is in `fixtures/quantize-sha256.txt`, so CI checks the bytes without
//! the peer. When the peer build (`$MINFER_PEER` or `~/.cache/minfer/peer`, with
//! `build/bin/llama-quantize`) is present, each case is also run through llama-quantize and
//! the two files compared byte for byte; `MINFER_REGEN_QUANT_FIXTURE=1` (with `--test-threads=1`: the tests share the file) rewrites the fixture
//! from llama-quantize's outputs (never from ours).

use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn minfer() -> Command {
    Command::new(env!("CARGO_BIN_EXE_minfer"))
}

fn fixture_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/quantize-sha256.txt")
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
    let bytes = std::fs::read(path).unwrap();
    Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn read_fixture() -> BTreeMap<String, String> {
    std::fs::read_to_string(fixture_path())
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split_once(' '))
        .map(|(k, v)| (k.to_string(), v.trim().to_string()))
        .collect()
}

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("minfer-quantize-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// One case: options before IN OUT TYPE, as both tools take them.
struct Case {
    name: String,
    flags: Vec<String>,
    ftype: String,
}

fn synth_cases() -> Vec<Case> {
    let mut v = Vec::new();
    for t in [
        "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K_S", "Q4_K_S",
        "Q5_K_S", "Q6_K", "IQ4_NL", "IQ4_XS",
    ] {
        v.push(Case {
            name: format!("synth-pure-{t}"),
            flags: vec!["--pure".into()],
            ftype: t.into(),
        });
    }
    for t in [
        "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S",
        "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K", "IQ4_NL", "IQ4_XS",
    ] {
        v.push(Case {
            name: format!("synth-{t}"),
            flags: vec![],
            ftype: t.into(),
        });
    }
    let flags = [
        "--output-tensor-type",
        "q8_0",
        "--token-embedding-type",
        "q4_k",
        "--tensor-type",
        "attn_q=q5_k",
        "--tensor-type",
        "FFN_UP=iq4_xs",
    ];
    v.push(Case {
        name: "synth-Q4_K_M-leave-output".into(),
        flags: vec!["--leave-output-tensor".into()],
        ftype: "Q4_K_M".into(),
    });
    v.push(Case {
        name: "synth-Q4_K_M-overrides".into(),
        flags: flags.iter().map(|s| s.to_string()).collect(),
        ftype: "Q4_K_M".into(),
    });
    v
}

fn demo_cases() -> Vec<Case> {
    ["Q4_0", "Q8_0", "Q4_K_M"]
        .into_iter()
        .map(|t| Case {
            name: format!("demo-requant-{t}"),
            flags: vec!["--allow-requantize".into()],
            ftype: t.into(),
        })
        .collect()
}

fn ours(case: &Case, input: &Path, out: &Path) {
    let o = minfer()
        .arg("quantize")
        .args(&case.flags)
        .args(["-t", "2"])
        .arg(input)
        .arg(out)
        .arg(&case.ftype)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}: {o:?}", case.name);
}

fn peer(bin: &Path, case: &Case, input: &Path, out: &Path) {
    let o = Command::new(bin)
        .args(&case.flags)
        .arg(input)
        .arg(out)
        .arg(&case.ftype)
        .arg("2")
        .output()
        .unwrap();
    assert!(o.status.success(), "llama-quantize {}: {o:?}", case.name);
}

/// Runs the cases; returns the peer's hashes (empty without the peer).
fn check(cases: &[Case], input: &Path, dir: &Path) -> BTreeMap<String, String> {
    let fixture = read_fixture();
    let regen = std::env::var_os("MINFER_REGEN_QUANT_FIXTURE").is_some();
    let bin = llama_quantize();
    if bin.is_none() {
        println!("SKIP: llama-quantize not built (peer comparison); checking the fixture only");
    }
    let mut peer_hashes = BTreeMap::new();
    for case in cases {
        let mine = dir.join(format!("{}.ours.gguf", case.name));
        ours(case, input, &mine);
        let got = sha256(&mine);
        if let Some(bin) = &bin {
            let theirs = dir.join(format!("{}.peer.gguf", case.name));
            peer(bin, case, input, &theirs);
            let want = sha256(&theirs);
            assert_eq!(
                got, want,
                "{}: bytes differ from llama-quantize's",
                case.name
            );
            peer_hashes.insert(case.name.clone(), want);
            std::fs::remove_file(&theirs).ok();
        }
        if !regen {
            let want = fixture.get(&case.name).unwrap_or_else(|| {
                panic!(
                    "{} missing from {}; regenerate with MINFER_REGEN_QUANT_FIXTURE=1 cargo \
                     test --release -p minfer-cli --test quantize (needs the peer build)",
                    case.name,
                    fixture_path().display()
                )
            });
            assert_eq!(
                &got, want,
                "{}: sha256 differs from the fixture (llama-quantize's bytes)",
                case.name
            );
        }
        std::fs::remove_file(&mine).ok();
    }
    peer_hashes
}

/// Writes the fixture from llama-quantize's hashes, keeping entries this run did not touch.
fn regen(new: BTreeMap<String, String>) {
    if std::env::var_os("MINFER_REGEN_QUANT_FIXTURE").is_none() || new.is_empty() {
        return;
    }
    let mut all = read_fixture();
    all.extend(new);
    let mut text = String::from(
        "# sha256 of llama-quantize's output per case (crates/cli/tests/quantize.rs).\n\
         # Regenerate: MINFER_REGEN_QUANT_FIXTURE=1 cargo test --release -p minfer-cli --test quantize -- --test-threads=1\n",
    );
    for (k, v) in all {
        text += &format!("{k} {v}\n");
    }
    std::fs::write(fixture_path(), text).unwrap();
}

fn synth_input(dir: &Path) -> PathBuf {
    let input = dir.join("synth-f16.gguf");
    let o = minfer()
        .args([
            "synth", "--arch", "qwen2", "--layers", "8", "--embd", "256", "--heads", "4",
        ])
        .args([
            "--kv-heads",
            "1",
            "--ffn",
            "288",
            "--type",
            "f16",
            "--seed",
            "7",
            "-o",
        ])
        .arg(&input)
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    input
}

#[test]
fn quantize_of_a_synth_f16_model_matches_llama_quantize_bytes() {
    let dir = tmpdir("synth");
    let input = synth_input(&dir);
    // The input must be the one the fixture was made from, or every hash would differ.
    let mut hashes = BTreeMap::from([("synth-input".to_string(), sha256(&input))]);
    if std::env::var_os("MINFER_REGEN_QUANT_FIXTURE").is_none() {
        assert_eq!(
            Some(&hashes["synth-input"]),
            read_fixture().get("synth-input"),
            "`minfer synth` no longer writes the fixture's input model; regenerate the fixture \
             with MINFER_REGEN_QUANT_FIXTURE=1 (needs the peer build)"
        );
    }
    hashes.extend(check(&synth_cases(), &input, &dir));
    regen(hashes);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn requantize_of_the_demo_model_matches_llama_quantize_bytes() {
    let Some(demo) = minfer_testkit::models::qwen() else {
        return;
    };
    let dir = tmpdir("demo");
    let hashes = check(&demo_cases(), &demo, &dir);
    regen(hashes);
    std::fs::remove_dir_all(&dir).ok();
}

/// Controls: the mixture rules change the bytes (pure and mixed Q4_K_M differ), a quantized
/// source is refused without --allow-requantize, and unknown names are refused by name.
#[test]
fn quantize_refuses_what_it_cannot_do_and_mixtures_matter() {
    let f = read_fixture();
    assert_ne!(f.get("synth-pure-Q4_K_S"), f.get("synth-Q4_K_M"));
    assert_ne!(f.get("synth-Q4_K_S"), f.get("synth-Q4_K_M"));
    let dir = tmpdir("refuse");
    let input = synth_input(&dir);
    let q = dir.join("q.gguf");
    let run = |flags: &[&str], ftype: &str, out: &Path| {
        minfer()
            .arg("quantize")
            .args(flags)
            .arg(&input)
            .arg(out)
            .arg(ftype)
            .output()
            .unwrap()
    };
    let o = run(&[], "Q4_0", &q);
    assert!(o.status.success(), "{o:?}");
    let o = minfer()
        .arg("quantize")
        .arg(&q)
        .arg(dir.join("r.gguf"))
        .arg("Q8_0")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("--allow-requantize"),
        "{err}"
    );
    assert!(!dir.join("r.gguf").exists());
    for (flags, ftype, needle) in [
        (vec![], "IQ2_XXS", "unknown quantization type \"IQ2_XXS\""),
        (
            vec!["--output-tensor-type", "iq2_xxs"],
            "Q4_0",
            "cannot quantize to IQ2_XXS",
        ),
        (
            vec!["--tensor-type", "attn=q9"],
            "Q4_0",
            "unknown ggml type \"q9\"",
        ),
        (vec!["--imatrix", "x.dat"], "Q4_0", "--imatrix"),
    ] {
        let o = run(&flags, ftype, &dir.join("x.gguf"));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success() && err.contains(needle),
            "{flags:?} {ftype}: {err}"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// A split input (three parts, written by `GgufWriter::write_split` in llama-gguf-split's
/// layout) quantizes to the bytes of the unsplit input: the split keys are dropped and the
/// tensors sorted as llama-quantize sorts them. (llama-quantize gives the same sha256 for
/// llama-gguf-split's parts of this model.)
#[test]
fn quantize_of_a_split_input_matches_the_unsplit_bytes() {
    let dir = tmpdir("split");
    let input = synth_input(&dir);
    let model = minfer_gguf::GgufModel::open(&input).unwrap();
    let mut w = minfer_gguf::GgufWriter::new();
    w.metadata = model.metadata().clone();
    for t in model.tensors() {
        let (info, bytes) = model.tensor_data(&t.info.name).unwrap();
        w.add_tensor(&info.name, &info.dims, info.ty, bytes.to_vec())
            .unwrap();
    }
    let parts = w.write_split(&dir, "sp", 3).unwrap();
    let out = dir.join("q.gguf");
    let case = Case {
        name: "synth-Q4_K_M".into(),
        flags: vec![],
        ftype: "Q4_K_M".into(),
    };
    ours(&case, &parts[1], &out);
    assert_eq!(Some(&sha256(&out)), read_fixture().get("synth-Q4_K_M"));
    std::fs::remove_dir_all(&dir).ok();
}

/// Runs `minfer split --split-max-tensors N` on `input`; returns part 1 of the set.
fn split_with_minfer(input: &Path, prefix: &Path, max_tensors: usize) -> PathBuf {
    let o = minfer()
        .arg("split")
        .args(["--split-max-tensors", &max_tensors.to_string()])
        .arg(input)
        .arg(prefix)
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let mut parts: Vec<PathBuf> = std::fs::read_dir(prefix.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_str().unwrap();
            name.starts_with(&format!(
                "{}-",
                prefix.file_name().unwrap().to_str().unwrap()
            ))
        })
        .collect();
    parts.sort();
    parts.remove(0)
}

/// `quantize --keep-split IN OUT TYPE` with `OUT.gguf`; returns the parts it wrote, in order.
fn keep_split_ours(input: &Path, out: &Path, ftype: &str, n: usize) -> Vec<PathBuf> {
    let o = minfer()
        .args(["quantize", "--keep-split", "-t", "2"])
        .arg(input)
        .arg(out.with_extension("gguf"))
        .arg(ftype)
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let parts = keep_split_names(out, n);
    for p in &parts {
        assert!(p.is_file(), "{} missing", p.display());
    }
    parts
}

fn keep_split_names(prefix: &Path, n: usize) -> Vec<PathBuf> {
    (1..=n)
        .map(|k| {
            let name = format!(
                "{}-{k:05}-of-{n:05}.gguf",
                prefix.file_name().unwrap().to_str().unwrap()
            );
            prefix.with_file_name(name)
        })
        .collect()
}

/// `--keep-split` (issue 17): the synth f16 model cut by `minfer split` into three parts
/// quantizes (Q4_K_M) to three parts, each byte-identical to llama-quantize --keep-split's
/// (checked through the fixture's sha256 without the peer). Controls: the parts hold the
/// tensors of the unsplit quantization, names, types and bytes (the order alone differs:
/// file order instead of layer-then-name), and a split into two parts gives other files.
#[test]
fn keep_split_parts_match_llama_quantize_bytes() {
    let dir = tmpdir("keep-split");
    let input = synth_input(&dir);
    let first = split_with_minfer(&input, &dir.join("sp"), 40);
    let parts = keep_split_ours(&first, &dir.join("ours"), "Q4_K_M", 3);
    let key = |k: usize| format!("synth-keep-split-Q4_K_M-part{k}");
    let mut peer_hashes = BTreeMap::new();
    if let Some(bin) = llama_quantize() {
        let o = Command::new(&bin)
            .arg("--keep-split")
            .arg(&first)
            .arg(dir.join("peer.gguf"))
            .args(["Q4_K_M", "2"])
            .output()
            .unwrap();
        assert!(o.status.success(), "llama-quantize --keep-split: {o:?}");
        let theirs = keep_split_names(&dir.join("peer"), 3);
        for (k, (a, b)) in parts.iter().zip(&theirs).enumerate() {
            let want = sha256(b);
            assert_eq!(
                sha256(a),
                want,
                "part {}: bytes differ from llama-quantize's",
                k + 1
            );
            peer_hashes.insert(key(k + 1), want);
        }
    } else {
        println!("SKIP: llama-quantize not built (peer comparison); checking the fixture only");
    }
    if std::env::var_os("MINFER_REGEN_QUANT_FIXTURE").is_none() {
        let fixture = read_fixture();
        for (k, p) in parts.iter().enumerate() {
            assert_eq!(
                Some(&sha256(p)),
                fixture.get(&key(k + 1)),
                "part {}: sha256 differs from the fixture (llama-quantize's bytes)",
                k + 1
            );
        }
    }
    regen(peer_hashes);

    // Control: the same tensors as the unsplit quantization.
    let whole = dir.join("whole.gguf");
    let case = Case {
        name: "synth-Q4_K_M".into(),
        flags: vec![],
        ftype: "Q4_K_M".into(),
    };
    ours(&case, &input, &whole);
    let whole = minfer_gguf::GgufModel::open(&whole).unwrap();
    let split = minfer_gguf::GgufModel::open(&parts[1]).unwrap();
    assert_eq!(split.parts().len(), 3);
    assert_eq!(split.tensors().len(), whole.tensors().len());
    let order = |m: &minfer_gguf::GgufModel| -> Vec<String> {
        m.tensors().iter().map(|t| t.info.name.clone()).collect()
    };
    assert_ne!(order(&split), order(&whole), "keep-split keeps file order");
    for t in whole.tensors() {
        let (wi, wb) = whole.tensor_data(&t.info.name).unwrap();
        let (si, sb) = split.tensor_data(&t.info.name).unwrap();
        assert_eq!((si.ty, &si.dims), (wi.ty, &wi.dims), "{}", t.info.name);
        assert!(
            sb == wb,
            "{}: bytes differ from the unsplit output",
            t.info.name
        );
    }
    // Control: another layout gives other parts.
    std::fs::create_dir_all(dir.join("two")).unwrap();
    let first2 = split_with_minfer(&input, &dir.join("two/sp"), 60);
    let two = keep_split_ours(&first2, &dir.join("two/q"), "Q4_K_M", 2);
    assert_ne!(sha256(&two[0]), sha256(&parts[0]));
    assert!(!dir.join("two/q-00003-of-00003.gguf").exists());
    // Refused by name: an OUT that llama-quantize would mangle.
    let o = minfer()
        .args(["quantize", "--keep-split"])
        .arg(&first)
        .arg(dir.join("x.gguf.bin"))
        .arg("Q4_0")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("--keep-split output"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
}
