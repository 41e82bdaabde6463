//! Issue 37 (3): `--keep-split` keeps the input's parts, so its boundaries are the split's:
//! an input cut by `minfer split` at a limit equal to an exact sum of tensor sizes, one byte
//! under and one over it, quantizes to parts holding exactly the input parts' tensors, even
//! where the quantized sizes would fit another cut (the output is never re-split by size).
//! The expected parts are written out by hand from the sizes (f32 rows of 256: 1024 bytes
//! a row).
//!
//! Control: the split planner's `>` made `>=` moves `blk.0.attn_q.weight` out of the first
//! part at the exact-sum limit, and this test fails on the input's parts (in
//! `scripts/mutants` under the split class).

use minfer_gguf::split::{self, FirstPart, SplitLimit, SplitOptions};
use minfer_gguf::{GgmlType, GgufModel, GgufWriter, Value};
use minfer_quantize::{quantize_model, Ftype, Options};
use std::path::{Path, PathBuf};

fn tmp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("minfer-keep-split-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// (name, rows of 256 f32): 3072, 1024 (together 4096), 2048, 4096 bytes.
const TENSORS: [(&str, u64); 4] = [
    ("token_embd.weight", 3),
    ("blk.0.attn_q.weight", 1),
    ("blk.0.ffn_up.weight", 2),
    ("output.weight", 4),
];

fn model(path: &Path) {
    let mut w = GgufWriter::new();
    w.set("general.architecture", Value::String("llama".into()))
        .set("llama.block_count", Value::U32(1))
        .set("llama.embedding_length", Value::U32(256));
    for (i, (name, rows)) in TENSORS.iter().enumerate() {
        let vals: Vec<u8> = (0..256 * rows)
            .flat_map(|j| (((j as f32) * 0.37 + i as f32).sin() * 0.5).to_le_bytes())
            .collect();
        w.add_tensor(*name, &[256, *rows], GgmlType::F32, vals)
            .unwrap();
    }
    w.write_to(path).unwrap();
}

/// Tensor names per part of the set whose first part is `first`.
fn names_by_part(first: &Path) -> Vec<Vec<String>> {
    let m = GgufModel::open(first).unwrap();
    let n = m.parts().len();
    let mut out = vec![Vec::new(); n];
    let mut ts: Vec<_> = m.tensors().iter().collect();
    ts.sort_by_key(|t| (t.part, t.info.offset));
    for t in ts {
        out[t.part].push(t.info.name.clone());
    }
    out
}

#[test]
fn keep_split_keeps_parts_cut_exactly_at_the_limit() {
    let dir = tmp_dir("exact");
    let input = dir.join("in.gguf");
    model(&input);
    let [a, b, c, d] = TENSORS.map(|t| t.0.to_string());
    for (limit, want) in [
        // t0 + t1 = 4096 exactly: they share the first part.
        (
            4096,
            vec![vec![a.clone(), b.clone()], vec![c.clone()], vec![d.clone()]],
        ),
        // One under: t1 opens the second part (and t2 joins it: 3072 <= 4095).
        (
            4095,
            vec![vec![a.clone()], vec![b.clone(), c.clone()], vec![d.clone()]],
        ),
        // One over: as the exact sum.
        (
            4097,
            vec![vec![a.clone(), b.clone()], vec![c.clone()], vec![d.clone()]],
        ),
    ] {
        let sub = dir.join(limit.to_string());
        std::fs::create_dir_all(&sub).unwrap();
        let m = GgufModel::open(&input).unwrap();
        let plan = split::plan_split(
            &m,
            SplitOptions {
                limit: SplitLimit::MaxBytes(limit),
                first_part: FirstPart::WithTensors,
            },
        )
        .unwrap();
        let parts = split::write_split(&m, &plan, &sub.join("in"), &mut |_| {}).unwrap();
        assert_eq!(names_by_part(&parts[0]), want, "limit {limit}: input parts");
        let mut o = Options::new(Ftype::MostlyQ8_0);
        o.keep_split = true;
        o.threads = 1;
        let out = sub.join("q.gguf");
        let summary = quantize_model(&parts[0], &out, &o, &mut |_| {}).unwrap();
        assert_eq!(
            summary.outputs.len(),
            want.len(),
            "limit {limit}: output parts"
        );
        assert_eq!(
            names_by_part(&summary.outputs[0]),
            want,
            "limit {limit}: output parts hold the input parts' tensors"
        );
        // Quantized, t0 + t1 + t2 would fit the limit; the output keeps the input's cut.
        let q = GgufModel::open(&summary.outputs[0]).unwrap();
        let bytes: u64 = q.tensors().iter().take(3).map(|t| t.info.n_bytes).sum();
        assert!(bytes <= limit, "{bytes}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
