//! KV cell operations: moves are lossless, removal-with-shift equals a fresh prefill of the
//! remaining text, q8_0 refuses to shift and is left unchanged.

use minfer_engine::kv::KvError;
use minfer_engine::Error;
use minfer_gguf::GgmlType;
use minfer_models::Arch;
use minfer_testkit::synth::*;

/// Where a sequence's cells lie never changes its results: a sequence scattered over
/// several runs of cells (other sequences took the cells between) and the same sequence after
/// `defrag` give the next logits of a plain engine, bit for bit. The sides really ran on
/// different cells: the runs differ and defrag reports moves (asserted).
#[test]
fn cell_placement_and_defrag_leave_the_next_logits_bit_identical() {
    let path = model_heads(Arch::Qwen2, 2, 1, 2, 1);
    for ty in [GgmlType::F32, GgmlType::F16, GgmlType::Q8_0] {
        let mut plain = engine(&path, 96, ty);
        let vocab = plain.hparams().vocab_size;
        let (p1, p2) = (tokens(10, 3, vocab), tokens(12, 4, vocab));
        let (probe1, probe2) = (tokens(1, 9, vocab), tokens(1, 10, vocab));
        plain.decode(&p1, 0, 1).unwrap();
        plain.decode(&p2, 10, 1).unwrap();
        let want1 = plain.decode(&probe1, 22, 1).unwrap().to_vec();
        let want2 = plain.decode(&probe2, 23, 1).unwrap().to_vec();

        let mut e = engine(&path, 96, ty);
        // First fit scatters the sequence as below (blocks would keep it one run).
        e.set_kv_placement(minfer_engine::KvPlacement::FirstFit);
        let (x, y) = (e.seq_create(), e.seq_create());
        let filler = tokens(7, 5, vocab);
        e.forward_batch(&[minfer_engine::BatchEntry::new(x, &filler, 0)])
            .unwrap();
        e.decode(&p1, 0, 1).unwrap();
        e.forward_batch(&[minfer_engine::BatchEntry::new(y, &filler[..5], 0)])
            .unwrap();
        e.seq_release(x).unwrap();
        e.decode(&p2, 10, 1).unwrap();
        let seq = e.default_seq();
        let scattered = e.cells().runs(seq).unwrap().to_vec();
        assert!(scattered.len() > 1, "{ty}: {scattered:?}");
        let got1 = e.decode(&probe1, 22, 1).unwrap().to_vec();
        assert!(
            bits_eq(&got1, &want1),
            "{ty}: scattered cells changed the logits"
        );
        let moves = e.defrag().unwrap();
        e.cells().check().unwrap();
        assert!(!moves.is_empty(), "{ty}: defrag moved nothing");
        assert_ne!(e.cells().runs(seq).unwrap(), &scattered[..]);
        let got2 = e.decode(&probe2, 23, 1).unwrap().to_vec();
        assert!(bits_eq(&got2, &want2), "{ty}: defrag changed the logits");
        // Control: a different position gives different logits (the probe is sensitive).
        assert!(!bits_eq(&want1, &want2));
    }
}

fn bits_eq(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Removing positions and shifting the rest equals a fresh prefill of the remaining tokens.
///
/// On a one-layer model a cell's K and V depend only on its token and position, so the only
/// difference is the rotation: `R(δ)·R(p)` instead of `R(p + δ)`, i.e. f32 rounding of the
/// composed angle (~1e-6 relative per element), and for F16 one more rounding to half
/// (2^-11 relative). Tolerances on the next logits, relative to their largest magnitude:
/// F32 1e-6, F16 4e-3; measured (2026-12-01) 1.3e-7 and 4.6e-4, so 7.8x and 8.7x (they were
/// 1e-4 and 1e-2: 780x and 22x). Control: removing without the shift (the later cells keep their
/// positions, and the probe comes after them) misses both by far (asserted below).
#[test]
fn remove_and_shift_equals_a_fresh_prefill_of_the_rest() {
    let path = model(Arch::Qwen2, 1, 2);
    for (ty, tol) in [(GgmlType::F32, 1e-6f32), (GgmlType::F16, 4e-3)] {
        let mut fresh = engine(&path, 64, ty);
        let vocab = fresh.hparams().vocab_size;
        let (a, b, c) = (
            tokens(10, 1, vocab),
            tokens(8, 2, vocab),
            tokens(6, 3, vocab),
        );
        let probe = tokens(1, 4, vocab);
        let kept: Vec<u32> = a.iter().chain(&c).copied().collect();
        fresh.decode(&kept, 0, 1).unwrap();
        let want = fresh.decode(&probe, kept.len(), 1).unwrap().to_vec();
        let scale = max_abs(&want);

        let all: Vec<u32> = a.iter().chain(&b).chain(&c).copied().collect();
        let mut e = engine(&path, 64, ty);
        e.decode(&all, 0, 1).unwrap();
        e.kv_remove(10, 18).unwrap();
        assert_eq!(e.n_past(), kept.len());
        let got = e.decode(&probe, kept.len(), 1).unwrap().to_vec();
        let diff = max_abs_diff(&got, &want);
        eprintln!("{ty}: max |Δlogit| {diff:e} (scale {scale})");
        assert!(diff <= tol * scale, "{ty}: {diff} > {tol} * {scale}");

        let mut e = engine(&path, 64, ty);
        e.decode(&all, 0, 1).unwrap();
        let seq = e.default_seq();
        e.seq_remove(seq, 10..18).unwrap();
        let control = e.decode(&probe, all.len(), 1).unwrap().to_vec();
        eprintln!(
            "{ty}: control {:e} (must exceed {:e})",
            max_abs_diff(&control, &want),
            10.0 * tol * scale
        );
        assert!(
            max_abs_diff(&control, &want) > 10.0 * tol * scale,
            "{ty}: control without re-RoPE should miss"
        );
    }
}

/// Retaining several ranges at once (a defragmentation) equals removing them one by one.
#[test]
fn retain_of_several_ranges_equals_successive_removals() {
    let path = model(Arch::Llama, 2, 5);
    let mut one = engine(&path, 64, GgmlType::F32);
    let vocab = one.hparams().vocab_size;
    let all = tokens(30, 8, vocab);
    let probe = tokens(1, 6, vocab);
    one.decode(&all, 0, 1).unwrap();
    one.kv_retain(&[2..5, 9..20, 25..30]).unwrap();
    let got = one.decode(&probe, 19, 1).unwrap().to_vec();

    let mut two = engine(&path, 64, GgmlType::F32);
    two.decode(&all, 0, 1).unwrap();
    two.kv_remove(20, 25).unwrap();
    two.kv_remove(5, 9).unwrap();
    two.kv_remove(0, 2).unwrap();
    assert_eq!(two.n_past(), 19);
    let want = two.decode(&probe, 19, 1).unwrap().to_vec();
    // Same rotations composed in a different order: f32 rounding only; measured 1.5e-7 of
    // the largest logit (2026-12-01), bar 1e-6 (6.6x; it was 1e-4).
    let d = max_abs_diff(&got, &want) / max_abs(&want);
    eprintln!("retain vs removals: {d:e} of the largest logit");
    assert!(d <= 1e-6);
}

#[test]
fn q8_0_refuses_to_shift_and_is_left_unchanged() {
    let path = model_heads(Arch::Qwen2, 1, 3, 2, 1);
    let mut e = engine(&path, 64, GgmlType::Q8_0);
    let vocab = e.hparams().vocab_size;
    let all = tokens(20, 1, vocab);
    let probe = tokens(1, 2, vocab);
    e.decode(&all, 0, 1).unwrap();
    let err = e.kv_remove(5, 10).unwrap_err();
    assert!(
        matches!(err, Error::Kv(KvError::CannotShift { ty: GgmlType::Q8_0 })),
        "{err}"
    );
    assert!(err.to_string().to_lowercase().contains("q8_0"), "{err}");
    assert_eq!(e.n_past(), 20);
    let got = e.decode(&probe, 20, 1).unwrap().to_vec();
    let mut f = engine(&path, 64, GgmlType::Q8_0);
    f.decode(&all, 0, 1).unwrap();
    let want = f.decode(&probe, 20, 1).unwrap().to_vec();
    assert_eq!(got, want);
    // Removing a tail needs no shift, so q8_0 can do it.
    e.kv_remove(15, 21).unwrap();
    assert_eq!(e.n_past(), 15);
}

#[test]
fn bad_ranges_are_refused_by_name() {
    let path = model(Arch::Qwen2, 1, 4);
    let mut e = engine(&path, 32, GgmlType::F32);
    e.decode(&[1, 2, 3, 4], 0, 1).unwrap();
    let err = e.kv_remove(2, 9).unwrap_err();
    assert!(
        err.to_string().contains("not within the 4 positions"),
        "{err}"
    );
    let err = e.kv_retain(&[2..4, 1..2]).unwrap_err();
    assert!(err.to_string().contains("ascending"), "{err}");
    let seq = e.default_seq();
    let err = e.seq_shift(seq, 1..3, -2).unwrap_err();
    assert!(matches!(err, Error::Cells(_)), "{err}");
    assert_eq!(e.n_past(), 4);
}

/// A sequence whose cells lie in more runs than a kv map holds is defragmented before the
/// forward (never truncated): the forward succeeds, the sequence ends up in fewer runs, and
/// its logits are those of the same tokens in a plain engine.
#[test]
fn a_sequence_in_too_many_runs_is_defragmented_first() {
    let path = model_heads(Arch::Qwen2, 2, 7, 2, 1);
    for ty in [GgmlType::F32, GgmlType::F16, GgmlType::Q8_0] {
        let mut e = engine(&path, 128, ty);
        // First fit lays the runs out as below (blocks would keep the sequence one run).
        e.set_kv_placement(minfer_engine::KvPlacement::FirstFit);
        let vocab = e.hparams().vocab_size;
        let a = e.default_seq();
        let mut fed = Vec::new();
        let mut others = Vec::new();
        // KV_MAP_RUNS runs of the sequence, each followed by another sequence's cells.
        let runs = minfer_engine::KV_MAP_RUNS;
        for i in 0..runs as u32 {
            let t = tokens(3, 10 + i, vocab);
            e.decode(&t, fed.len(), 1).unwrap();
            fed.extend_from_slice(&t);
            let x = e.seq_create();
            let filler = tokens(2, 50 + i, vocab);
            e.forward_batch(&[minfer_engine::BatchEntry::new(x, &filler, 0)])
                .unwrap();
            others.push(x);
        }
        // The two-cell holes all but the last leave take the next tokens: more runs than a
        // map holds.
        for &x in &others[..runs - 1] {
            e.seq_release(x).unwrap();
        }
        assert_eq!(e.cells().runs(a).unwrap().len(), runs, "{ty}");
        let n_probe = 2 * (runs - 1) - 1;
        let probe = tokens(n_probe, 99, vocab);
        let moves_free = e.cells().n_free();
        let got = e.decode(&probe, fed.len(), 1).unwrap().to_vec();
        assert_eq!(e.cells().n_free(), moves_free - n_probe);
        e.cells().check().unwrap();
        let runs_after = e.cells().runs(a).unwrap().len();
        assert!(
            runs_after <= 2,
            "{ty}: still {runs_after} runs after the forward"
        );
        let mut plain = engine(&path, 128, ty);
        plain.decode(&fed, 0, 1).unwrap();
        let want = plain.decode(&probe, fed.len(), 1).unwrap().to_vec();
        assert!(
            bits_eq(&got, &want),
            "{ty}: defragmented forward changed the logits"
        );
    }
}

/// Batched decode of several sequences gives the same bits whatever the placement: first fit
/// (the sequences' cells interleave: kv maps, then defrags) and blocks (few runs, no
/// defrag). The two really differ (asserted: runs and defrags).
#[test]
fn batched_decode_is_bit_identical_under_first_fit_and_blocks() {
    use minfer_engine::{BatchEntry, KvPlacement};
    let path = model_heads(Arch::Qwen2, 2, 1, 2, 1);
    for ty in [GgmlType::F32, GgmlType::F16, GgmlType::Q8_0] {
        let run = |placement: KvPlacement| {
            let mut e = engine(&path, 128, ty);
            e.set_kv_placement(placement);
            let vocab = e.hparams().vocab_size;
            let seqs: Vec<_> = (0..4).map(|_| e.seq_create()).collect();
            let prompts: Vec<Vec<u32>> = (0..4).map(|j| tokens(6, 20 + j, vocab)).collect();
            let entries: Vec<_> = (seqs.iter().zip(&prompts))
                .map(|(&s, p)| BatchEntry::new(s, p, 0))
                .collect();
            let mut logits = vec![e.forward_batch(&entries).unwrap().clone()];
            let mut most_runs = 0;
            for i in 0..16 {
                let step: Vec<Vec<u32>> =
                    (0..4).map(|j| tokens(1, 40 + i * 4 + j, vocab)).collect();
                let entries: Vec<_> = (seqs.iter().zip(&step))
                    .map(|(&s, t)| BatchEntry::generated(s, t, 6 + i as usize))
                    .collect();
                logits.push(e.forward_batch(&entries).unwrap().clone());
                for &s in &seqs {
                    most_runs = most_runs.max(e.cells().runs(s).unwrap().len());
                }
            }
            (logits, most_runs, e.defrags())
        };
        let (ff, ff_runs, ff_defrags) = run(KvPlacement::FirstFit);
        let (bl, bl_runs, bl_defrags) = run(KvPlacement::SERVER);
        assert!(
            ff_runs > 1 && ff_defrags > 0,
            "{ty}: first fit {ff_runs} runs, {ff_defrags} defrags"
        );
        assert_eq!((bl_runs, bl_defrags), (1, 0), "{ty}: blocks");
        for (k, (a, b)) in ff.iter().zip(&bl).enumerate() {
            for r in 0..4 {
                assert!(
                    bits_eq(a.logits(r), b.logits(r)),
                    "{ty}: forward {k}, sequence {r}"
                );
            }
        }
    }
}
