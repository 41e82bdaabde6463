//! KV operations on sequences. The cell table ([`crate::kvcells`]) decides what moves; the
//! physical work is a graph of cell operations on every layer's regions
//! ([`minfer_graph::Op::KvCopy`], [`minfer_graph::Op::KvRopeShift`], built by
//! [`minfer_graph::cell_ops_graph`]), each node on the backend that owns its region and run
//! by the scheduler like a forward (`ModelRunner::apply_cell_ops`). No KV arithmetic is done
//! here.
//!
//! - [`Engine::seq_remove`] forgets a position range (later positions keep theirs: a gap);
//!   [`Engine::seq_shift`] moves a range's positions by `delta` and re-ropes its K rows
//!   (`R(p + δ) = R(δ)·R(p)`, up to f32 rounding of the composed angle, and for f16 one more
//!   rounding to half). A shared cell is copied before it is rotated (copy-on-write), so the
//!   other owners never see it.
//! - [`Engine::seq_copy_prefix`] copies another sequence's prefix into fresh cells;
//!   [`Engine::seq_share_prefix`] shares its cells in place.
//! - [`Engine::defrag`] compacts the arena (cells moved verbatim) and reports the moves.
//! - The one-sequence forms (`kv_clear`, `kv_truncate`, `kv_remove`, `kv_retain`) act on the
//!   default sequence, removing and shifting so that its positions stay dense.
//!
//! Q8_0 cannot shift: rotating a row means re-quantizing every block, and the rounding
//! compounds with each shift; [`kv_can_shift`] says which types can, and a shift of a q8_0
//! cache is refused before anything changes.

use crate::engine::{Engine, Result};
use crate::kvcells::{CellOp, SeqId};
use minfer_gguf::GgmlType;
use minfer_graph::KvLayout;
use std::ops::Range;

pub use crate::error::KvError;

/// Whether a KV element type can shift positions (see the module docs).
pub fn kv_can_shift(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::F32 | GgmlType::F16)
}

/// A move of cells defrag made: `n` cells from `src` to `dst`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CellMove {
    pub src: usize,
    pub dst: usize,
    pub n: usize,
}

impl Engine {
    pub(crate) fn kv_layout(&self) -> KvLayout {
        self.runner.kv_layout()
    }

    pub(crate) fn apply_cell_ops(&mut self, ops: &[CellOp]) -> Result<()> {
        self.runner.apply_cell_ops(ops)
    }

    /// A new, empty sequence.
    pub fn seq_create(&mut self) -> SeqId {
        self.kv.cells_mut().create()
    }

    /// Forgets a sequence, freeing the cells no other sequence shares.
    pub fn seq_release(&mut self, seq: SeqId) -> Result<()> {
        self.kv.cells_mut().release(seq)?;
        self.forget_faults(seq);
        Ok(())
    }

    /// Empties a sequence (it stays, holding nothing).
    pub fn seq_clear(&mut self, seq: SeqId) -> Result<()> {
        Ok(self.kv.cells_mut().clear(seq)?)
    }

    /// Keeps positions below `n`.
    pub fn seq_truncate(&mut self, seq: SeqId, n: usize) -> Result<()> {
        Ok(self.kv.cells_mut().truncate(seq, n)?)
    }

    /// Forgets positions `range` (later positions keep theirs).
    pub fn seq_remove(&mut self, seq: SeqId, range: Range<usize>) -> Result<()> {
        Ok(self.kv.cells_mut().remove(seq, range)?)
    }

    /// Moves positions `range` by `delta`, re-roping their K rows (shared cells are copied
    /// first). Refused for a q8_0 cache before anything changes.
    pub fn seq_shift(&mut self, seq: SeqId, range: Range<usize>, delta: i64) -> Result<()> {
        if delta == 0 || range.is_empty() {
            return Ok(());
        }
        if !kv_can_shift(self.runner.cache_type()) {
            return Err(KvError::CannotShift {
                ty: self.runner.cache_type(),
            }
            .into());
        }
        let mut next = self.kv.cells().clone();
        let ops = next.shift(seq, range, delta)?;
        self.apply_cell_ops(&ops)?;
        self.kv.replace_cells(next);
        Ok(())
    }

    /// `dst` becomes a copy of `src`'s positions `0..n`, in fresh cells of its own.
    pub fn seq_copy_prefix(&mut self, dst: SeqId, src: SeqId, n: usize) -> Result<()> {
        let mut next = self.kv.cells().clone();
        let ops = next.copy_prefix(dst, src, n)?;
        self.apply_cell_ops(&ops)?;
        self.kv.replace_cells(next);
        Ok(())
    }

    /// `dst` becomes `src`'s positions `0..n`, sharing its cells in place.
    pub fn seq_share_prefix(&mut self, dst: SeqId, src: SeqId, n: usize) -> Result<()> {
        Ok(self.kv.cells_mut().share_prefix(dst, src, n)?)
    }

    /// How many leading positions of `src` a new sequence may share with
    /// [`Engine::seq_share_prefix`] and still have its window mapped by a forward
    /// (`usize::MAX`: all of them; 0 for an unknown sequence).
    ///
    /// A forward maps each sequence's window as at most `KV_MAP_RUNS` runs of cells, and
    /// defrag can lay a sequence out in one run per *segment*: a stretch of positions whose
    /// cells have the same owners. Along a sequence's positions the owner sets only shrink
    /// (a prefix is shared by everyone sharing a longer one), so a segment ends exactly where
    /// the owner count changes. Sharing at most `KV_MAP_RUNS - 2` segments leaves the rest of
    /// the map for the sequence's own cells.
    pub fn shareable_prefix(&self, src: SeqId) -> usize {
        const SHARED_SEGMENTS: usize = minfer_graph::KV_MAP_RUNS - 2;
        let cells = self.kv.cells();
        let Ok(runs) = cells.runs(src) else { return 0 };
        let mut segments = 0;
        let mut last = None;
        for r in runs {
            for (k, cell) in r.cells().enumerate() {
                let owners = cells.owner_count(cell);
                if last != Some(owners) {
                    segments += 1;
                    if segments > SHARED_SEGMENTS {
                        return r.pos + k;
                    }
                    last = Some(owners);
                }
            }
        }
        usize::MAX
    }

    /// Compacts the arena toward cell 0 (cells moved verbatim, no result changes) and
    /// returns the moves made.
    pub fn defrag(&mut self) -> Result<Vec<CellMove>> {
        let mut next = self.kv.cells().clone();
        let ops = next.defrag();
        self.apply_cell_ops(&ops)?;
        self.kv.replace_cells(next);
        self.kv.count_defrag();
        Ok(ops
            .iter()
            .filter_map(|op| match *op {
                CellOp::Copy { src, dst, n } => Some(CellMove { src, dst, n }),
                CellOp::Shift { .. } => None,
            })
            .collect())
    }

    /// Forgets everything the default sequence holds.
    pub fn kv_clear(&mut self) {
        let seq = self.kv.default_seq();
        // The default sequence always exists.
        let _ = self.kv.cells_mut().clear(seq);
    }

    /// Keeps the default sequence's first `n` positions.
    pub fn kv_truncate(&mut self, n: usize) {
        let seq = self.kv.default_seq();
        let _ = self.kv.cells_mut().truncate(seq, n);
    }

    /// Keeps the default sequence's positions in `ranges` (ascending, disjoint, within what
    /// is held) and shifts each down to close the gaps. Everything is checked before any
    /// cell changes.
    pub fn kv_retain(&mut self, ranges: &[Range<usize>]) -> Result<()> {
        let n_past = self.n_past();
        let ranges: Vec<Range<usize>> = ranges.iter().filter(|r| !r.is_empty()).cloned().collect();
        for (i, r) in ranges.iter().enumerate() {
            if r.end > n_past {
                return Err(KvError::NotHeld {
                    op: "kv_retain",
                    start: r.start,
                    end: r.end,
                    n_past,
                }
                .into());
            }
            if i > 0 && ranges[i - 1].end > r.start {
                return Err(KvError::Unordered {
                    prev: ranges[i - 1].clone(),
                    next: r.clone(),
                }
                .into());
            }
        }
        let mut dst = 0;
        let moves = ranges.iter().any(|r| {
            let moved = r.start != dst;
            dst += r.len();
            moved
        });
        if moves && !kv_can_shift(self.runner.cache_type()) {
            return Err(KvError::CannotShift {
                ty: self.runner.cache_type(),
            }
            .into());
        }
        let seq = self.kv.default_seq();
        let mut next = self.kv.cells().clone();
        let mut ops = Vec::new();
        // Remove the gaps (from the end, so earlier ranges keep their positions), then shift
        // every kept range down to where the ranges before it end.
        let mut gaps = Vec::new();
        let mut at = 0;
        for r in &ranges {
            if r.start > at {
                gaps.push(at..r.start);
            }
            at = r.end;
        }
        if at < n_past {
            gaps.push(at..n_past);
        }
        for g in gaps.iter().rev() {
            next.remove(seq, g.clone())?;
        }
        let mut dst = 0;
        for r in &ranges {
            if r.start != dst {
                ops.extend(next.shift(seq, r.clone(), dst as i64 - r.start as i64)?);
            }
            dst += r.len();
        }
        self.apply_cell_ops(&ops)?;
        self.kv.replace_cells(next);
        Ok(())
    }

    /// Removes the default sequence's positions `[p0, p1)`; later positions move down by
    /// `p1 - p0` (K re-RoPEd).
    pub fn kv_remove(&mut self, p0: usize, p1: usize) -> Result<()> {
        let n = self.n_past();
        if p0 > p1 || p1 > n {
            return Err(KvError::NotHeld {
                op: "kv_remove",
                start: p0,
                end: p1,
                n_past: n,
            }
            .into());
        }
        self.kv_retain(&[0..p0, p1..n])
    }
}
