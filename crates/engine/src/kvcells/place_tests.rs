//! Block placement (`place`): sequences growing together keep few runs, a churn of
//! arrivals and departures needs no defrag, and every table property still holds; each
//! with first fit as the control that breaks the bound.

use super::sim::{Fault, Rng, Sim};
use super::{KvCells, Placement, SeqId};
use minfer_graph::KV_MAP_RUNS;

const BLOCKS: Placement = Placement::SERVER;

fn max_runs(t: &KvCells) -> usize {
    (t.seqs().iter())
        .map(|&s| t.runs(s).expect("known").len())
        .max()
        .unwrap_or(0)
}

/// `bench --parallel`'s run: N prompts of P packed into reservations of `n_batch` cells
/// (one per forward), then T decode steps of a cell per sequence, on an arena of exactly
/// N (P + T) cells. The most runs any sequence held.
fn batched(placement: Placement, n: usize, p: usize, t: usize, n_batch: usize) -> usize {
    let mut c = KvCells::with_placement(n * (p + t), placement);
    let seqs: Vec<SeqId> = (0..n).map(|_| c.create()).collect();
    let mut reqs = Vec::new();
    let mut fill = 0;
    for &s in &seqs {
        let mut at = 0;
        while at < p {
            let len = (p - at).min(n_batch - fill);
            reqs.push((s, at, len));
            (at, fill) = (at + len, fill + len);
            if fill == n_batch {
                c.reserve(&reqs).unwrap();
                (reqs, fill) = (Vec::new(), 0);
            }
        }
    }
    if !reqs.is_empty() {
        c.reserve(&reqs).unwrap();
    }
    let mut most = max_runs(&c);
    for i in 0..t {
        let step: Vec<_> = seqs.iter().map(|&s| (s, p + i, 1)).collect();
        c.reserve(&step).unwrap();
        c.check().unwrap();
        most = most.max(max_runs(&c));
    }
    assert_eq!(c.n_free(), 0);
    most
}

#[test]
fn batched_decode_keeps_few_runs_on_an_exact_arena() {
    for (n, p, t) in [
        (8, 32, 32),
        (8, 128, 32),
        (32, 128, 32),
        (64, 128, 32),
        (8, 128, 128),
    ] {
        // The arena has no spare cell, so the last blocks are squeezed, but a window stays
        // a kv map (no defrag).
        let most = batched(BLOCKS, n, p, t, 512);
        assert!(most <= 5, "n {n} p {p} t {t}: {most} runs");
        // Control: first fit interleaves the decode cells, a run per step.
        let ff = batched(Placement::FirstFit, n, p, t, 512);
        assert!(ff > KV_MAP_RUNS, "first fit n {n} p {p} t {t}: {ff} runs");
    }
    // A prompt as long as the arena's spare cells allow still ends in one run per sequence.
    assert_eq!(batched(BLOCKS, 8, 32, 32, 2048), 1);
}

/// A server's churn: sequences arrive with prompts (prefilled in chunks beside the decode
/// rows), generate, and leave, admitted while every live one can still finish with
/// `headroom` cells to spare; a forward whose window would need more runs than the map
/// holds defragments first, as the engine does. Returns (defrags, most runs seen).
fn churn(placement: Placement, seed: u64, steps: usize, headroom: usize) -> (usize, usize) {
    let n_cells = 8192;
    let mut rng = Rng::new(seed);
    let mut c = KvCells::with_placement(n_cells, placement);
    // Per live sequence: positions held, prompt length, total length it stops at.
    let mut live: Vec<(SeqId, usize, usize, usize)> = Vec::new();
    let (mut defrags, mut most) = (0, 0);
    for _ in 0..steps {
        // Admitted only if every live sequence can still reach its end.
        let owed: usize = live.iter().map(|l| l.3 - l.1).sum();
        let prompt = 1 + rng.below(500);
        let stop = prompt + 1 + rng.below(600);
        if live.len() < 32 && c.n_free() >= owed + stop + headroom && rng.chance(30) {
            live.push((c.create(), 0, prompt, stop));
        }
        let mut reqs = Vec::new();
        let mut budget = 512;
        for &(s, held, prompt, _) in &live {
            let n = if held < prompt {
                (prompt - held).min(budget.max(1))
            } else {
                1
            };
            budget = budget.saturating_sub(n);
            reqs.push((s, held, n));
        }
        if reqs.is_empty() {
            continue;
        }
        let free_before = c.n_free();
        c.reserve(&reqs).unwrap();
        if max_runs(&c) > KV_MAP_RUNS {
            defrags += 1;
            c.defrag();
        }
        assert_eq!(
            c.n_free() + reqs.iter().map(|r| r.2).sum::<usize>(),
            free_before
        );
        most = most.max(max_runs(&c));
        for (l, r) in live.iter_mut().zip(&reqs) {
            l.1 += r.2;
        }
        live.retain(|&(s, held, _, stop)| {
            let done = held >= stop;
            if done {
                c.release(s).unwrap();
            }
            !done
        });
    }
    c.check().unwrap();
    (defrags, most)
}

#[test]
fn a_servers_churn_needs_no_defrag_with_room_and_few_when_full() {
    for seed in 0..6 {
        // A quarter of the arena to spare: no defrag at all.
        let (defrags, most) = churn(BLOCKS, seed, 3000, 2048);
        assert_eq!(defrags, 0, "seed {seed}: {defrags} defrags ({most} runs)");
        assert!(most <= KV_MAP_RUNS, "seed {seed}: {most} runs");
        // Control: first fit defragments again and again.
        let (ff, _) = churn(Placement::FirstFit, seed, 3000, 2048);
        assert!(ff > 100, "first fit, seed {seed}: {ff} defrags");
        // Admitted to the last cell: a defrag now and then, a twentieth of first fit's.
        let (full, _) = churn(BLOCKS, seed, 3000, 0);
        let (ff, _) = churn(Placement::FirstFit, seed, 3000, 0);
        assert!(
            full * 20 <= ff,
            "seed {seed}: {full} defrags, first fit {ff}"
        );
    }
}

#[test]
fn shared_prefixes_grow_in_blocks() {
    for (placement, bound) in [(BLOCKS, 3), (Placement::FirstFit, usize::MAX)] {
        let mut c = KvCells::with_placement(1024, placement);
        let root = c.create();
        c.reserve(&[(root, 0, 64)]).unwrap();
        let kids: Vec<SeqId> = (0..4).map(|_| c.create()).collect();
        for &k in &kids {
            c.share_prefix(k, root, 64).unwrap();
        }
        for i in 0..40 {
            let step: Vec<_> = kids.iter().map(|&k| (k, 64 + i, 1)).collect();
            c.reserve(&step).unwrap();
        }
        c.check().unwrap();
        for &k in &kids {
            // The shared prompt stays in the root's cells (the first child grew in place).
            let first = c.runs(k).unwrap()[0];
            assert!(first.cell == 0 && first.len >= 64, "{first:?}");
        }
        let most = max_runs(&c);
        if bound == usize::MAX {
            assert!(most > KV_MAP_RUNS, "first fit: {most} runs");
        } else {
            assert!(most <= bound, "{most} runs");
        }
    }
}

#[test]
fn no_room_falls_back_to_first_fit_and_never_refuses_what_fits() {
    // 10 cells, every other one held: no stretch of 2 is free, yet 5 single cells are.
    let mut c = KvCells::with_placement(10, BLOCKS);
    let a = c.create();
    let b = c.create();
    c.reserve(&[(a, 0, 10)]).unwrap();
    for p in (0..10).step_by(2) {
        c.remove(a, p..p + 1).unwrap();
    }
    assert_eq!(c.reserve(&[(b, 0, 5)]).unwrap(), vec![vec![0, 2, 4, 6, 8]]);
    assert_eq!(c.n_free(), 0);
    c.check().unwrap();
}

#[test]
fn random_operations_match_the_shadow_with_blocks() {
    let mut done = 0;
    for seed in 0..2000 {
        for min in [1, 2, 4] {
            let sim = Sim::run_placed(seed, 60, Fault::None, Placement::Blocks { min })
                .unwrap_or_else(|e| panic!("blocks of {min}: {e}"));
            done += sim.tally.get("reserve").map_or(0, |t| t[0]);
        }
    }
    assert!(done > 10_000, "{done} reservations");
}

#[test]
fn controls_faults_are_detected_with_blocks() {
    let caught = (0..200)
        .filter(|&seed| Sim::run_placed(seed, 80, Fault::ReverseDefrag, BLOCKS).is_err())
        .count();
    assert!(caught > 100, "caught in {caught} of 200 runs");
}
