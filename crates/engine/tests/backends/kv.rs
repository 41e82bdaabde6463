//! KV cell operations on every backend: nodes of the sequence's cell-op graph (`KvCopy` as
//! an overlap-safe row copy, `KvRopeShift` as a kernel on the region's backend), run by the
//! scheduler like a forward, and host reads and writes (sessions) ordered after pending
//! work.
//!
//! Classes, named before measuring: a defragmentation only moves cells, and attention reads
//! a window in logical order, so the next logits are bit-identical to an engine that never
//! moved (each row's tiers follow its row class, ADR 0011); a session
//! round trip copies bytes (bit-identical); a shift re-ropes K in f32 (f32 KV: 1e-4 of the
//! logits' largest value, f16 KV 1e-2, as on the CPU).

use super::*;
use minfer_engine::BatchEntry;
use minfer_models::Arch;
use minfer_testkit::logits::bits;
use minfer_testkit::synth::{self, max_abs, max_abs_diff, tmp, tokens, Tiny};

/// A model whose KV rows are 128 elements (q8_0 rows of whole words, as the kernels need).
fn model(arch: Arch) -> std::path::PathBuf {
    model_layers(arch, 2)
}

fn model_layers(arch: Arch, layers: usize) -> std::path::PathBuf {
    let mut t = Tiny::new(arch, GgmlType::F32);
    t.layers = layers;
    t.d = 256;
    t.ff = 512;
    t.head_dim = 64;
    t.n_head = 4;
    t.n_head_kv = 2;
    synth::write(&t)
}

/// The row's engine (128-token context).
fn engine(row: &Row, path: &Path, cache: GgmlType) -> Engine {
    Engine::load(
        path,
        EngineConfig {
            n_ctx: 128,
            threads: row.threads,
            cache_type: cache,
            backends: vec![row.backend()],
            ..EngineConfig::default()
        },
    )
    .unwrap()
}

fn a_defragmented_sequence_continues_bit_identically(row: &Row, _: &()) {
    let path = model(Arch::Qwen2);
    for ty in [GgmlType::F32, GgmlType::F16, GgmlType::Q8_0] {
        let runs = minfer_engine::KV_MAP_RUNS;
        let mut e = engine(row, &path, ty);
        // First fit lays the runs out as below (blocks would keep the sequence one run).
        e.set_kv_placement(minfer_engine::KvPlacement::FirstFit);
        let mut plain = engine(row, &path, ty);
        let vocab = e.hparams().vocab_size;
        let a = e.default_seq();
        let mut fed = 0;
        let mut others = Vec::new();
        // KV_MAP_RUNS runs of the sequence, each followed by another sequence's cells.
        for i in 0..runs as u32 {
            let t = tokens(3, 10 + i, vocab);
            e.decode(&t, fed, 1).unwrap();
            plain.decode(&t, fed, 1).unwrap();
            fed += t.len();
            let x = e.seq_create();
            e.forward_batch(&[BatchEntry::new(x, &tokens(2, 50 + i, vocab), 0)])
                .unwrap();
            others.push(x);
        }
        for &x in &others[..runs - 1] {
            e.seq_release(x).unwrap();
        }
        assert_eq!(e.cells().runs(a).unwrap().len(), runs, "{ty}");
        // More runs than a map holds: the forward defragments first (cells move on the device).
        let probe = tokens(2 * (runs - 1) - 1, 99, vocab);
        let before = e.defrags();
        let got = e.decode(&probe, fed, 1).unwrap().to_vec();
        assert!(e.defrags() > before, "{ty}: the forward defragmented");
        assert!(e.cells().runs(a).unwrap().len() <= 2, "{ty}");
        let want = plain.decode(&probe, fed, 1).unwrap().to_vec();
        assert_eq!(
            bits(&got),
            bits(&want),
            "{ty}: the moved cells changed the logits"
        );
    }
}

fn remove_and_shift_on_the_device_equals_a_fresh_prefill_of_the_rest(row: &Row, _: &()) {
    // One layer: its K/V depend only on each token and its position, so after the removal
    // and re-rope the cells hold what a fresh prefill of the rest computes (deeper layers'
    // K/V would still carry the removed tokens through attention).
    let path = model_layers(Arch::Llama, 1);
    // Bars relative to the largest logit, measured (2026-12-01) 1.8e-7 (F32) and 3.8e-5
    // (F16, the shifted values rounded to half again): 1e-6 and 4e-4, 5.5x and 10.5x (they
    // were 1e-4 and 1e-2, 550x and 260x).
    for (ty, tol) in [(GgmlType::F32, 1e-6f32), (GgmlType::F16, 4e-4)] {
        let mut fresh = engine(row, &path, ty);
        let vocab = fresh.hparams().vocab_size;
        let (a, b, c) = (
            tokens(5, 1, vocab),
            tokens(4, 2, vocab),
            tokens(3, 3, vocab),
        );
        let probe = tokens(1, 4, vocab);
        let kept: Vec<u32> = a.iter().chain(&c).copied().collect();
        // The same forward shapes on both sides: a then c (or a, b, c) then the probe.
        fresh.decode(&a, 0, 1).unwrap();
        fresh.decode(&c, a.len(), 1).unwrap();
        let want = fresh.decode(&probe, kept.len(), 1).unwrap().to_vec();
        let scale = max_abs(&want);
        let run = |shift: bool| {
            let mut e = engine(row, &path, ty);
            e.decode(&a, 0, 1).unwrap();
            e.decode(&b, a.len(), 1).unwrap();
            e.decode(&c, a.len() + b.len(), 1).unwrap();
            if shift {
                e.kv_remove(a.len(), a.len() + b.len()).unwrap();
                assert_eq!(e.n_past(), kept.len());
                e.decode(&probe, kept.len(), 1).unwrap().to_vec()
            } else {
                // Control: the cells removed without the re-rope of the rest.
                let seq = e.default_seq();
                e.seq_remove(seq, a.len()..a.len() + b.len()).unwrap();
                e.decode(&probe, a.len() + b.len() + c.len(), 1)
                    .unwrap()
                    .to_vec()
            }
        };
        let d = max_abs_diff(&run(true), &want);
        println!("{ty}: shifted vs fresh max |dlogit| {d:.3e} (scale {scale:.3})");
        assert!(d <= tol * scale, "{ty}: {d} > {tol} x {scale}");
        let control = max_abs_diff(&run(false), &want);
        println!("{ty}: control {control:.3e} (bar {:.3e})", tol * scale);
        assert!(
            control > tol * scale,
            "{ty}: control {control} should fail the bar"
        );
    }
}

fn a_session_saved_from_the_device_continues_bit_identically(row: &Row, _: &()) {
    let path = model(Arch::Qwen3);
    for ty in [GgmlType::F32, GgmlType::F16, GgmlType::Q8_0] {
        let mut a = engine(row, &path, ty);
        let vocab = a.hparams().vocab_size;
        let toks = tokens(17, 1, vocab);
        a.decode(&toks, 0, 1).unwrap();
        let file = tmp("metal.session");
        a.save_session(&file, &toks, b"{}").unwrap();
        let probe = tokens(3, 2, vocab);
        let want = a.decode(&probe, 17, 3).unwrap().to_vec();
        let mut b = engine(row, &path, ty);
        b.load_session(&file).unwrap();
        assert_eq!(b.n_past(), 17);
        let got = b.decode(&probe, 17, 3).unwrap().to_vec();
        assert_eq!(bits(&got), bits(&want), "{ty}");
        // Control: an engine that did not load the session answers differently.
        let mut c = engine(row, &path, ty);
        let other = c.decode(&probe, 0, 3).unwrap().to_vec();
        assert_ne!(bits(&other), bits(&want), "{ty}");
    }
}

for_each_backend! {
    a_defragmented_sequence_continues_bit_identically:
        a_defragmented_sequence_continues_bit_identically { metal_emu => () }
    remove_and_shift_on_the_device_equals_a_fresh_prefill_of_the_rest:
        remove_and_shift_on_the_device_equals_a_fresh_prefill_of_the_rest { metal_emu => () }
    a_session_saved_from_the_device_continues_bit_identically:
        a_session_saved_from_the_device_continues_bit_identically { metal_emu => () }
}
