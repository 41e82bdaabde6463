//! The operations that report physical work: shift (with copy-on-write of shared cells),
//! and the two ways a sequence takes another's prefix (copied or shared).

use super::{push_run, CellError, CellOp, KvCells, Run, SeqId, MAX_POS};
use std::ops::Range;

/// Appends a one-cell copy, merged into the last op when it continues it. The copies of
/// one call here go from owned cells to cells that were free, so none overlaps another and
/// merging cannot change what is read.
fn push_copy(ops: &mut Vec<CellOp>, src: usize, dst: usize) {
    if let Some(CellOp::Copy { src: s, dst: d, n }) = ops.last_mut() {
        if *s + *n == src && *d + *n == dst {
            *n += 1;
            return;
        }
    }
    ops.push(CellOp::Copy { src, dst, n: 1 });
}

/// Appends a one-cell re-rope, merged into the last op when it continues it.
fn push_shift(ops: &mut Vec<CellOp>, cell: usize, delta: i64) {
    if let Some(CellOp::Shift {
        cell: c,
        n,
        delta: d,
    }) = ops.last_mut()
    {
        if *c + *n == cell && *d == delta {
            *n += 1;
            return;
        }
    }
    ops.push(CellOp::Shift { cell, n: 1, delta });
}

/// The part of `runs` holding positions below `n`.
fn prefix_runs(runs: &[Run], n: usize) -> Vec<Run> {
    let mut out = Vec::with_capacity(runs.len());
    for run in runs {
        if run.pos >= n {
            break;
        }
        let [before, _, _] = run.split(n, usize::MAX);
        out.push(before);
    }
    out
}

impl KvCells {
    /// Moves the sequence's positions in `range` by `delta` (the engine re-ropes their K
    /// rows). Refused if a moved position would reach or pass a position of the sequence
    /// outside the range (a collision or a reordering), or leave `0..=MAX_POS`. Cells in
    /// the range shared with other sequences are first copied to fresh cells, which the
    /// sequence then owns instead (copy-on-write), so other owners never see the rotation;
    /// refused if there are not enough free cells for those copies. Returns the ops to run:
    /// the Copy ops, then the Shift ops. A `delta` of 0, or a range holding no position,
    /// does nothing.
    pub fn shift(
        &mut self,
        seq: SeqId,
        range: Range<usize>,
        delta: i64,
    ) -> Result<Vec<CellOp>, CellError> {
        self.check_range("shift", seq, &range)?;
        // One pass finds the moved positions' bounds, their nearest neighbours outside the
        // range (the only positions a uniform move can collide with) and the cells to copy.
        let (mut first, mut last, mut below, mut above) = (None, None, None, None);
        let mut shared = 0;
        for run in &self.seqs[&seq] {
            let [b, inside, a] = run.split(range.start, range.end);
            if b.len > 0 {
                below = Some(b.end_pos() - 1);
            }
            if inside.len > 0 {
                first.get_or_insert(inside.pos);
                last = Some(inside.end_pos() - 1);
                shared += inside.cells().filter(|&c| self.owners[c] > 1).count();
            }
            if a.len > 0 && above.is_none() {
                above = Some(a.pos);
            }
        }
        let (Some(first), Some(last)) = (first, last) else {
            return Ok(Vec::new());
        };
        if delta == 0 {
            return Ok(Vec::new());
        }
        let moved = |p: usize| p as i128 + i128::from(delta);
        for p in [first, last] {
            if moved(p) < 0 || moved(p) > MAX_POS as i128 {
                return Err(CellError::PositionOutOfRange {
                    op: "shift",
                    seq,
                    pos: moved(p),
                });
            }
        }
        let (start, end) = (range.start, range.end);
        let blocker = match (delta < 0, below, above) {
            (true, Some(b), _) if moved(first) <= b as i128 => Some(b),
            (false, _, Some(a)) if moved(last) >= a as i128 => Some(a),
            _ => None,
        };
        if let Some(other) = blocker {
            return Err(CellError::ShiftCollision {
                seq,
                start,
                end,
                delta,
                other,
            });
        }
        if shared > self.n_free {
            let free = self.n_free;
            return Err(CellError::NoSpace {
                op: "shift",
                needed: shared,
                free,
            });
        }
        // Validated. The moved positions stay between their outside neighbours, so
        // rebuilding the runs in their old order keeps them in position order.
        let old = std::mem::take(self.seqs.get_mut(&seq).expect("checked"));
        let mut runs = Vec::with_capacity(old.len() + 2);
        let (mut copies, mut shifts) = (Vec::new(), Vec::new());
        let mut cursor = 0;
        for run in old {
            let [b, inside, a] = run.split(start, end);
            push_run(&mut runs, b);
            for (cell, p) in inside.cells().zip(inside.pos..) {
                let np = moved(p) as usize;
                let cell = if self.owners[cell] > 1 {
                    // Copy-on-write: the other owners keep the cell as it is.
                    self.owners[cell] -= 1;
                    let fresh = self.take_lowest_free(&mut cursor, np);
                    push_copy(&mut copies, cell, fresh);
                    fresh
                } else {
                    self.pos[cell] = np;
                    cell
                };
                push_shift(&mut shifts, cell, delta);
                push_run(
                    &mut runs,
                    Run {
                        cell,
                        len: 1,
                        pos: np,
                    },
                );
            }
            push_run(&mut runs, a);
        }
        *self.seqs.get_mut(&seq).expect("checked") = runs;
        copies.extend(shifts);
        Ok(copies)
    }

    /// Replaces `dst`'s content by a physical copy of `src`'s positions `0..n` in fresh
    /// cells; returns the Copy ops. `dst`'s old cells count as free for the copy. Refused
    /// if `dst == src`, `n > next_pos(src)`, or there are not enough free cells.
    pub fn copy_prefix(
        &mut self,
        dst: SeqId,
        src: SeqId,
        n: usize,
    ) -> Result<Vec<CellOp>, CellError> {
        self.check_prefix("copy_prefix", dst, src, n)?;
        let src_runs = prefix_runs(&self.seqs[&src], n);
        let needed: usize = src_runs.iter().map(|r| r.len).sum();
        // Only dst's private cells come free: a cell it shares (with src or anyone) stays owned.
        let freed = (self.seqs[&dst].iter())
            .flat_map(Run::cells)
            .filter(|&c| self.owners[c] == 1)
            .count();
        let free = self.n_free + freed;
        if needed > free {
            return Err(CellError::NoSpace {
                op: "copy_prefix",
                needed,
                free,
            });
        }
        self.clear(dst)?;
        // src's cells are all still owned, so no fresh cell is one the copies read.
        let (mut runs, mut ops) = (Vec::new(), Vec::new());
        let mut cursor = 0;
        for run in &src_runs {
            for (cell, p) in run.cells().zip(run.pos..) {
                let fresh = self.take_lowest_free(&mut cursor, p);
                push_copy(&mut ops, cell, fresh);
                push_run(
                    &mut runs,
                    Run {
                        cell: fresh,
                        len: 1,
                        pos: p,
                    },
                );
            }
        }
        *self.seqs.get_mut(&dst).expect("checked") = runs;
        Ok(ops)
    }

    /// Replaces `dst`'s content by `src`'s positions `0..n`, sharing `src`'s cells in place
    /// (no copy). Refused if `dst == src` or `n > next_pos(src)`.
    pub fn share_prefix(&mut self, dst: SeqId, src: SeqId, n: usize) -> Result<(), CellError> {
        self.check_prefix("share_prefix", dst, src, n)?;
        let runs = prefix_runs(&self.seqs[&src], n);
        // Count the new ownership before dropping dst's old one, so a cell dst already
        // shared with src never looks free in between.
        for cell in runs.iter().flat_map(Run::cells) {
            self.owners[cell] += 1;
        }
        self.clear(dst)?;
        *self.seqs.get_mut(&dst).expect("checked") = runs;
        Ok(())
    }

    /// The checks common to `copy_prefix` and `share_prefix`.
    fn check_prefix(
        &self,
        op: &'static str,
        dst: SeqId,
        src: SeqId,
        n: usize,
    ) -> Result<(), CellError> {
        self.runs(dst)?;
        let next_pos = self.next_pos(src)?;
        if dst == src {
            return Err(CellError::SameSeq { op, seq: dst });
        }
        if n > next_pos {
            return Err(CellError::PrefixTooLong {
                op,
                seq: src,
                n,
                next_pos,
            });
        }
        Ok(())
    }
}
