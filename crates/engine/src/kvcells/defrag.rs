//! Defragmentation: every held cell moves toward cell 0, laid out so each sequence has as
//! few runs as possible, and the moves are ordered so they can run one after another.
//!
//! The layout: sequences are visited one by one and each places its not yet placed cells,
//! in its position order, at the next free slots. A sequence's unplaced cells thus end up
//! contiguous, and cells shared with an earlier visited sequence stay where it put them.
//! Sequences sharing the most cells are visited first (then the larger first, then by id):
//! in a tree of shared prefixes the deepest shared path is laid out in one piece, and the
//! first of n choices sharing one prompt lays out the prompt, so every choice ends up as
//! the shared prompt run plus its own run (the first one even merges the two).
//!
//! The moves: the new layout is a one-to-one map from held cells to `0..n_held`. Its moves
//! form chains, which end in a cell free now (executed from that end backward, each move
//! into a slot whose content has already moved out), and cycles, which need a scratch cell:
//! the last member is parked in a free cell, the others move, the parked one comes back.
//! Cycles go first so the scratch cell is free for them; the chains may write it later.

use super::{push_run, CellOp, KvCells, Run, SeqId};

/// Not a cell: the new slot of a free cell, or "no one writes this slot".
const NONE: usize = usize::MAX;

impl KvCells {
    /// Compacts every held cell toward cell 0 (cells moved verbatim, no re-rope), keeping
    /// shared cells shared, laid out so each sequence has as few runs as possible (see the
    /// module docs). Returns the Copy ops, in an order that is safe to execute one after
    /// another: no op reads a cell an earlier op overwrote, except the scratch cell a
    /// cycle of moves parks a row in. A full table is left as it is: it has no hole to
    /// close and no scratch cell to reorder with.
    pub fn defrag(&mut self) -> Vec<CellOp> {
        if self.n_free == 0 {
            return Vec::new();
        }
        let new_of = self.layout();
        let scratch = (0..self.n_cells())
            .rev()
            .find(|&c| self.owners[c] == 0)
            .expect("n_free > 0");
        let moves = plan_moves(&new_of, scratch);
        self.apply_layout(&new_of);
        coalesce(&moves)
    }

    /// Per cell, its slot in the new layout (`NONE` for a free cell).
    fn layout(&self) -> Vec<usize> {
        let mut order: Vec<(usize, usize, SeqId)> = (self.seqs.iter())
            .map(|(&id, runs)| {
                let cells = || runs.iter().flat_map(Run::cells);
                let shared = cells().filter(|&c| self.owners[c] > 1).count();
                (shared, cells().count(), id)
            })
            .collect();
        order.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)).then(a.2.cmp(&b.2)));
        let mut new_of = vec![NONE; self.n_cells()];
        let mut next = 0;
        for (_, _, id) in order {
            for cell in self.seqs[&id].iter().flat_map(Run::cells) {
                if new_of[cell] == NONE {
                    new_of[cell] = next;
                    next += 1;
                }
            }
        }
        debug_assert_eq!(next, self.n_cells() - self.n_free);
        new_of
    }

    /// Rewrites the table as `new_of` lays it out.
    fn apply_layout(&mut self, new_of: &[usize]) {
        let n = self.n_cells();
        let (mut owners, mut pos) = (vec![0; n], vec![0; n]);
        for (cell, &slot) in new_of.iter().enumerate() {
            if slot != NONE {
                owners[slot] = self.owners[cell];
                pos[slot] = self.pos[cell];
            }
        }
        self.owners = owners;
        self.pos = pos;
        for runs in self.seqs.values_mut() {
            let old = std::mem::take(runs);
            for run in old {
                for (cell, p) in run.cells().zip(run.pos..) {
                    push_run(
                        runs,
                        Run {
                            cell: new_of[cell],
                            len: 1,
                            pos: p,
                        },
                    );
                }
            }
        }
    }
}

/// The one-cell moves `(src, dst)` that realize `new_of`, in a safe order (module docs),
/// parking rows of cycles in the free cell `scratch`.
fn plan_moves(new_of: &[usize], scratch: usize) -> Vec<(usize, usize)> {
    let n = new_of.len();
    // writer[slot]: the cell moving into slot. The layout is one-to-one, so at most one.
    let mut writer = vec![NONE; n];
    for (cell, &slot) in new_of.iter().enumerate() {
        if slot != NONE && slot != cell {
            writer[slot] = cell;
        }
    }
    let mut planned = vec![false; n];
    let mut chains = Vec::new();
    for end in (0..n).filter(|&c| new_of[c] == NONE) {
        // `end` is free now: fill it, then the slot its filler left, and so on back.
        let mut slot = end;
        while writer[slot] != NONE {
            let cell = writer[slot];
            chains.push((cell, slot));
            planned[cell] = true;
            slot = cell;
        }
    }
    // A moving cell not on a chain is on a cycle: following its moves never reaches a free
    // cell, nor a cell that stays (nobody else may move into a cell that stays).
    let mut moves = Vec::with_capacity(chains.len() + n / 8);
    let mut members = Vec::new();
    for start in 0..n {
        if new_of[start] == NONE || new_of[start] == start || planned[start] {
            continue;
        }
        members.clear();
        let mut cell = start;
        loop {
            members.push(cell);
            planned[cell] = true;
            cell = new_of[cell];
            if cell == start {
                break;
            }
        }
        let last = *members.last().expect("a cycle has two members or more");
        moves.push((last, scratch));
        for w in members.windows(2).rev() {
            moves.push((w[0], w[1]));
        }
        moves.push((scratch, start));
    }
    moves.extend(chains);
    moves
}

/// Merges consecutive one-cell moves into multi-cell Copy ops where that means the same:
/// a Copy reads all its rows before writing any (memmove), so a move joins the op before
/// it only if it continues it (up or down) and does not read a row that op writes.
fn coalesce(moves: &[(usize, usize)]) -> Vec<CellOp> {
    let mut ops: Vec<CellOp> = Vec::new();
    for &(src, dst) in moves {
        if let Some(CellOp::Copy { src: s, dst: d, n }) = ops.last_mut() {
            let reads_written = (*d..*d + *n).contains(&src);
            if !reads_written && *s + *n == src && *d + *n == dst {
                *n += 1;
                continue;
            }
            if !reads_written && src + 1 == *s && dst + 1 == *d {
                (*s, *d, *n) = (src, dst, *n + 1);
                continue;
            }
        }
        ops.push(CellOp::Copy { src, dst, n: 1 });
    }
    ops
}
