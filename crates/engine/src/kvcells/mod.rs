//! The KV cell table of many sequences: which arena rows ("cells") hold which positions of
//! which sequences. Pure bookkeeping: the engine executes the physical work ([`CellOp`]s)
//! on every layer's K and V regions.
//!
//! Positions are not cells. A position drives RoPE and the causal bound; a cell is the arena
//! row a store writes. A sequence is an ordered list of [`Run`]s (cells `cell..cell + len`
//! hold positions `pos..pos + len`), ascending in position, with adjacent runs merged when
//! both their cells and their positions are contiguous. Positions strictly increase along
//! the runs; gaps are allowed (a removal does not shift what follows).
//!
//! A cell may be owned by several sequences (a shared prefix): it then holds the same
//! position for all of them, since its K rows were roped at that position. The table keeps
//! per cell only an owner count and the position; who the owners are lives in the runs
//! (no per-cell sets, no per-cell heap allocation). [`KvCells::check`] proves the two agree.
//!
//! Allocation: a sequence first grows its last run in place when the cells right after it
//! are free; the rest is placed as [`Placement`] says (the lowest free cells, or a free
//! stretch with room to grow: `place`).

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;

mod check;
mod defrag;
#[cfg(test)]
mod defrag_tests;
mod ops;
mod place;
#[cfg(test)]
mod place_tests;
mod undo;
pub use place::Placement;
pub use undo::Checkpoint;
#[cfg(test)]
mod props;
#[cfg(test)]
mod sim;
#[cfg(test)]
mod tests;

/// The highest position a sequence may hold: shifts compute positions in signed arithmetic,
/// and `next_pos` (one past the highest) must stay representable.
pub const MAX_POS: usize = usize::MAX >> 1;

/// A sequence's id. [`KvCells::create`] never hands out an id twice.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SeqId(pub u32);

impl fmt::Display for SeqId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Cells `cell..cell + len` hold positions `pos..pos + len` of one sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Run {
    pub cell: usize,
    pub len: usize,
    pub pos: usize,
}

impl Run {
    /// One past the last position of the run.
    pub fn end_pos(&self) -> usize {
        self.pos + self.len
    }

    /// The cells of the run, in position order.
    pub fn cells(&self) -> Range<usize> {
        self.cell..self.cell + self.len
    }

    /// The part of the run holding positions `from..to` (both within the run).
    fn sub(self, from: usize, to: usize) -> Run {
        Run {
            cell: self.cell + (from - self.pos),
            len: to - from,
            pos: from,
        }
    }

    /// The run cut into its positions below `p0`, within `p0..p1`, and from `p1` on
    /// (each possibly empty).
    fn split(self, p0: usize, p1: usize) -> [Run; 3] {
        let end = self.end_pos();
        let a = p0.clamp(self.pos, end);
        let b = p1.clamp(self.pos, end).max(a);
        [self.sub(self.pos, a), self.sub(a, b), self.sub(b, end)]
    }
}

/// Physical work on every layer's K/V regions, to be done in the order given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CellOp {
    /// Copy the K and V rows of cells `src..src + n` to `dst..dst + n`, with `memmove`
    /// semantics (every source row is read before any destination row is written).
    Copy { src: usize, dst: usize, n: usize },
    /// Re-rope the K rows of cells `cell..cell + n` by `delta` positions.
    Shift { cell: usize, n: usize, delta: i64 },
}

/// Why the table refused an operation. A refused operation leaves the table unchanged.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CellError {
    #[error("sequence {seq} does not exist")]
    UnknownSeq { seq: SeqId },
    #[error("sequence {seq} already exists")]
    SeqExists { seq: SeqId },
    #[error("reserve: sequence {seq} appears more than once in one batch")]
    DuplicateSeq { seq: SeqId },
    #[error("reserve: sequence {seq} continues at position {next_pos}, not {pos0}")]
    NotNextPos {
        seq: SeqId,
        pos0: usize,
        next_pos: usize,
    },
    #[error("{op}: {needed} free cells needed, {free} free")]
    NoSpace {
        op: &'static str,
        needed: usize,
        free: usize,
    },
    #[error("{op}: positions {start}..{end} of sequence {seq}: the start is past the end")]
    BadRange {
        op: &'static str,
        seq: SeqId,
        start: usize,
        end: usize,
    },
    #[error("{op}: sequence {seq} would hold position {pos}, outside 0..={MAX_POS}")]
    PositionOutOfRange {
        op: &'static str,
        seq: SeqId,
        pos: i128,
    },
    #[error(
        "shift: positions {start}..{end} of sequence {seq} moved by {delta} would reach \
         or pass its position {other}"
    )]
    ShiftCollision {
        seq: SeqId,
        start: usize,
        end: usize,
        delta: i64,
        other: usize,
    },
    #[error("sequence {seq} does not hold position {pos}")]
    NotHeld { seq: SeqId, pos: usize },
    #[error("{op}: a prefix of {n} positions asked of sequence {seq}, which ends at {next_pos}")]
    PrefixTooLong {
        op: &'static str,
        seq: SeqId,
        n: usize,
        next_pos: usize,
    },
    #[error("{op}: the source and the destination are both sequence {seq}")]
    SameSeq { op: &'static str, seq: SeqId },
}

/// The cell table of `n_cells` cells and the sequences holding them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvCells {
    /// Per cell, how many sequences own it; 0 = free.
    owners: Vec<u32>,
    /// Per cell, the position it holds (meaningless while free).
    pos: Vec<usize>,
    /// The number of cells with no owner, kept so `n_free` and space checks are O(1).
    n_free: usize,
    seqs: BTreeMap<SeqId, Vec<Run>>,
    /// One past the highest id ever used, so `create` never reuses an id.
    next_id: u64,
    /// Where `reserve` puts cells a sequence cannot grow into in place.
    placement: Placement,
}

/// Appends `run` to `runs`, merging it into the last run when both cells and positions
/// continue it. Empty runs are dropped.
fn push_run(runs: &mut Vec<Run>, run: Run) {
    if run.len == 0 {
        return;
    }
    if let Some(last) = runs.last_mut() {
        if last.cell + last.len == run.cell && last.end_pos() == run.pos {
            last.len += run.len;
            return;
        }
    }
    runs.push(run);
}

impl KvCells {
    /// An empty table of `n_cells` free cells and no sequence.
    pub fn new(n_cells: usize) -> Self {
        KvCells {
            owners: vec![0; n_cells],
            pos: vec![0; n_cells],
            n_free: n_cells,
            seqs: BTreeMap::new(),
            next_id: 0,
            placement: Placement::FirstFit,
        }
    }

    /// The same empty table, placing cells as `placement` says.
    pub fn with_placement(n_cells: usize, placement: Placement) -> Self {
        KvCells {
            placement,
            ..KvCells::new(n_cells)
        }
    }

    /// Where `reserve` puts the cells a sequence cannot grow into in place.
    pub fn placement(&self) -> Placement {
        self.placement
    }

    /// Places later reservations as `placement` says (cells already held stay).
    pub fn set_placement(&mut self, placement: Placement) {
        self.placement = placement;
    }

    /// The number of cells in the table (free or not).
    pub fn n_cells(&self) -> usize {
        self.owners.len()
    }

    /// The number of cells no sequence owns.
    pub fn n_free(&self) -> usize {
        self.n_free
    }

    /// How many sequences own `cell` (0: free; out of range: 0).
    pub fn owner_count(&self, cell: usize) -> u32 {
        self.owners.get(cell).copied().unwrap_or(0)
    }

    /// The number of cells more than one sequence owns (shared prefixes).
    pub fn n_shared(&self) -> usize {
        self.owners.iter().filter(|&&o| o > 1).count()
    }

    /// Creates a new empty sequence with an id never handed out before.
    ///
    /// # Panics
    /// When 2^32 ids have been used.
    pub fn create(&mut self) -> SeqId {
        let id = SeqId(u32::try_from(self.next_id).expect("all 2^32 sequence ids are used"));
        self.next_id += 1;
        self.seqs.insert(id, Vec::new());
        id
    }

    /// Creates a new empty sequence with the id `id`; refused if `id` is in use.
    pub fn create_with_id(&mut self, id: SeqId) -> Result<(), CellError> {
        if self.seqs.contains_key(&id) {
            return Err(CellError::SeqExists { seq: id });
        }
        self.seqs.insert(id, Vec::new());
        self.next_id = self.next_id.max(u64::from(id.0) + 1);
        Ok(())
    }

    /// Whether the sequence exists.
    pub fn contains(&self, seq: SeqId) -> bool {
        self.seqs.contains_key(&seq)
    }

    /// The ids of all sequences, ascending.
    /// How many sequences the table holds.
    pub fn n_seqs(&self) -> usize {
        self.seqs.len()
    }

    pub fn seqs(&self) -> Vec<SeqId> {
        self.seqs.keys().copied().collect()
    }

    /// The runs of a sequence, in position order.
    pub fn runs(&self, seq: SeqId) -> Result<&[Run], CellError> {
        self.seqs
            .get(&seq)
            .map(Vec::as_slice)
            .ok_or(CellError::UnknownSeq { seq })
    }

    /// The number of positions the sequence holds.
    pub fn n_positions(&self, seq: SeqId) -> Result<usize, CellError> {
        Ok(self.runs(seq)?.iter().map(|r| r.len).sum())
    }

    /// One past the highest position the sequence holds; 0 if it holds none.
    pub fn next_pos(&self, seq: SeqId) -> Result<usize, CellError> {
        Ok(self.runs(seq)?.last().map_or(0, Run::end_pos))
    }

    /// All-or-nothing reservation for one batch: for each `(seq, pos0, n)` with
    /// `pos0 == next_pos(seq)`, new cells for positions `pos0..pos0 + n`, returned per
    /// request in position order. Any error (unknown sequence, the same sequence twice,
    /// `pos0 != next_pos`, a position past [`MAX_POS`], not enough free cells) leaves the
    /// table unchanged; the first problem found is reported.
    pub fn reserve(
        &mut self,
        reqs: &[(SeqId, usize, usize)],
    ) -> Result<Vec<Vec<usize>>, CellError> {
        for &(seq, _, _) in reqs {
            self.runs(seq)?;
        }
        let mut ids: Vec<SeqId> = reqs.iter().map(|r| r.0).collect();
        ids.sort_unstable();
        if let Some(w) = ids.windows(2).find(|w| w[0] == w[1]) {
            return Err(CellError::DuplicateSeq { seq: w[0] });
        }
        let mut needed = 0usize;
        for &(seq, pos0, n) in reqs {
            let next_pos = self.next_pos(seq)?;
            if pos0 != next_pos {
                return Err(CellError::NotNextPos {
                    seq,
                    pos0,
                    next_pos,
                });
            }
            if n > 0 && pos0 as u128 + n as u128 - 1 > MAX_POS as u128 {
                let pos = pos0 as i128 + n as i128 - 1;
                return Err(CellError::PositionOutOfRange {
                    op: "reserve",
                    seq,
                    pos,
                });
            }
            needed = needed.saturating_add(n);
        }
        if needed > self.n_free {
            let free = self.n_free;
            return Err(CellError::NoSpace {
                op: "reserve",
                needed,
                free,
            });
        }
        // Validated: from here nothing can fail.
        let mut out: Vec<Vec<usize>> = reqs.iter().map(|r| Vec::with_capacity(r.2)).collect();
        // Phase 1: every sequence grows in place first, before any first-fit pick, so one
        // sequence's first-fit cells never take the cells right after another's last run.
        for (cells, &(seq, pos0, n)) in out.iter_mut().zip(reqs) {
            let Some(last) = self.seqs[&seq].last() else {
                continue;
            };
            let mut cell = last.cell + last.len;
            while cells.len() < n && cell < self.n_cells() && self.owners[cell] == 0 {
                self.take(cell, pos0 + cells.len());
                cells.push(cell);
                cell += 1;
            }
        }
        if let Placement::Blocks { min } = self.placement {
            self.place_blocks(min, &mut out, reqs);
            return Ok(out);
        }
        // Phase 2: the rest from the lowest free cells. Nothing is freed during a reserve,
        // so one cursor sweeps the table once for the whole batch.
        let mut cursor = 0;
        for (cells, &(seq, pos0, n)) in out.iter_mut().zip(reqs) {
            while cells.len() < n {
                let cell = self.take_lowest_free(&mut cursor, pos0 + cells.len());
                cells.push(cell);
            }
            self.push_cells(seq, pos0, cells);
        }
        Ok(out)
    }

    /// Forgets positions `positions` of the sequence; cells left with no owner become
    /// free. Later positions keep their values (a gap). Positions not held are ignored.
    pub fn remove(&mut self, seq: SeqId, positions: Range<usize>) -> Result<(), CellError> {
        self.check_range("remove", seq, &positions)?;
        let old = std::mem::take(self.seqs.get_mut(&seq).expect("checked"));
        let mut kept = Vec::with_capacity(old.len() + 1);
        for run in old {
            let [before, inside, after] = run.split(positions.start, positions.end);
            push_run(&mut kept, before);
            for cell in inside.cells() {
                self.unref(cell);
            }
            push_run(&mut kept, after);
        }
        *self.seqs.get_mut(&seq).expect("checked") = kept;
        Ok(())
    }

    /// Keeps only the sequence's positions below `n`.
    pub fn truncate(&mut self, seq: SeqId, n: usize) -> Result<(), CellError> {
        self.remove(seq, n..usize::MAX)
    }

    /// Empties the sequence (it stays, holding nothing); cells left with no owner are free.
    pub fn clear(&mut self, seq: SeqId) -> Result<(), CellError> {
        let old = std::mem::take(
            self.seqs
                .get_mut(&seq)
                .ok_or(CellError::UnknownSeq { seq })?,
        );
        for run in old {
            for cell in run.cells() {
                self.unref(cell);
            }
        }
        Ok(())
    }

    /// Empties the sequence and deletes it. Its id is not handed out again by `create`.
    pub fn release(&mut self, seq: SeqId) -> Result<(), CellError> {
        self.clear(seq)?;
        self.seqs.remove(&seq);
        Ok(())
    }

    /// The attention window of a query at position `p`, which the sequence must hold
    /// (typically just reserved): the `(cell, len)` runs holding the sequence's positions
    /// `<= p`, in position order. The causal bound comes from positions, not cells.
    pub fn window(&self, seq: SeqId, p: usize) -> Result<Vec<(usize, usize)>, CellError> {
        let runs = self.runs(seq)?;
        let i = runs.partition_point(|r| r.end_pos() <= p);
        match runs.get(i) {
            Some(r) if r.pos <= p => {
                let mut w = Vec::with_capacity(i + 1);
                w.extend(runs[..i].iter().map(|r| (r.cell, r.len)));
                w.push((r.cell, p - r.pos + 1));
                Ok(w)
            }
            _ => Err(CellError::NotHeld { seq, pos: p }),
        }
    }

    /// Refuses an unknown sequence or a range whose start is past its end.
    fn check_range(&self, op: &'static str, seq: SeqId, r: &Range<usize>) -> Result<(), CellError> {
        self.runs(seq)?;
        if r.start > r.end {
            let (start, end) = (r.start, r.end);
            return Err(CellError::BadRange {
                op,
                seq,
                start,
                end,
            });
        }
        Ok(())
    }

    /// Gives the free `cell` its first owner, holding position `pos`.
    fn take(&mut self, cell: usize, pos: usize) {
        debug_assert_eq!(self.owners[cell], 0, "cell {cell} is not free");
        self.owners[cell] = 1;
        self.pos[cell] = pos;
        self.n_free -= 1;
    }

    /// Takes the lowest free cell at or above `*cursor` for position `pos`, and moves the
    /// cursor past it. The caller has checked there are enough free cells.
    fn take_lowest_free(&mut self, cursor: &mut usize, pos: usize) -> usize {
        while self.owners[*cursor] != 0 {
            *cursor += 1;
        }
        let cell = *cursor;
        self.take(cell, pos);
        *cursor += 1;
        cell
    }

    /// Drops one owner of `cell`, freeing it when none is left.
    fn unref(&mut self, cell: usize) {
        debug_assert!(self.owners[cell] > 0, "cell {cell} has no owner");
        self.owners[cell] -= 1;
        if self.owners[cell] == 0 {
            // A free cell holds no position; keeping it 0 makes equal tables compare equal.
            self.pos[cell] = 0;
            self.n_free += 1;
        }
    }
}
