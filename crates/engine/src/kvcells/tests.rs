//! Unit tests of each operation and each refusal, and controls of the checker.

use super::{CellError, CellOp, KvCells, Run, SeqId, MAX_POS};
use std::fmt::Debug;
use std::ops::Range;

fn run(cell: usize, len: usize, pos: usize) -> Run {
    Run { cell, len, pos }
}

/// Runs a call that must be refused; the table must be unchanged. Returns the error.
fn refused<T: Debug>(
    t: &mut KvCells,
    f: impl FnOnce(&mut KvCells) -> Result<T, CellError>,
) -> CellError {
    let before = t.clone();
    let err = f(t).expect_err("the call should be refused");
    assert_eq!(*t, before, "refused ({err}) yet the table changed");
    t.check().unwrap();
    err
}

/// A table with sequences `A` (cells 0..3) and `B` (cells 3..5), and 3 free cells.
fn two() -> (KvCells, SeqId, SeqId) {
    let mut t = KvCells::new(8);
    let (a, b) = (t.create(), t.create());
    assert_eq!(
        t.reserve(&[(a, 0, 3), (b, 0, 2)]).unwrap(),
        vec![vec![0, 1, 2], vec![3, 4]]
    );
    t.check().unwrap();
    (t, a, b)
}

#[test]
fn ids_are_never_reused() {
    let mut t = KvCells::new(4);
    assert_eq!((t.n_cells(), t.n_free()), (4, 4));
    assert_eq!((t.create(), t.create()), (SeqId(0), SeqId(1)));
    t.create_with_id(SeqId(5)).unwrap();
    assert_eq!(t.create(), SeqId(6));
    let e = refused(&mut t, |t| t.create_with_id(SeqId(5)));
    assert_eq!(e, CellError::SeqExists { seq: SeqId(5) });
    t.release(SeqId(0)).unwrap();
    assert!(!t.contains(SeqId(0)) && t.contains(SeqId(1)));
    assert_eq!(t.create(), SeqId(7));
    // An explicit id may be one released before: the caller asks for it by name.
    t.create_with_id(SeqId(0)).unwrap();
    assert_eq!(t.seqs(), [0, 1, 5, 6, 7].map(SeqId));
    assert_eq!(e.to_string(), "sequence 5 already exists");
    t.check().unwrap();
}

#[test]
fn reserve_grows_in_place_then_first_fit() {
    let (mut t, a, b) = two();
    // The cell after A's run is B's: A's next cells are the lowest free ones.
    assert_eq!(t.reserve(&[(a, 3, 2)]).unwrap(), vec![vec![5, 6]]);
    assert_eq!(t.runs(a).unwrap(), [run(0, 3, 0), run(5, 2, 3)]);
    assert_eq!(
        (t.n_positions(a), t.next_pos(a), t.n_free()),
        (Ok(5), Ok(5), 1)
    );
    // B's last run is followed by A's cell 5: B too goes first-fit (7).
    assert_eq!(t.reserve(&[(b, 2, 1)]).unwrap(), vec![vec![7]]);
    assert_eq!(t.runs(b).unwrap(), [run(3, 2, 0), run(7, 1, 2)]);
    // A's last run ends at 7 (owned): an empty request is fine, a full table refuses.
    assert_eq!(t.reserve(&[(a, 5, 0)]).unwrap(), vec![Vec::<usize>::new()]);
    assert_eq!(t.n_free(), 0);
    t.check().unwrap();
}

#[test]
fn reserve_batch_extends_in_place_before_first_fit() {
    let mut t = KvCells::new(8);
    let (a, b, c) = (t.create(), t.create(), t.create());
    t.reserve(&[(a, 0, 2), (b, 0, 1)]).unwrap();
    t.release(b).unwrap(); // cell 2, right after A, is free again
                           // C comes first in the batch, yet A keeps cell 2: in-place growth goes before first-fit.
    assert_eq!(
        t.reserve(&[(c, 0, 2), (a, 2, 1)]).unwrap(),
        vec![vec![3, 4], vec![2]]
    );
    assert_eq!(t.runs(a).unwrap(), [run(0, 3, 0)]);
    assert_eq!(t.runs(c).unwrap(), [run(3, 2, 0)]);
    // Growing past the end of a run: in place as far as free, the rest lowest-first.
    let d = t.create();
    t.reserve(&[(d, 0, 1)]).unwrap(); // cell 5
    t.remove(a, 1..2).unwrap(); // frees cell 1
    assert_eq!(t.reserve(&[(c, 2, 3)]).unwrap(), vec![vec![1, 6, 7]]);
    assert_eq!(
        t.runs(c).unwrap(),
        [run(3, 2, 0), run(1, 1, 2), run(6, 2, 3)]
    );
    t.check().unwrap();
}

#[test]
fn reserve_refusals_leave_the_table_unchanged() {
    let (mut t, a, b) = two();
    let x = SeqId(99);
    let e = refused(&mut t, |t| t.reserve(&[(a, 3, 1), (x, 0, 1)]));
    assert_eq!(e, CellError::UnknownSeq { seq: x });
    let e = refused(&mut t, |t| t.reserve(&[(a, 3, 1), (b, 2, 1), (a, 4, 1)]));
    assert_eq!(e, CellError::DuplicateSeq { seq: a });
    let e = refused(&mut t, |t| t.reserve(&[(b, 2, 1), (a, 2, 1)]));
    assert_eq!(
        e,
        CellError::NotNextPos {
            seq: a,
            pos0: 2,
            next_pos: 3
        }
    );
    let e = refused(&mut t, |t| t.reserve(&[(a, 3, 2), (b, 2, 2)]));
    assert_eq!(
        e,
        CellError::NoSpace {
            op: "reserve",
            needed: 4,
            free: 3
        }
    );
    assert_eq!(e.to_string(), "reserve: 4 free cells needed, 3 free");
    // A sequence moved to the last position has no next one.
    t.shift(a, 0..3, (MAX_POS - 2) as i64).unwrap();
    let e = refused(&mut t, |t| t.reserve(&[(a, MAX_POS + 1, 1)]));
    let pos = MAX_POS as i128 + 1;
    assert_eq!(
        e,
        CellError::PositionOutOfRange {
            op: "reserve",
            seq: a,
            pos
        }
    );
}

#[test]
fn remove_leaves_a_gap_and_frees_cells() {
    let (mut t, a, b) = two();
    t.remove(a, 1..2).unwrap();
    assert_eq!(t.runs(a).unwrap(), [run(0, 1, 0), run(2, 1, 2)]);
    assert_eq!(
        (t.next_pos(a), t.n_positions(a), t.n_free()),
        (Ok(3), Ok(2), 4)
    );
    assert_eq!(t.window(a, 1), Err(CellError::NotHeld { seq: a, pos: 1 }));
    assert_eq!(t.window(a, 2).unwrap(), [(0, 1), (2, 1)]);
    // Positions not held are ignored; an empty range does nothing.
    t.remove(a, 1..2).unwrap();
    t.remove(b, 1..1).unwrap();
    t.remove(b, 1..usize::MAX).unwrap();
    assert_eq!(t.runs(b).unwrap(), [run(3, 1, 0)]);
    let e = refused(&mut t, |t| t.remove(a, Range { start: 2, end: 1 }));
    assert_eq!(
        e,
        CellError::BadRange {
            op: "remove",
            seq: a,
            start: 2,
            end: 1
        }
    );
    let e = refused(&mut t, |t| t.remove(SeqId(9), 0..1));
    assert_eq!(e, CellError::UnknownSeq { seq: SeqId(9) });
    t.check().unwrap();
}

#[test]
fn removing_a_shared_cell_keeps_it_for_the_other_owner() {
    let (mut t, a, b) = two();
    t.share_prefix(b, a, 3).unwrap();
    assert_eq!(t.n_free(), 5);
    t.remove(a, 0..2).unwrap();
    assert_eq!((t.runs(a).unwrap(), t.n_free()), (&[run(2, 1, 2)][..], 5));
    assert_eq!(t.runs(b).unwrap(), [run(0, 3, 0)]);
    t.truncate(b, 2).unwrap();
    assert_eq!((t.runs(b).unwrap(), t.n_free()), (&[run(0, 2, 0)][..], 5));
    t.truncate(b, 0).unwrap();
    assert_eq!((t.next_pos(b), t.n_free()), (Ok(0), 7));
    let e = refused(&mut t, |t| t.truncate(SeqId(9), 0));
    assert_eq!(e, CellError::UnknownSeq { seq: SeqId(9) });
    t.check().unwrap();
}

#[test]
fn shift_private_cells_in_place() {
    let mut t = KvCells::new(8);
    let a = t.create();
    t.reserve(&[(a, 0, 6)]).unwrap();
    t.remove(a, 2..4).unwrap();
    // Closing the gap: positions 4, 5 become 2, 3, their cells stay.
    let ops = t.shift(a, 4..usize::MAX, -2).unwrap();
    assert_eq!(
        ops,
        [CellOp::Shift {
            cell: 4,
            n: 2,
            delta: -2
        }]
    );
    assert_eq!(t.runs(a).unwrap(), [run(0, 2, 0), run(4, 2, 2)]);
    assert_eq!(t.next_pos(a), Ok(4));
    // Opening a gap again, and merging back when cells and positions meet.
    t.shift(a, 1..4, 3).unwrap();
    assert_eq!(
        t.runs(a).unwrap(),
        [run(0, 1, 0), run(1, 1, 4), run(4, 2, 5)]
    );
    t.shift(a, 4..5, -3).unwrap();
    assert_eq!(t.runs(a).unwrap(), [run(0, 2, 0), run(4, 2, 5)]);
    // Nothing to move: no op.
    assert_eq!(t.shift(a, 2..5, 7).unwrap(), []);
    assert_eq!(t.shift(a, 0..9, 0).unwrap(), []);
    t.check().unwrap();
}

#[test]
fn shift_refusals() {
    let mut t = KvCells::new(8);
    let a = t.create();
    t.reserve(&[(a, 0, 6)]).unwrap();
    t.remove(a, 2..4).unwrap(); // holds 0, 1, 4, 5
    let e = refused(&mut t, |t| t.shift(a, 4..6, -3));
    assert_eq!(
        e,
        CellError::ShiftCollision {
            seq: a,
            start: 4,
            end: 6,
            delta: -3,
            other: 1
        }
    );
    // Passing over a neighbour is a reordering, refused as well.
    let e = refused(&mut t, |t| t.shift(a, 0..2, 5));
    assert_eq!(
        e,
        CellError::ShiftCollision {
            seq: a,
            start: 0,
            end: 2,
            delta: 5,
            other: 4
        }
    );
    let e = refused(&mut t, |t| t.shift(a, 1..9, -2));
    assert_eq!(
        e,
        CellError::PositionOutOfRange {
            op: "shift",
            seq: a,
            pos: -1
        }
    );
    let e = refused(&mut t, |t| t.shift(a, 4..9, i64::MAX));
    let pos = 4 + i64::MAX as i128;
    assert_eq!(
        e,
        CellError::PositionOutOfRange {
            op: "shift",
            seq: a,
            pos
        }
    );
    let e = refused(&mut t, |t| t.shift(a, Range { start: 3, end: 2 }, 1));
    assert_eq!(
        e,
        CellError::BadRange {
            op: "shift",
            seq: a,
            start: 3,
            end: 2
        }
    );
    let e = refused(&mut t, |t| t.shift(SeqId(7), 0..1, 1));
    assert_eq!(e, CellError::UnknownSeq { seq: SeqId(7) });
    // Moving into the gap, up to its edges, is fine.
    t.shift(a, 4..6, -2).unwrap();
    t.shift(a, 2..4, 2).unwrap();
    t.check().unwrap();
}

#[test]
fn shift_copies_shared_cells_first() {
    let mut t = KvCells::new(8);
    let (a, b) = (t.create(), t.create());
    t.reserve(&[(a, 0, 4)]).unwrap();
    t.share_prefix(b, a, 4).unwrap();
    t.reserve(&[(b, 4, 2)]).unwrap(); // in place: cells 4, 5
    assert_eq!(t.runs(b).unwrap(), [run(0, 6, 0)]);
    let ops = t.shift(b, 2..6, 10).unwrap();
    assert_eq!(
        ops,
        [
            CellOp::Copy {
                src: 2,
                dst: 6,
                n: 2
            },
            CellOp::Shift {
                cell: 6,
                n: 2,
                delta: 10
            },
            CellOp::Shift {
                cell: 4,
                n: 2,
                delta: 10
            },
        ]
    );
    assert_eq!(
        t.runs(b).unwrap(),
        [run(0, 2, 0), run(6, 2, 12), run(4, 2, 14)]
    );
    assert_eq!(t.runs(a).unwrap(), [run(0, 4, 0)]);
    assert_eq!(t.owners, [2, 2, 1, 1, 1, 1, 1, 1]);
    t.check().unwrap();
    // A full table has no cell to copy into.
    t.truncate(b, 2).unwrap();
    t.reserve(&[(b, 2, 4)]).unwrap();
    assert_eq!(t.n_free(), 0);
    let e = refused(&mut t, |t| t.shift(b, 0..usize::MAX, 1));
    assert_eq!(
        e,
        CellError::NoSpace {
            op: "shift",
            needed: 2,
            free: 0
        }
    );
    // Private cells need none.
    t.shift(b, 5..6, 1).unwrap();
    t.check().unwrap();
}

#[test]
fn copy_prefix_copies_into_fresh_cells() {
    let (mut t, a, b) = two();
    t.reserve(&[(a, 3, 2)]).unwrap(); // cells 5, 6
    t.remove(a, 1..2).unwrap(); // A holds 0, 2, 3, 4 at cells 0, 2, 5, 6
                                // B's own cells 3, 4 come free first, so the copy lands at the lowest: 1, 3, 4, 7.
    let ops = t.copy_prefix(b, a, 5).unwrap();
    assert_eq!(
        ops,
        [
            CellOp::Copy {
                src: 0,
                dst: 1,
                n: 1
            },
            CellOp::Copy {
                src: 2,
                dst: 3,
                n: 1
            },
            CellOp::Copy {
                src: 5,
                dst: 4,
                n: 1
            },
            CellOp::Copy {
                src: 6,
                dst: 7,
                n: 1
            },
        ]
    );
    assert_eq!(
        t.runs(b).unwrap(),
        [run(1, 1, 0), run(3, 2, 2), run(7, 1, 4)]
    );
    assert_eq!(t.n_free(), 0);
    t.check().unwrap();
    // The prefix stops at n, wherever that falls.
    assert_eq!(
        t.copy_prefix(b, a, 3).unwrap(),
        [
            CellOp::Copy {
                src: 0,
                dst: 1,
                n: 1
            },
            CellOp::Copy {
                src: 2,
                dst: 3,
                n: 1
            }
        ]
    );
    assert_eq!(t.runs(b).unwrap(), [run(1, 1, 0), run(3, 1, 2)]);
    t.check().unwrap();
}

#[test]
fn copy_prefix_refusals() {
    let (mut t, a, b) = two();
    let c = t.create();
    t.reserve(&[(c, 0, 3)]).unwrap(); // full
    let e = refused(&mut t, |t| t.copy_prefix(b, b, 1));
    assert_eq!(
        e,
        CellError::SameSeq {
            op: "copy_prefix",
            seq: b
        }
    );
    let e = refused(&mut t, |t| t.copy_prefix(b, a, 4));
    assert_eq!(
        e,
        CellError::PrefixTooLong {
            op: "copy_prefix",
            seq: a,
            n: 4,
            next_pos: 3
        }
    );
    let e = refused(&mut t, |t| t.copy_prefix(SeqId(9), a, 1));
    assert_eq!(e, CellError::UnknownSeq { seq: SeqId(9) });
    let e = refused(&mut t, |t| t.copy_prefix(a, SeqId(9), 0));
    assert_eq!(e, CellError::UnknownSeq { seq: SeqId(9) });
    // B's 2 private cells count as free for the copy: 3 positions do not fit, 2 do.
    let e = refused(&mut t, |t| t.copy_prefix(b, a, 3));
    assert_eq!(
        e,
        CellError::NoSpace {
            op: "copy_prefix",
            needed: 3,
            free: 2
        }
    );
    t.copy_prefix(b, a, 2).unwrap();
    // Cells B shares with A are not freed by replacing B.
    t.share_prefix(b, a, 3).unwrap();
    t.reserve(&[(c, 3, 2)]).unwrap();
    let e = refused(&mut t, |t| t.copy_prefix(b, a, 1));
    assert_eq!(
        e,
        CellError::NoSpace {
            op: "copy_prefix",
            needed: 1,
            free: 0
        }
    );
    t.check().unwrap();
}

#[test]
fn share_prefix_shares_cells() {
    let (mut t, a, b) = two();
    t.share_prefix(b, a, 2).unwrap();
    assert_eq!(t.runs(b).unwrap(), [run(0, 2, 0)]);
    assert_eq!((t.n_free(), &t.owners[..3]), (5, &[2, 2, 1][..]));
    // Re-sharing a longer prefix over an existing share keeps the counts right.
    t.share_prefix(b, a, 3).unwrap();
    assert_eq!((t.n_free(), &t.owners[..3]), (5, &[2, 2, 2][..]));
    t.share_prefix(b, a, 0).unwrap();
    assert_eq!((t.n_free(), t.next_pos(b)), (5, Ok(0)));
    let e = refused(&mut t, |t| t.share_prefix(a, a, 1));
    assert_eq!(
        e,
        CellError::SameSeq {
            op: "share_prefix",
            seq: a
        }
    );
    let e = refused(&mut t, |t| t.share_prefix(b, a, 9));
    assert_eq!(
        e,
        CellError::PrefixTooLong {
            op: "share_prefix",
            seq: a,
            n: 9,
            next_pos: 3
        }
    );
    let e = refused(&mut t, |t| t.share_prefix(b, SeqId(9), 0));
    assert_eq!(e, CellError::UnknownSeq { seq: SeqId(9) });
    t.check().unwrap();
}

#[test]
fn clear_and_release() {
    let (mut t, a, b) = two();
    t.share_prefix(b, a, 3).unwrap();
    t.clear(a).unwrap();
    assert_eq!((t.contains(a), t.next_pos(a), t.n_free()), (true, Ok(0), 5));
    t.release(b).unwrap();
    assert_eq!((t.contains(b), t.n_free()), (false, 8));
    assert_eq!(t.runs(b), Err(CellError::UnknownSeq { seq: b }));
    let e = refused(&mut t, |t| t.release(b));
    assert_eq!(e, CellError::UnknownSeq { seq: b });
    let e = refused(&mut t, |t| t.clear(b));
    assert_eq!(e, CellError::UnknownSeq { seq: b });
    t.check().unwrap();
}

#[test]
fn window_is_bounded_by_position() {
    let mut t = KvCells::new(8);
    let (a, b) = (t.create(), t.create());
    for p in 0..3 {
        t.reserve(&[(a, p, 1), (b, p, 1)]).unwrap();
    }
    // Each grows in place when it can: A holds cells 0, 3, 4; B 1, 2, 5.
    assert_eq!(t.window(a, 0).unwrap(), [(0, 1)]);
    assert_eq!(t.window(a, 2).unwrap(), [(0, 1), (3, 2)]);
    assert_eq!(t.window(b, 1).unwrap(), [(1, 2)]);
    assert_eq!(t.window(b, 2).unwrap(), [(1, 2), (5, 1)]);
    assert_eq!(t.window(a, 3), Err(CellError::NotHeld { seq: a, pos: 3 }));
    assert_eq!(
        t.window(SeqId(5), 0),
        Err(CellError::UnknownSeq { seq: SeqId(5) })
    );
    let mut t = KvCells::new(8);
    let a = t.create();
    t.reserve(&[(a, 0, 8)]).unwrap();
    assert_eq!(t.window(a, 5).unwrap(), [(0, 6)]);
}

/// A healthy table to corrupt: A shares its 3-cell prefix with B, which has 1 more cell.
fn healthy() -> KvCells {
    let (mut t, a, b) = two();
    t.share_prefix(b, a, 3).unwrap();
    t.reserve(&[(b, 3, 1)]).unwrap();
    t.check().unwrap();
    t
}

#[test]
fn check_detects_corrupted_tables() {
    type Corrupt = fn(&mut KvCells);
    let cases: [(&str, Corrupt); 11] = [
        ("owners in the table", |t| t.owners[1] = 1),
        ("owners in the table", |t| {
            t.owners[4] = 1;
            t.n_free -= 1;
        }),
        ("n_free", |t| t.n_free += 1),
        ("is free", |t| {
            t.seqs.get_mut(&SeqId(0)).unwrap().push(run(7, 1, 3));
        }),
        // Two positions in one cell, by two sequences and by one.
        ("holds position", |t| {
            t.seqs.get_mut(&SeqId(1)).unwrap()[0].pos = 1
        }),
        ("twice", |t| {
            let r = t.seqs.get_mut(&SeqId(0)).unwrap();
            r.push(run(1, 1, 9));
            t.owners[1] += 1;
        }),
        ("not merged", |t| {
            let r = t.seqs.get_mut(&SeqId(0)).unwrap();
            *r = vec![run(0, 1, 0), run(1, 2, 1)];
        }),
        ("does not start past", |t| {
            let r = t.seqs.get_mut(&SeqId(0)).unwrap();
            *r = vec![run(0, 2, 0), run(2, 1, 1)];
            t.pos[2] = 1;
        }),
        ("outside", |t| {
            t.seqs.get_mut(&SeqId(0)).unwrap().push(run(7, 5, 3))
        }),
        ("empty", |t| {
            t.seqs.get_mut(&SeqId(0)).unwrap().push(run(7, 0, 3))
        }),
        ("next id", |t| t.next_id = 1),
    ];
    for (want, corrupt) in cases {
        let mut t = healthy();
        corrupt(&mut t);
        let err = t.check().expect_err(want);
        assert!(err.contains(want), "expected {want:?}, got {err:?}");
    }
}
