//! The Metal executor's row classes (issue 26 point 6, ADR 0011, docs/PRECISION.md "Row
//! classes"): each run of one class takes its class's matmul tier and attention family
//! whatever the forward's row count, so `batch_invariant()` is true and a row's bits depend
//! only on its class. Generation rows: the mat-vec / multi-row kernels and the decode
//! attention families; prompt rows: the GEMM and the prefill attention families.
//!
//! Control: `MetalSettings::tier_by_rows` (`MINFER_METAL_TIER_CONTROL=by-rows`) plants the
//! choice by the forward's row count that Metal made before row classes; the same
//! comparisons then see bits change (and the backend says it is not batch invariant).

use super::*;
use crate::models::{long_prompt, tiny};
use minfer_engine::BatchEntry;
use minfer_models::Arch;
use minfer_testkit::logits::bits;

use GgmlType as T;

/// The models: Qwen2 q8_0 at head dim 64 over an f32 cache, LLaMA q4_k at head dim 128 over
/// an f16 cache (the fast attention families both, each of its two head dims).
const MODELS: [(Arch, GgmlType, usize, GgmlType); 2] = [
    (Arch::Qwen2, T::Q8_0, 64, T::F32),
    (Arch::Llama, T::Q4K, 128, T::F16),
];

/// An engine of the row (160-token context); `by_rows`: the planted row-count choice.
fn engine(row: &Row, path: &Path, cache: GgmlType, n_batch: usize, by_rows: bool) -> Engine {
    let mut cfg = EngineConfig {
        n_ctx: 160,
        threads: row.threads,
        cache_type: cache,
        backends: vec![row.backend()],
        n_batch,
        ..EngineConfig::default()
    };
    cfg.settings.metal.tier_by_rows = by_rows;
    Engine::load(path, cfg).unwrap()
}

/// A 100-token prompt's last-row logits, prefilled in chunks of `n_batch`.
fn prefill(row: &Row, path: &Path, cache: GgmlType, n_batch: usize, by_rows: bool) -> Vec<u32> {
    let prompt = long_prompt(100);
    bits(
        engine(row, path, cache, n_batch, by_rows)
            .decode(&prompt, 0, 1)
            .unwrap(),
    )
}

/// Prompt rows: a 100-token prompt prefilled whole and in chunks of 1, 7 and 64 (a 1-token
/// chunk runs the GEMM and the prefill attention on one row) gives the same last-row logits
/// bit for bit, and a prompt chunk sharing a forward with another sequence's prompt chunk
/// and a third one's generation row gives the bits it has alone. Control: the row-count
/// choice makes chunks of 1 and 7 differ from the whole prompt (mat-vec and multi-row
/// against the GEMM; the decode attention family against the prefill one at 1 row).
fn prompt_rows_are_bitwise_equal_across_chunk_sizes_and_batch_company(row: &Row, _: &()) {
    for (arch, ty, hd, cache) in MODELS {
        let path = tiny(arch, ty, hd);
        let whole = prefill(row, &path, cache, 512, false);
        for chunk in [1, 7, 64] {
            let got = prefill(row, &path, cache, chunk, false);
            println!(
                "{arch:?} {ty} hd {hd}: chunks of {chunk} == whole: {}",
                got == whole
            );
            assert!(got == whole, "{arch:?} {ty}: chunks of {chunk}");
        }
        // In company: A's second chunk between B's prompt chunk and C's generation row.
        let prompt = long_prompt(100);
        let mut e = engine(row, &path, cache, 512, false);
        let (a, b, c) = (e.seq_create(), e.seq_create(), e.seq_create());
        e.forward_batch(&[BatchEntry::prompt(a, &prompt[..40], 0, 0)])
            .unwrap();
        e.forward_batch(&[BatchEntry::prompt(c, &prompt[50..60], 0, 1)])
            .unwrap();
        let out = e
            .forward_batch(&[
                BatchEntry::prompt(b, &prompt[20..50], 0, 1),
                BatchEntry::prompt(a, &prompt[40..], 40, 1),
                BatchEntry::generated(c, &[7], 10),
            ])
            .unwrap();
        let mixed = bits(out.logits(1));
        println!("{arch:?}: in company == alone: {}", mixed == whole);
        assert!(mixed == whole, "{arch:?}: a prompt chunk among other rows");
    }
    // The control: the row-count choice makes the chunking visible.
    let (arch, ty, hd, cache) = MODELS[0];
    let path = tiny(arch, ty, hd);
    let whole = prefill(row, &path, cache, 512, true);
    let differ: Vec<usize> = [1, 7, 64]
        .into_iter()
        .filter(|&c| prefill(row, &path, cache, c, true) != whole)
        .collect();
    println!("control: tiers by row count, chunkings {differ:?} differ from whole");
    assert!(
        differ.contains(&1) && differ.contains(&7),
        "control: the planted row-count choice left chunks of 1 and 7 unchanged ({differ:?})"
    );
}

/// Generation rows: sequence A's generated token alone (the fused decode graph, one row)
/// gives the same bits as row i of 2, 5 and 16 generation rows of other sequences (the
/// multi-row kernel, the decode attention over many queries, an unfused graph) and between
/// prompt rows of other sequences (a generation run inside a prompt forward, at a row
/// offset). Control: the row-count choice puts 16 generation rows on the GEMM and the
/// prefill attention, and A's row differs.
fn generation_rows_are_bitwise_equal_alone_and_among_other_rows(row: &Row, _: &()) {
    let prompt = long_prompt(60);
    let a_prompt = &prompt[..20];
    // A's prefill, then its generated token among `others` generation rows (A at row
    // `others / 2`), or among prompt rows of two other sequences (`others == 0`).
    let run = |path: &Path, cache: GgmlType, others: usize, among_prompts: bool, by_rows: bool| {
        let mut e = engine(row, path, cache, 512, by_rows);
        let a = e.seq_create();
        e.forward_batch(&[BatchEntry::prompt(a, a_prompt, 0, 0)])
            .unwrap();
        let seqs: Vec<_> = (0..others)
            .map(|i| {
                let s = e.seq_create();
                let p = &prompt[20 + i..23 + i];
                e.forward_batch(&[BatchEntry::prompt(s, p, 0, 0)]).unwrap();
                s
            })
            .collect();
        let toks: Vec<[u32; 1]> = (0..others).map(|i| [(i as u32 * 5 + 1) % 40]).collect();
        let mut entries: Vec<BatchEntry> = seqs
            .iter()
            .zip(&toks)
            .map(|(&s, t)| BatchEntry::generated(s, t, 3))
            .collect();
        let at = others / 2;
        entries.insert(at, BatchEntry::generated(a, &[9], 20));
        let (b, c);
        if among_prompts {
            b = e.seq_create();
            c = e.seq_create();
            entries.insert(0, BatchEntry::prompt(b, &prompt[30..45], 0, 1));
            entries.push(BatchEntry::prompt(c, &prompt[45..52], 0, 1));
        }
        let at = if among_prompts { at + 1 } else { at };
        bits(e.forward_batch(&entries).unwrap().logits(at))
    };
    for (arch, ty, hd, cache) in MODELS {
        let path = tiny(arch, ty, hd);
        let alone = run(&path, cache, 0, false, false);
        for n in [2, 5, 16] {
            let got = run(&path, cache, n - 1, false, false);
            println!(
                "{arch:?} {ty} hd {hd}: among {n} generation rows == alone: {}",
                got == alone
            );
            assert!(got == alone, "{arch:?}: a generation row among {n}");
        }
        let got = run(&path, cache, 0, true, false);
        println!("{arch:?}: among prompt rows == alone: {}", got == alone);
        assert!(got == alone, "{arch:?}: a generation row among prompt rows");
    }
    let (arch, ty, hd, cache) = MODELS[0];
    let path = tiny(arch, ty, hd);
    let alone = run(&path, cache, 0, false, true);
    let among = run(&path, cache, 15, false, true);
    println!(
        "control: tiers by row count, among 16 == alone: {}",
        among == alone
    );
    assert!(
        among != alone,
        "control: the planted row-count choice left the row unchanged"
    );
}

/// The two classes really run different kernels: a prompt row's logits differ from the same
/// token computed as a generation row (the GEMM stages weights as f16; the mat-vec reads
/// them whole), each within its class against the other (`GEMM_REL`-class: 2e-3 of the RMS).
fn prompt_and_generation_rows_run_their_own_tiers(row: &Row, _: &()) {
    let (arch, ty, hd, cache) = MODELS[0];
    let path = tiny(arch, ty, hd);
    let p = long_prompt(30);
    let mut e = engine(row, &path, cache, 512, false);
    e.decode(&p[..29], 0, 1).unwrap();
    let as_prompt = e.decode(&p[29..], 29, 1).unwrap().to_vec();
    let as_gen = e.decode_generated(&p[29..], 29, 1).unwrap().to_vec();
    let d = as_prompt
        .iter()
        .zip(&as_gen)
        .fold(0f64, |m, (a, b)| m.max((a - b).abs() as f64));
    let rms =
        (as_gen.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / as_gen.len() as f64).sqrt();
    println!("prompt row vs generation row: max |d| {d:.3e} (rms {rms:.3})");
    assert!(
        d > 0.0,
        "a prompt row and a generation row gave the same bits"
    );
    assert!(
        d <= 2e-3 * rms,
        "the two classes differ by {d}, past 2e-3 of the RMS"
    );
}

for_each_backend! {
    prompt_rows_are_bitwise_equal_across_chunk_sizes_and_batch_company:
        prompt_rows_are_bitwise_equal_across_chunk_sizes_and_batch_company { metal_emu => () }
    generation_rows_are_bitwise_equal_alone_and_among_other_rows:
        generation_rows_are_bitwise_equal_alone_and_among_other_rows { metal_emu => () }
    prompt_and_generation_rows_run_their_own_tiers:
        prompt_and_generation_rows_run_their_own_tiers { metal_emu => () }
}
