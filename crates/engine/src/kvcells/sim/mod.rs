//! The harness of the property tests: the table runs against a shadow model (per sequence,
//! position -> the K/V content it must read) while an arena of cells is simulated
//! physically (the ops the table returns are executed on it). After every operation the
//! table must pass `check` and every held position must read, at the cell the table says,
//! exactly what the shadow expects. That proves copy-on-write (a sharer's shift never
//! changes what another sharer reads) and that defrag's moves are right and safely ordered.

use super::{CellError, CellOp, KvCells, Run, SeqId, MAX_POS};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::ops::Range;

mod random;

pub(super) use random::Rng;

/// The K/V content of a cell: which reserve wrote it, and how far it was re-roped since.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Value {
    origin: u64,
    delta: i64,
}

/// A fault injected into the execution of the ops, to prove the harness catches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Fault {
    None,
    /// The Copy ops of shifts (copy-on-write of shared cells) are not executed.
    DropShiftCopies,
    /// The Shift ops are not executed.
    DropShifts,
    /// Defrag's ops are executed in reverse order.
    ReverseDefrag,
}

pub(super) struct Sim {
    pub(super) cells: KvCells,
    arena: Vec<Option<Value>>,
    shadow: BTreeMap<SeqId, BTreeMap<usize, Value>>,
    /// Every id ever created, to prove `create` never reuses one.
    ever: BTreeSet<SeqId>,
    next_value: u64,
    fault: Fault,
    /// Whether an expected refusal is an error too (scenarios whose every call must work).
    strict: bool,
    /// Per operation, how many calls succeeded and how many were refused.
    pub(super) tally: BTreeMap<&'static str, [usize; 2]>,
    /// Shifts that copied shared cells, defrags that moved cells, and those of them that
    /// moved a cycle (parked a row in a scratch cell).
    pub(super) cow_shifts: usize,
    pub(super) moving_defrags: usize,
    pub(super) cycle_defrags: usize,
}

impl Sim {
    pub(super) fn new(n_cells: usize, fault: Fault) -> Self {
        Sim {
            cells: KvCells::new(n_cells),
            arena: vec![None; n_cells],
            shadow: BTreeMap::new(),
            ever: BTreeSet::new(),
            next_value: 0,
            fault,
            strict: false,
            tally: BTreeMap::new(),
            cow_shifts: 0,
            moving_defrags: 0,
            cycle_defrags: 0,
        }
    }

    /// `steps` random operations on a table of random size, each followed by `verify`.
    pub(super) fn run(seed: u64, steps: usize, fault: Fault) -> Result<Sim, String> {
        Sim::run_placed(seed, steps, fault, super::Placement::FirstFit)
    }

    /// [`Sim::run`] on a table placing cells as `placement` says.
    pub(super) fn run_placed(
        seed: u64,
        steps: usize,
        fault: Fault,
        placement: super::Placement,
    ) -> Result<Sim, String> {
        let mut rng = Rng::new(seed);
        let mut sim = Sim::new(6 + rng.below(40), fault);
        sim.cells.set_placement(placement);
        for _ in 0..2 + rng.below(3) {
            sim.do_create()?;
        }
        for step in 0..steps {
            sim.step(&mut rng)
                .and_then(|()| sim.verify(&mut rng))
                .map_err(|e| format!("seed {seed}, step {step}: {e}"))?;
        }
        Ok(sim)
    }

    /// Makes every later refusal an error.
    pub(super) fn set_strict(&mut self) {
        self.strict = true;
    }

    pub(super) fn set_fault(&mut self, fault: Fault) {
        self.fault = fault;
    }

    /// Executes ops on the arena, as the engine would on every layer.
    pub(super) fn exec_ops(&mut self, ops: &[CellOp]) {
        for &op in ops {
            match op {
                CellOp::Copy { src, dst, n } => {
                    let rows = self.arena[src..src + n].to_vec();
                    self.arena[dst..dst + n].copy_from_slice(&rows);
                }
                CellOp::Shift { cell, n, delta } => {
                    for v in self.arena[cell..cell + n].iter_mut().flatten() {
                        v.delta += delta;
                    }
                }
            }
        }
    }

    fn next_pos(&self, seq: SeqId) -> usize {
        (self.shadow.get(&seq))
            .and_then(|m| m.keys().next_back())
            .map_or(0, |p| p + 1)
    }

    /// Compares a call's result with the expected one; a refusal must leave the table as
    /// `before`.
    fn outcome<T: Debug>(
        &mut self,
        op: &'static str,
        before: &KvCells,
        got: Result<T, CellError>,
        want: Option<CellError>,
    ) -> Result<Option<T>, String> {
        self.tally.entry(op).or_default()[usize::from(got.is_err())] += 1;
        match (got, want) {
            (Ok(t), None) => Ok(Some(t)),
            (Err(e), Some(w)) if e == w => {
                if self.strict {
                    return Err(format!("{op}: refused ({e}) in a strict scenario"));
                }
                if self.cells != *before {
                    return Err(format!("{op}: refused ({e}), yet the table changed"));
                }
                Ok(None)
            }
            (got, want) => Err(format!("{op}: got {got:?}, expected {want:?}")),
        }
    }

    /// The error the shadow predicts for an unknown sequence.
    fn known(&self, seq: SeqId) -> Option<CellError> {
        (!self.shadow.contains_key(&seq)).then_some(CellError::UnknownSeq { seq })
    }

    pub(super) fn do_create(&mut self) -> Result<SeqId, String> {
        let id = self.cells.create();
        if !self.ever.insert(id) {
            return Err(format!("create handed out {id} again"));
        }
        self.shadow.insert(id, BTreeMap::new());
        Ok(id)
    }

    fn do_create_with_id(&mut self, id: SeqId) -> Result<(), String> {
        let before = self.cells.clone();
        let want = (self.shadow.contains_key(&id)).then_some(CellError::SeqExists { seq: id });
        let got = self.cells.create_with_id(id);
        if self
            .outcome("create_with_id", &before, got, want)?
            .is_some()
        {
            self.ever.insert(id);
            self.shadow.insert(id, BTreeMap::new());
        }
        Ok(())
    }

    fn reserve_want(&self, reqs: &[(SeqId, usize, usize)]) -> Option<CellError> {
        if let Some(e) = reqs.iter().find_map(|r| self.known(r.0)) {
            return Some(e);
        }
        let mut ids: Vec<SeqId> = reqs.iter().map(|r| r.0).collect();
        ids.sort_unstable();
        if let Some(w) = ids.windows(2).find(|w| w[0] == w[1]) {
            return Some(CellError::DuplicateSeq { seq: w[0] });
        }
        for &(seq, pos0, n) in reqs {
            let next_pos = self.next_pos(seq);
            if pos0 != next_pos {
                return Some(CellError::NotNextPos {
                    seq,
                    pos0,
                    next_pos,
                });
            }
            let last = pos0 as i128 + n as i128 - 1;
            if n > 0 && last > MAX_POS as i128 {
                return Some(CellError::PositionOutOfRange {
                    op: "reserve",
                    seq,
                    pos: last,
                });
            }
        }
        let needed = reqs.iter().map(|r| r.2).sum();
        let free = self.cells.n_free();
        (needed > free).then_some(CellError::NoSpace {
            op: "reserve",
            needed,
            free,
        })
    }

    /// A reserve, writing fresh contents into the cells it returns.
    pub(super) fn do_reserve(&mut self, reqs: &[(SeqId, usize, usize)]) -> Result<(), String> {
        let before = self.cells.clone();
        let want = self.reserve_want(reqs);
        let got = self.cells.reserve(reqs);
        let Some(out) = self.outcome("reserve", &before, got, want)? else {
            return Ok(());
        };
        for (&(seq, pos0, n), cells) in reqs.iter().zip(&out) {
            if cells.len() != n {
                return Err(format!("reserve gave {seq} {} cells for {n}", cells.len()));
            }
            for (&cell, p) in cells.iter().zip(pos0..) {
                let v = Value {
                    origin: self.next_value,
                    delta: 0,
                };
                self.next_value += 1;
                self.arena[cell] = Some(v);
                self.shadow.get_mut(&seq).expect("known").insert(p, v);
            }
        }
        Ok(())
    }

    fn do_remove(&mut self, seq: SeqId, range: Range<usize>) -> Result<(), String> {
        let before = self.cells.clone();
        let want = self.known(seq).or_else(|| {
            let (start, end) = (range.start, range.end);
            (start > end).then_some(CellError::BadRange {
                op: "remove",
                seq,
                start,
                end,
            })
        });
        let got = self.cells.remove(seq, range.clone());
        if self.outcome("remove", &before, got, want)?.is_some() {
            self.shadow
                .get_mut(&seq)
                .expect("known")
                .retain(|p, _| !range.contains(p));
        }
        Ok(())
    }

    fn do_truncate(&mut self, seq: SeqId, n: usize) -> Result<(), String> {
        let before = self.cells.clone();
        let want = self.known(seq);
        let got = self.cells.truncate(seq, n);
        if self.outcome("truncate", &before, got, want)?.is_some() {
            self.shadow.get_mut(&seq).expect("known").split_off(&n);
        }
        Ok(())
    }

    fn shift_want(&self, seq: SeqId, range: &Range<usize>, delta: i64) -> Option<CellError> {
        if let Some(e) = self.known(seq) {
            return Some(e);
        }
        let (start, end) = (range.start, range.end);
        if start > end {
            return Some(CellError::BadRange {
                op: "shift",
                seq,
                start,
                end,
            });
        }
        let map = &self.shadow[&seq];
        let (Some(&first), Some(&last)) = (
            map.range(start..end).next().map(|e| e.0),
            map.range(start..end).next_back().map(|e| e.0),
        ) else {
            return None;
        };
        if delta == 0 {
            return None;
        }
        let moved = |p: usize| p as i128 + i128::from(delta);
        for p in [first, last] {
            if moved(p) < 0 || moved(p) > MAX_POS as i128 {
                return Some(CellError::PositionOutOfRange {
                    op: "shift",
                    seq,
                    pos: moved(p),
                });
            }
        }
        let below = map.range(..start).next_back().map(|e| *e.0);
        let above = map.range(end..).next().map(|e| *e.0);
        let other = match (below, above) {
            (Some(b), _) if delta < 0 && moved(first) <= b as i128 => Some(b),
            (_, Some(a)) if delta > 0 && moved(last) >= a as i128 => Some(a),
            _ => None,
        };
        if let Some(other) = other {
            return Some(CellError::ShiftCollision {
                seq,
                start,
                end,
                delta,
                other,
            });
        }
        let needed = (self.cells.runs(seq).expect("known").iter())
            .flat_map(|r| r.cells().zip(r.pos..))
            .filter(|&(c, p)| range.contains(&p) && self.cells.owners[c] > 1)
            .count();
        let free = self.cells.n_free();
        (needed > free).then_some(CellError::NoSpace {
            op: "shift",
            needed,
            free,
        })
    }

    pub(super) fn do_shift(
        &mut self,
        seq: SeqId,
        range: Range<usize>,
        delta: i64,
    ) -> Result<(), String> {
        let before = self.cells.clone();
        let want = self.shift_want(seq, &range, delta);
        let got = self.cells.shift(seq, range.clone(), delta);
        let Some(mut ops) = self.outcome("shift", &before, got, want)? else {
            return Ok(());
        };
        let map = self.shadow.get_mut(&seq).expect("known");
        let moving: Vec<(usize, Value)> = map.range(range.clone()).map(|(&p, &v)| (p, v)).collect();
        if (moving.is_empty() || delta == 0) && !ops.is_empty() {
            return Err(format!("shift of nothing returned {ops:?}"));
        }
        let first_shift = ops.iter().position(|op| matches!(op, CellOp::Shift { .. }));
        if ops[first_shift.unwrap_or(ops.len())..]
            .iter()
            .any(|op| matches!(op, CellOp::Copy { .. }))
        {
            return Err(format!("shift returned a Copy after a Shift: {ops:?}"));
        }
        if first_shift.is_some_and(|i| i > 0) {
            self.cow_shifts += 1;
        }
        for (p, _) in &moving {
            map.remove(p);
        }
        for (p, v) in moving {
            let v = Value {
                origin: v.origin,
                delta: v.delta + delta,
            };
            map.insert((p as i128 + i128::from(delta)) as usize, v);
        }
        match self.fault {
            Fault::DropShiftCopies => ops.retain(|op| !matches!(op, CellOp::Copy { .. })),
            Fault::DropShifts => ops.retain(|op| !matches!(op, CellOp::Shift { .. })),
            _ => {}
        }
        self.exec_ops(&ops);
        Ok(())
    }

    fn prefix_want(&self, op: &'static str, dst: SeqId, src: SeqId, n: usize) -> Option<CellError> {
        let next_pos = self.next_pos(src);
        if let Some(e) = self.known(dst).or_else(|| self.known(src)) {
            Some(e)
        } else if dst == src {
            Some(CellError::SameSeq { op, seq: dst })
        } else if n > next_pos {
            Some(CellError::PrefixTooLong {
                op,
                seq: src,
                n,
                next_pos,
            })
        } else if op == "copy_prefix" {
            let needed = self.shadow[&src].range(..n).count();
            let freed = (self.cells.runs(dst).expect("known").iter())
                .flat_map(Run::cells)
                .filter(|&c| self.cells.owners[c] == 1)
                .count();
            let free = self.cells.n_free() + freed;
            (needed > free).then_some(CellError::NoSpace { op, needed, free })
        } else {
            None
        }
    }

    fn do_copy_prefix(&mut self, dst: SeqId, src: SeqId, n: usize) -> Result<(), String> {
        let before = self.cells.clone();
        let want = self.prefix_want("copy_prefix", dst, src, n);
        let got = self.cells.copy_prefix(dst, src, n);
        if let Some(ops) = self.outcome("copy_prefix", &before, got, want)? {
            if ops.iter().any(|op| matches!(op, CellOp::Shift { .. })) {
                return Err(format!("copy_prefix returned a Shift: {ops:?}"));
            }
            self.exec_ops(&ops);
            let prefix = self.shadow[&src]
                .range(..n)
                .map(|(&p, &v)| (p, v))
                .collect();
            self.shadow.insert(dst, prefix);
        }
        Ok(())
    }

    pub(super) fn do_share_prefix(
        &mut self,
        dst: SeqId,
        src: SeqId,
        n: usize,
    ) -> Result<(), String> {
        let before = self.cells.clone();
        let want = self.prefix_want("share_prefix", dst, src, n);
        let got = self.cells.share_prefix(dst, src, n);
        if self.outcome("share_prefix", &before, got, want)?.is_some() {
            let prefix = self.shadow[&src]
                .range(..n)
                .map(|(&p, &v)| (p, v))
                .collect();
            self.shadow.insert(dst, prefix);
        }
        Ok(())
    }

    fn do_clear(&mut self, seq: SeqId, release: bool) -> Result<(), String> {
        let before = self.cells.clone();
        let want = self.known(seq);
        let (op, got) = if release {
            ("release", self.cells.release(seq))
        } else {
            ("clear", self.cells.clear(seq))
        };
        if self.outcome(op, &before, got, want)?.is_some() {
            if release {
                self.shadow.remove(&seq);
            } else {
                self.shadow.insert(seq, BTreeMap::new());
            }
        }
        Ok(())
    }

    pub(super) fn do_release(&mut self, seq: SeqId) -> Result<(), String> {
        self.do_clear(seq, true)
    }

    /// A defrag; the held cells must end up exactly the lowest ones.
    pub(super) fn do_defrag(&mut self) -> Result<(), String> {
        let mut ops = self.cells.defrag();
        self.tally.entry("defrag").or_default()[0] += 1;
        if ops.iter().any(|op| matches!(op, CellOp::Shift { .. })) {
            return Err(format!("defrag returned a Shift: {ops:?}"));
        }
        let n_held = self.cells.n_cells() - self.cells.n_free();
        if self.cells.n_free() > 0 && self.cells.owners[..n_held].contains(&0) {
            return Err(format!(
                "defrag left a hole below {n_held}: {:?}",
                self.cells.owners
            ));
        }
        self.moving_defrags += usize::from(!ops.is_empty());
        // Every cell a layout fills is below n_held: writing above is parking.
        let parks = ops
            .iter()
            .any(|op| matches!(op, CellOp::Copy { dst, .. } if *dst >= n_held));
        self.cycle_defrags += usize::from(parks);
        if self.fault == Fault::ReverseDefrag {
            ops.reverse();
        }
        self.exec_ops(&ops);
        Ok(())
    }

    /// The invariants after every operation: `check` passes, the table's sequences and
    /// positions are the shadow's, and every held position reads (at the cell `runs` and
    /// `window` name) the content the shadow expects.
    pub(super) fn verify(&self, rng: &mut Rng) -> Result<(), String> {
        self.cells.check()?;
        let ids: Vec<SeqId> = self.shadow.keys().copied().collect();
        if self.cells.seqs() != ids {
            return Err(format!(
                "the table has {:?}, the shadow {ids:?}",
                self.cells.seqs()
            ));
        }
        for (&seq, map) in &self.shadow {
            let held: Vec<(usize, usize)> = (self.cells.runs(seq).map_err(|e| e.to_string())?)
                .iter()
                .flat_map(|r| r.cells().zip(r.pos..))
                .collect();
            let positions: Vec<usize> = held.iter().map(|h| h.1).collect();
            if !positions.iter().eq(map.keys()) {
                return Err(format!(
                    "{seq} holds {positions:?}, the shadow {:?}",
                    map.keys()
                ));
            }
            for (&(cell, p), want) in held.iter().zip(map.values()) {
                if self.arena[cell] != Some(*want) {
                    return Err(format!(
                        "{seq} position {p}: the arena has {:?} at cell {cell}, expected {want:?}",
                        self.arena[cell]
                    ));
                }
            }
            let next_pos = self.next_pos(seq);
            if self.cells.next_pos(seq) != Ok(next_pos)
                || self.cells.n_positions(seq) != Ok(held.len())
            {
                return Err(format!(
                    "{seq}: next_pos or n_positions disagree with the shadow"
                ));
            }
            if !held.is_empty() {
                let i = rng.below(held.len());
                let w = self
                    .cells
                    .window(seq, held[i].1)
                    .map_err(|e| e.to_string())?;
                let cells = w.iter().flat_map(|&(c, n)| c..c + n);
                if !cells.eq(held[..=i].iter().map(|h| h.0)) {
                    return Err(format!(
                        "{seq}: window at {} is {w:?}, runs say {held:?}",
                        held[i].1
                    ));
                }
            }
            if self.cells.window(seq, next_pos) != Err(CellError::NotHeld { seq, pos: next_pos }) {
                return Err(format!(
                    "{seq}: window at {next_pos}, which it does not hold, answered"
                ));
            }
        }
        Ok(())
    }
}
