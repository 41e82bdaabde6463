//! `minfer split` / `minfer merge` (issue 17): split then merge gives back the input's bytes,
//! and the parts are llama-gguf-split's, byte for byte, for the same options.
//!
//! The llama.cpp gates run when the peer build has `llama-gguf-split`
//! (`flock /tmp/peer-build.lock cmake --build ~/.cache/minfer/peer/build --target
//! llama-gguf-split`) and print SKIP otherwise; the real-model gates SKIP without the cached
//! models.
//!
//! Control: writing `split.count` before `split.tensors.count` (gguf-split's order is no,
//! tensors, count) makes `parts_are_llama_gguf_splits_bytes` fail at the first part's header.

use minfer_gguf::split::{self, FirstPart, SplitLimit, SplitOptions};
use minfer_gguf::{Array, GgmlType, GgufModel, GgufWriter, Value};
use minfer_testkit::models;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::Command;

fn tmp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("minfer-split-tool-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed))
        .collect()
}

/// A model with metadata of the types ggml's gguf writes (no nested arrays) and tensors
/// of mixed types and sizes, none a multiple of 32 bytes so padding shows.
fn model_writer(alignment: Option<u32>) -> GgufWriter {
    let mut w = GgufWriter::new();
    w.set("general.architecture", Value::String("llama".into()))
        .set("general.name", Value::String("split test".into()))
        .set("llama.block_count", Value::U32(2))
        .set("llama.rope.freq_base", Value::F32(10000.0))
        .set("t.bool", Value::Bool(true))
        .set("t.i8", Value::I8(-3))
        .set("t.f64", Value::F64(0.25))
        .set(
            "tokenizer.ggml.tokens",
            Value::Array(Array::String(vec!["<s>", "a", "bc"].into())),
        )
        .set("t.i32s", Value::Array(Array::I32(vec![1, -2, 3])));
    if let Some(a) = alignment {
        w.set("general.alignment", Value::U32(a));
    }
    let mut seed = 1u8;
    let mut add = |w: &mut GgufWriter, name: &str, dims: &[u64], ty: GgmlType, n: usize| {
        w.add_tensor(name, dims, ty, pattern(n, seed)).unwrap();
        seed = seed.wrapping_add(1);
    };
    add(&mut w, "token_embd.weight", &[32, 5], GgmlType::Q8_0, 170);
    for b in 0..2 {
        add(
            &mut w,
            &format!("blk.{b}.attn_norm.weight"),
            &[9],
            GgmlType::F32,
            36,
        );
        add(
            &mut w,
            &format!("blk.{b}.attn_q.weight"),
            &[256, 3],
            GgmlType::Q4K,
            432,
        );
        add(
            &mut w,
            &format!("blk.{b}.ffn_down.weight"),
            &[64, 3],
            GgmlType::Q4_0,
            108,
        );
        add(
            &mut w,
            &format!("blk.{b}.ffn_up.weight"),
            &[7, 3],
            GgmlType::F16,
            42,
        );
    }
    add(&mut w, "output.weight", &[256, 2], GgmlType::Q6K, 420);
    w
}

fn sha(path: &Path) -> String {
    let bytes = std::fs::read(path).unwrap();
    Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn do_split(input: &Path, prefix: &Path, opts: SplitOptions) -> Vec<PathBuf> {
    let model = GgufModel::open(input).unwrap();
    let plan = split::plan_split(&model, opts).unwrap();
    let paths = split::write_split(&model, &plan, prefix, &mut |_| {}).unwrap();
    for (p, &size) in paths.iter().zip(&plan.part_sizes) {
        assert_eq!(std::fs::metadata(p).unwrap().len(), size, "{}", p.display());
    }
    paths
}

fn do_merge(first: &Path, out: &Path) {
    split::merge(&GgufModel::open(first).unwrap(), out, &mut |_| {}).unwrap();
}

const fn opts(limit: SplitLimit, first_part: FirstPart) -> SplitOptions {
    SplitOptions { limit, first_part }
}

/// Limits that give one part, one tensor a part, and cuts in between (sizes chosen so
/// some parts hold several tensors and one tensor is larger than the limit).
fn option_sets() -> Vec<(&'static str, SplitOptions)> {
    use FirstPart::*;
    use SplitLimit::*;
    vec![
        ("tensors-128", opts(MaxTensors(128), WithTensors)),
        ("tensors-1", opts(MaxTensors(1), WithTensors)),
        ("tensors-3", opts(MaxTensors(3), WithTensors)),
        ("tensors-3-nofirst", opts(MaxTensors(3), MetadataOnly)),
        ("bytes-600", opts(MaxBytes(600), WithTensors)),
        ("bytes-1000", opts(MaxBytes(1000), WithTensors)),
    ]
}

fn roundtrip(input: &Path, dir: &Path, name: &str, o: SplitOptions) -> Vec<PathBuf> {
    let sub = dir.join(name);
    std::fs::create_dir_all(&sub).unwrap();
    let parts = do_split(input, &sub.join("m"), o);
    let merged = sub.join("merged.gguf");
    do_merge(&parts[0], &merged);
    assert_eq!(
        sha(&merged),
        sha(input),
        "{name}: merge of the split differs"
    );
    parts
}

#[test]
fn split_then_merge_gives_back_the_input_bytes() {
    let dir = tmp_dir("roundtrip");
    for align in [None, Some(32), Some(64), Some(8)] {
        let input = dir.join(format!("in-{align:?}.gguf"));
        model_writer(align).write_to(&input).unwrap();
        let model = GgufModel::open(&input).unwrap();
        assert_eq!(split::canonical_layout(&model).unwrap(), None);
        for (name, o) in option_sets() {
            let parts = roundtrip(&input, &dir, &format!("{align:?}-{name}"), o);
            // Every part on its own is a valid file; the set opens as the model.
            let whole = GgufModel::open(&parts[parts.len() - 1]).unwrap();
            assert_eq!(whole.tensors().len(), model.tensors().len());
            for t in model.tensors() {
                assert_eq!(
                    whole.tensor_data(&t.info.name).unwrap().1,
                    model.tensor_data(&t.info.name).unwrap().1
                );
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn tensor_and_size_limits_cut_where_gguf_split_cuts() {
    let dir = tmp_dir("plan");
    let input = dir.join("in.gguf");
    model_writer(None).write_to(&input).unwrap();
    let model = GgufModel::open(&input).unwrap();
    let plan = |o| split::plan_split(&model, o).unwrap();
    use FirstPart::*;
    use SplitLimit::*;
    // 10 tensors, 3 a part: 3 + 3 + 3 + 1.
    let p = plan(opts(MaxTensors(3), WithTensors));
    assert_eq!(
        p.parts.iter().map(Vec::len).collect::<Vec<_>>(),
        [3, 3, 3, 1]
    );
    let p = plan(opts(MaxTensors(3), MetadataOnly));
    assert_eq!(
        p.parts.iter().map(Vec::len).collect::<Vec<_>>(),
        [0, 3, 3, 3, 1]
    );
    // Padded sizes: 192, 64, 448, 128, 64, 64, 448, 128, 64, 448. A 600-byte limit closes
    // a part before the bytes would pass 600; the 448s never share with another 448.
    let p = plan(opts(MaxBytes(600), WithTensors));
    assert_eq!(
        p.parts,
        [vec![0, 1], vec![2, 3], vec![4, 5, 6], vec![7, 8], vec![9]]
    );
    assert!(p.oversized.is_empty());
    // A limit below one tensor's size: that tensor sits alone and is reported.
    let p = plan(opts(MaxBytes(300), WithTensors));
    assert_eq!(p.oversized, [2, 6, 9]);
    assert!(p.parts.iter().all(|part| !part.is_empty()));
    for &i in &p.oversized {
        assert!(p.parts.contains(&vec![i]), "tensor {i} alone");
    }
    // The first tensor over the limit still gets a part (gguf-split stops here).
    let p = plan(opts(MaxBytes(100), WithTensors));
    assert_eq!(p.parts[0], [0]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn merge_refuses_a_plain_file_and_both_refuse_to_overwrite() {
    let dir = tmp_dir("refuse");
    let input = dir.join("in.gguf");
    model_writer(None).write_to(&input).unwrap();
    let model = GgufModel::open(&input).unwrap();
    let e = split::merge(&model, &dir.join("out.gguf"), &mut |_| {}).unwrap_err();
    assert!(e.to_string().contains("not a split model"), "{e}");
    let e = split::merge(&model, &input, &mut |_| {}).unwrap_err();
    assert!(e.to_string().contains("not a split model"), "{e}");
    let o = opts(SplitLimit::MaxTensors(4), FirstPart::WithTensors);
    let parts = do_split(&input, &dir.join("m"), o);
    let before = sha(&parts[1]);
    let plan = split::plan_split(&model, o).unwrap();
    let e = split::write_split(&model, &plan, &dir.join("m"), &mut |_| {}).unwrap_err();
    assert!(e.to_string().contains("already exists"), "{e}");
    assert_eq!(sha(&parts[1]), before, "an existing part was touched");
    let e = split::merge(&GgufModel::open(&parts[0]).unwrap(), &input, &mut |_| {}).unwrap_err();
    assert!(e.to_string().contains("already exists"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_non_canonical_file_is_named_as_such() {
    let dir = tmp_dir("canonical");
    let input = dir.join("in.gguf");
    let mut w = model_writer(None);
    // A trailing 1 in the dims: ggml's writer would write n_dims 1.
    w.add_tensor("extra.weight", &[8, 1], GgmlType::F32, pattern(32, 9))
        .unwrap();
    w.write_to(&input).unwrap();
    let why = split::canonical_layout(&GgufModel::open(&input).unwrap()).unwrap();
    assert!(why.is_some_and(|w| w.contains("n_dims")));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn real_models_split_and_merge_back_to_their_bytes() {
    let mut ran = false;
    for input in [models::smol(), models::qwen()].into_iter().flatten() {
        ran = true;
        let dir = tmp_dir("real");
        let model = GgufModel::open(&input).unwrap();
        assert_eq!(
            split::canonical_layout(&model).unwrap(),
            None,
            "{}",
            input.display()
        );
        drop(model);
        let o = opts(SplitLimit::MaxBytes(40_000_000), FirstPart::WithTensors);
        let parts = roundtrip(&input, &dir, "size", o);
        assert!(parts.len() > 1);
        let _ = std::fs::remove_dir_all(&dir);
    }
    if !ran {
        eprintln!("SKIP: no cached model (qwen2.5-coder-0.5b, smollm2-135m)");
    }
}

// ---------------------------------------------------------------------------------------------
// llama-gguf-split

fn gguf_split_bin() -> Option<PathBuf> {
    let p = std::env::var_os("MINFER_PEER_BUILD")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/minfer/peer/build"))
        })?
        .join("bin/llama-gguf-split");
    if !p.exists() {
        eprintln!(
            "SKIP: {} not built (cmake --build ~/.cache/minfer/peer/build --target llama-gguf-split)",
            p.display()
        );
        return None;
    }
    Some(p)
}

fn gguf_split_args(o: SplitOptions) -> Vec<String> {
    let mut a = match o.limit {
        SplitLimit::MaxTensors(n) => vec!["--split-max-tensors".into(), n.to_string()],
        // gguf-split takes only M and G; these tests use whole megabytes.
        SplitLimit::MaxBytes(b) => vec!["--split-max-size".into(), format!("{}M", b / 1_000_000)],
    };
    if o.first_part == FirstPart::MetadataOnly {
        a.push("--no-tensor-first-split".into());
    }
    a
}

fn run_tool(bin: &Path, args: &[String]) {
    let out = Command::new(bin).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{} {args:?}: {}\n{}",
        bin.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Splits `input` with both tools and compares every part byte for byte, then checks that
/// gguf-split's merge of our parts equals its merge of its own, and that our merge of its
/// merged file is the input (its merge keeps split keys, ours drops them).
fn compare_with_gguf_split(bin: &Path, input: &Path, dir: &Path, name: &str, o: SplitOptions) {
    let ours_dir = dir.join(format!("{name}-ours"));
    let theirs_dir = dir.join(format!("{name}-theirs"));
    std::fs::create_dir_all(&ours_dir).unwrap();
    std::fs::create_dir_all(&theirs_dir).unwrap();
    let ours = do_split(input, &ours_dir.join("m"), o);
    let mut args = gguf_split_args(o);
    args.push(input.display().to_string());
    args.push(theirs_dir.join("m").display().to_string());
    run_tool(bin, &args);
    for p in &ours {
        let theirs = theirs_dir.join(p.file_name().unwrap());
        assert!(
            theirs.exists(),
            "{name}: gguf-split wrote no {}",
            theirs.display()
        );
        assert_eq!(sha(p), sha(&theirs), "{name}: {} differs", theirs.display());
    }
    let n_theirs = std::fs::read_dir(&theirs_dir).unwrap().count();
    assert_eq!(n_theirs, ours.len(), "{name}: part counts differ");
    let merged_ours = dir.join(format!("{name}-gguf-merge-of-ours.gguf"));
    let merged_theirs = dir.join(format!("{name}-gguf-merge-of-theirs.gguf"));
    for (parts_dir, out) in [(&ours_dir, &merged_ours), (&theirs_dir, &merged_theirs)] {
        let first = split_first(parts_dir, ours.len());
        run_tool(bin, &["--merge".into(), first, out.display().to_string()]);
    }
    assert_eq!(
        sha(&merged_ours),
        sha(&merged_theirs),
        "{name}: gguf-split merges differ"
    );
    let back = dir.join(format!("{name}-back.gguf"));
    do_merge(&merged_ours, &back);
    assert_eq!(
        sha(&back),
        sha(input),
        "{name}: gguf-split's merge is not the input plus split keys"
    );
}

fn split_first(dir: &Path, n: usize) -> String {
    dir.join(format!("m-00001-of-{n:05}.gguf"))
        .display()
        .to_string()
}

#[test]
fn parts_are_llama_gguf_splits_bytes() {
    let Some(bin) = gguf_split_bin() else { return };
    let dir = tmp_dir("llama");
    for align in [None, Some(32)] {
        let input = dir.join(format!("in-{align:?}.gguf"));
        model_writer(align).write_to(&input).unwrap();
        for (name, o) in option_sets() {
            if matches!(o.limit, SplitLimit::MaxBytes(_)) {
                continue; // gguf-split's sizes are whole megabytes: see the real-model test
            }
            compare_with_gguf_split(&bin, &input, &dir, &format!("{align:?}-{name}"), o);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn real_model_parts_are_llama_gguf_splits_bytes() {
    let Some(bin) = gguf_split_bin() else { return };
    let Some(input) = models::smol() else {
        eprintln!("SKIP: smollm2-135m not cached");
        return;
    };
    let dir = tmp_dir("llama-real");
    use FirstPart::*;
    use SplitLimit::*;
    for (name, o) in [
        ("size-40M", opts(MaxBytes(40_000_000), WithTensors)),
        ("size-50M-nofirst", opts(MaxBytes(50_000_000), MetadataOnly)),
        ("tensors-50", opts(MaxTensors(50), WithTensors)),
    ] {
        compare_with_gguf_split(&bin, &input, &dir, name, o);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// At alignment 64 gguf-split's bytes would be wrong (it pads with 32), so ours differ by
/// design; gguf-split (ggml's reader) still reads every part of ours: its merge succeeds.
#[test]
fn llama_gguf_split_reads_our_parts_of_a_64_aligned_model() {
    let Some(bin) = gguf_split_bin() else { return };
    let dir = tmp_dir("llama-64");
    let input = dir.join("in.gguf");
    model_writer(Some(64)).write_to(&input).unwrap();
    let o = opts(SplitLimit::MaxTensors(3), FirstPart::WithTensors);
    let ours = do_split(&input, &dir.join("m"), o);
    let out = dir.join("merged.gguf");
    run_tool(
        &bin,
        &[
            "--merge".into(),
            split_first(&dir, ours.len()),
            out.display().to_string(),
        ],
    );
    let _ = std::fs::remove_dir_all(&dir);
}
