//! Defrag: layouts, cycles, shared cells, and the layout left after many random operations.

use super::sim::{Fault, Rng, Sim};
use super::{CellOp, KvCells, Run, SeqId};

fn run(cell: usize, len: usize, pos: usize) -> Run {
    Run { cell, len, pos }
}

#[test]
fn defrag_makes_each_sequence_one_run() {
    let mut sim = Sim::new(12, Fault::None);
    sim.set_strict();
    let mut rng = Rng::new(1);
    let (a, b, c) = (
        sim.do_create().unwrap(),
        sim.do_create().unwrap(),
        sim.do_create().unwrap(),
    );
    for p in 0..3 {
        sim.do_reserve(&[(a, p, 1), (b, p, 1), (c, p, 1)]).unwrap();
    }
    // A holds cells 0, 4, 7; B 1, 5, 6; C 2, 3, 8. B leaves holes.
    sim.do_release(b).unwrap();
    sim.do_defrag().unwrap();
    sim.verify(&mut rng).unwrap();
    assert_eq!(sim.cells.runs(a).unwrap(), [run(0, 3, 0)]);
    assert_eq!(sim.cells.runs(c).unwrap(), [run(3, 3, 0)]);
    // Already laid out: nothing to do.
    assert_eq!(sim.cells.defrag(), []);
}

#[test]
fn defrag_moves_a_cycle_through_a_scratch_cell() {
    let mut sim = Sim::new(4, Fault::None);
    sim.set_strict();
    let mut rng = Rng::new(2);
    let (a, b) = (sim.do_create().unwrap(), sim.do_create().unwrap());
    sim.do_reserve(&[(b, 0, 1)]).unwrap(); // cell 0
    sim.do_reserve(&[(a, 0, 2)]).unwrap(); // cells 1, 2
                                           // A, the larger, goes first: 1 -> 0, 2 -> 1 and B's 0 -> 2, a cycle; cell 3 is scratch.
    let before = sim.cells.clone();
    let ops = sim.cells.defrag();
    assert_eq!(
        ops,
        [(1, 3), (2, 1), (0, 2), (3, 0)].map(|(src, dst)| CellOp::Copy { src, dst, n: 1 })
    );
    sim.cells = before;
    sim.do_defrag().unwrap();
    sim.verify(&mut rng).unwrap();
    assert_eq!(sim.cells.runs(a).unwrap(), [run(0, 2, 0)]);
    assert_eq!(sim.cells.runs(b).unwrap(), [run(2, 1, 0)]);
    // A full table is left alone.
    sim.do_reserve(&[(a, 2, 1)]).unwrap();
    assert_eq!(sim.cells.defrag(), []);
}

#[test]
fn defrag_keeps_shared_cells_shared() {
    let mut sim = Sim::new(16, Fault::None);
    sim.set_strict();
    let mut rng = Rng::new(3);
    let ids: Vec<SeqId> = (0..4).map(|_| sim.do_create().unwrap()).collect();
    let (base, noise) = (ids[0], ids[3]);
    sim.do_reserve(&[(base, 0, 2), (noise, 0, 1)]).unwrap();
    sim.do_reserve(&[(noise, 1, 1)]).unwrap();
    sim.do_reserve(&[(base, 2, 2)]).unwrap(); // base: cells 0, 1, 4, 5
    sim.do_share_prefix(ids[1], base, 4).unwrap();
    sim.do_share_prefix(ids[2], base, 4).unwrap();
    sim.do_reserve(&[(ids[2], 4, 2), (ids[1], 4, 3)]).unwrap();
    sim.do_release(noise).unwrap();
    sim.do_defrag().unwrap();
    sim.verify(&mut rng).unwrap();
    // ids[1] (the larger choice) lays out the prompt and its own cells in one run.
    assert_eq!(sim.cells.runs(ids[1]).unwrap(), [run(0, 7, 0)]);
    assert_eq!(
        sim.cells.runs(ids[2]).unwrap(),
        [run(0, 4, 0), run(7, 2, 4)]
    );
    assert_eq!(sim.cells.runs(base).unwrap(), [run(0, 4, 0)]);
    assert_eq!(&sim.cells.owners[..10], [3, 3, 3, 3, 1, 1, 1, 1, 1, 0]);
}

/// Cell-contiguity breaks of a sequence: runs that do not start at the cell after the
/// previous run's last (a position gap alone does not count).
fn breaks(runs: &[Run]) -> usize {
    runs.windows(2)
        .filter(|w| w[1].cell != w[0].cell + w[0].len)
        .count()
}

fn unshared(t: &KvCells, seq: SeqId) -> bool {
    t.runs(seq)
        .unwrap()
        .iter()
        .flat_map(Run::cells)
        .all(|c| t.owners[c] == 1)
}

/// After many random operations, defrag leaves each unshared sequence in one piece of
/// cells; n choices sharing one prompt, fragmented by noise, end with 2 runs at most each
/// (one of them merges prompt and own cells), `2n - 1` runs in all.
#[test]
fn defrag_after_random_operations() {
    let mut checked = 0;
    for seed in 0..300 {
        let mut sim = Sim::run(seed, 150, Fault::None).unwrap_or_else(|e| panic!("{e}"));
        let mut rng = Rng::new(seed ^ 0xdef);
        sim.do_defrag().unwrap();
        sim.verify(&mut rng).unwrap();
        if sim.cells.n_free() == 0 {
            continue;
        }
        for seq in sim.cells.seqs() {
            if unshared(&sim.cells, seq) {
                assert_eq!(
                    breaks(sim.cells.runs(seq).unwrap()),
                    0,
                    "seed {seed}: {seq}"
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 300, "only {checked} unshared sequences seen");

    for seed in 0..100 {
        let mut rng = Rng::new(seed);
        let mut sim = Sim::new(256, Fault::None);
        for _ in 0..300 {
            sim.step(&mut rng).unwrap();
        }
        // Room for the scenario: release noise until 80 cells are free.
        while sim.cells.n_free() < 80 {
            let seqs = sim.cells.seqs();
            sim.do_release(seqs[rng.below(seqs.len())]).unwrap();
        }
        // Noise that can still grow interleaves with the prompt; from here on every call
        // must succeed.
        let noise: Vec<SeqId> = (sim.cells.seqs().into_iter())
            .filter(|&s| sim.cells.next_pos(s).unwrap() < 1 << 20)
            .collect();
        sim.set_strict();
        let base = sim.do_create().unwrap();
        let prompt = 4 + rng.below(12);
        for p in 0..prompt {
            let mut reqs = vec![(base, p, 1)];
            if let Some(&s) = noise.get(rng.below(noise.len() + 1)) {
                reqs.push((s, sim.cells.next_pos(s).unwrap(), 1));
            }
            sim.do_reserve(&reqs).unwrap();
        }
        let n = 2 + rng.below(4);
        let choices: Vec<SeqId> = (0..n).map(|_| sim.do_create().unwrap()).collect();
        for &c in &choices {
            sim.do_share_prefix(c, base, prompt).unwrap();
        }
        let rounds = 1 + rng.below(6);
        for k in 0..rounds {
            let reqs: Vec<_> = choices.iter().map(|&c| (c, prompt + k, 1)).collect();
            sim.do_reserve(&reqs).unwrap();
        }
        if rng.chance(50) {
            sim.do_release(base).unwrap();
        }
        if !noise.is_empty() && rng.chance(70) {
            sim.do_release(noise[rng.below(noise.len())]).unwrap();
        }
        sim.do_defrag().unwrap();
        sim.verify(&mut rng).unwrap();
        for &c in &choices {
            assert_eq!(sim.cells.n_positions(c), Ok(prompt + rounds));
        }
        let runs: Vec<usize> = choices
            .iter()
            .map(|&c| sim.cells.runs(c).unwrap().len())
            .collect();
        assert!(runs.iter().all(|&r| r <= 2), "seed {seed}: {runs:?}");
        assert_eq!(
            runs.iter().sum::<usize>(),
            2 * n - 1,
            "seed {seed}: {runs:?}"
        );
        if sim.cells.contains(base) {
            assert_eq!(sim.cells.runs(base).unwrap().len(), 1, "seed {seed}");
        }
        for seq in sim.cells.seqs() {
            if unshared(&sim.cells, seq) {
                assert_eq!(
                    breaks(sim.cells.runs(seq).unwrap()),
                    0,
                    "seed {seed}: {seq}"
                );
            }
        }
    }
}
