//! Property tests over random operation sequences (see `sim`) and the controls proving they
//! can fail.

use super::sim::{Fault, Rng, Sim};
use super::CellOp;
use std::collections::BTreeMap;

/// Thousands of random operation sequences, every one checked after each step.
#[test]
fn random_operations_match_the_shadow() {
    let mut tally: BTreeMap<&str, [usize; 2]> = BTreeMap::new();
    let (mut cow_shifts, mut moving_defrags, mut cycle_defrags) = (0, 0, 0);
    for seed in 0..5000 {
        let sim = Sim::run(seed, 100, Fault::None).unwrap_or_else(|e| panic!("{e}"));
        for (op, [ok, err]) in sim.tally {
            let t = tally.entry(op).or_default();
            t[0] += ok;
            t[1] += err;
        }
        cow_shifts += sim.cow_shifts;
        moving_defrags += sim.moving_defrags;
        cycle_defrags += sim.cycle_defrags;
    }
    // Coverage: every operation both succeeded and was refused (defrag never refuses), and
    // the interesting paths ran often.
    let ops = [
        "create_with_id",
        "reserve",
        "remove",
        "truncate",
        "shift",
        "copy_prefix",
        "share_prefix",
        "clear",
        "release",
    ];
    for op in ops {
        let [ok, err] = tally[op];
        assert!(ok > 100 && err > 20, "{op}: {ok} done, {err} refused");
    }
    eprintln!(
        "{tally:?}: {cow_shifts} copy-on-write shifts, {moving_defrags} moving defrags, \
         {cycle_defrags} with cycles"
    );
    assert!(tally["defrag"][0] > 1000, "{tally:?}");
    assert!(cow_shifts > 500, "{cow_shifts} copy-on-write shifts");
    assert!(moving_defrags > 500, "{moving_defrags} defrags moved cells");
    assert!(cycle_defrags > 100, "{cycle_defrags} defrags moved a cycle");
}

/// The harness catches each injected execution fault: dropping the copy-on-write copies
/// (or the re-ropes) of shifts, and running defrag's moves in the wrong order.
#[test]
fn controls_faults_are_detected() {
    for fault in [
        Fault::DropShiftCopies,
        Fault::DropShifts,
        Fault::ReverseDefrag,
    ] {
        let mut caught = 0;
        for seed in 0..200 {
            if let Err(e) = Sim::run(seed, 80, fault) {
                // The table itself is right: the arena comparison is what fails.
                assert!(e.contains("the arena has"), "{fault:?}: {e}");
                caught += 1;
            }
        }
        eprintln!("{fault:?}: caught in {caught} of 200 runs");
        assert!(
            caught > 100,
            "{fault:?} caught in only {caught} of 200 runs"
        );
    }
}

/// A shift of one sharer, its copies dropped or its re-rope done on the shared cells
/// instead of on the copies: the comparison sees the wrong rows, at the shifted sequence
/// or at the other sharer.
#[test]
fn controls_broken_copy_on_write_is_detected() {
    let setup = || {
        let mut sim = Sim::new(8, Fault::None);
        sim.set_strict();
        let (a, b) = (sim.do_create().unwrap(), sim.do_create().unwrap());
        sim.do_reserve(&[(a, 0, 4)]).unwrap();
        sim.do_share_prefix(b, a, 4).unwrap();
        sim.do_reserve(&[(b, 4, 1)]).unwrap();
        (sim, b)
    };
    let mut rng = Rng::new(7);
    let (mut sim, b) = setup();
    sim.do_shift(b, 1..5, 3).unwrap();
    sim.verify(&mut rng).unwrap();

    let (mut sim, b) = setup();
    sim.set_fault(Fault::DropShiftCopies);
    sim.do_shift(b, 1..5, 3).unwrap();
    let e = sim.verify(&mut rng).unwrap_err();
    assert!(e.starts_with("1 position 4: the arena has None"), "{e}");

    // Re-roping the shared cells in place: the shift's ops, with each Shift sent to the
    // cells the Copy ops read.
    let (mut sim, b) = setup();
    let before = sim.cells.clone();
    let ops = sim.cells.shift(b, 1..5, 3).unwrap();
    assert_eq!(
        ops[0],
        CellOp::Copy {
            src: 1,
            dst: 5,
            n: 3
        }
    );
    sim.cells = before;
    sim.set_fault(Fault::DropShiftCopies);
    sim.do_shift(b, 1..5, 3).unwrap();
    sim.exec_ops(&[CellOp::Shift {
        cell: 1,
        n: 3,
        delta: 3,
    }]);
    let e = sim.verify(&mut rng).unwrap_err();
    assert!(e.starts_with("0 position 1: the arena has"), "{e}");
}
