//! Where `reserve` puts the cells of a sequence that cannot grow in place.
//!
//! First fit (the lowest free cells) interleaves sequences that grow together: in a batch
//! of decode rows every sequence but one jumps to the next free cell, so each gains a run of
//! one cell per step, its window soon needs more runs than a kv map holds, and the engine
//! compacts the whole arena (a defrag whose cell copies cost a node per layer and move).
//!
//! [`Placement::Blocks`] keeps a sequence's cells in few runs without any state of its own:
//! a sequence that must jump takes the lowest free stretch with room for what it needs now
//! plus a *zone* to grow into (the cells right after its new last cell), and no sequence
//! starts a new run inside another's zone. The zone is as long as the sequence already is
//! (at least `min`), so a sequence of `L` positions has about `log2(L / min)` runs and
//! growing one by one needs no further jump for as long as it has held so far. When no
//! stretch has that room the zones shrink to `min`, then to a fair share of the free cells
//! (free cells over sequences holding cells, when that is less), then the sequence's own to
//! nothing (a contiguous stretch of exactly what is needed outside the others' zones), then
//! the others' too, and last the cells are taken first fit, as before: a
//! reservation is refused only when the free cells are too few, whatever the placement.
//! Zones are advisory: a sequence growing in place never enters another's zone (a zone
//! starts right after its owner's last cell, which is held), and zones cost no capacity.

use super::{KvCells, Run, SeqId};

/// How [`KvCells::reserve`] picks cells for a sequence that cannot grow in place.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Placement {
    /// The lowest free cells.
    #[default]
    FirstFit,
    /// A free stretch with room to grow, zones of at least `min` cells (module docs).
    Blocks { min: usize },
}

impl Placement {
    /// The engine's placement: blocks of at least 16 cells.
    pub const SERVER: Placement = Placement::Blocks { min: 16 };
}

/// A zone: the free cells `start..end` after a sequence's last cell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Zone {
    seq: SeqId,
    /// The owner's length (positions held), which sizes the zone at each level.
    len: usize,
    start: usize,
}

/// How long a zone is, for a sequence of some length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rule {
    /// As long as the sequence, at least the minimum.
    Len,
    /// This many cells.
    Fixed(usize),
}

impl Rule {
    fn len(self, min: usize, len: usize) -> usize {
        match self {
            Rule::Len => len.max(min),
            Rule::Fixed(k) => k,
        }
    }
}

/// The ladder, from most room to least: per level, the zone a jumping sequence asks for
/// after what it needs now and the zone it leaves every other sequence. `fair` is the free
/// cells' share per sequence holding cells (the zones of a nearly full arena), at most
/// `min`.
fn ladder(min: usize, fair: usize) -> [(Rule, Rule); 5] {
    let f = fair.min(min);
    [
        (Rule::Len, Rule::Len),
        (Rule::Fixed(min), Rule::Fixed(min)),
        (Rule::Fixed(f), Rule::Fixed(f)),
        (Rule::Fixed(0), Rule::Fixed(f)),
        (Rule::Fixed(0), Rule::Fixed(0)),
    ]
}

impl KvCells {
    /// The zones of every sequence whose last cell is followed by a free cell.
    fn zones(&self) -> Vec<Zone> {
        let mut z: Vec<Zone> = (self.seqs.iter())
            .filter_map(|(&seq, runs)| {
                let last = runs.last()?;
                let start = last.cell + last.len;
                (start < self.n_cells() && self.owners[start] == 0).then(|| Zone {
                    seq,
                    len: runs.iter().map(|r| r.len).sum(),
                    start,
                })
            })
            .collect();
        z.sort_by_key(|z| z.start);
        z
    }

    /// The lowest start `c` of `want` free cells `c..c + want` that meet no zone but
    /// `seq`'s own (zones sized by `others`), if any. One pass: the candidate only moves up.
    fn find_room(
        &self,
        zones: &[Zone],
        seq: SeqId,
        want: usize,
        min: usize,
        others: Rule,
    ) -> Option<usize> {
        let n = self.n_cells();
        // The other sequences' zones as sorted, merged cell ranges.
        let mut blocked: Vec<(usize, usize)> = Vec::with_capacity(zones.len());
        for z in zones.iter().filter(|z| z.seq != seq) {
            let end = (z.start + others.len(min, z.len)).min(n);
            match blocked.last_mut() {
                Some(last) if z.start <= last.1 => last.1 = last.1.max(end),
                _ if end > z.start => blocked.push((z.start, end)),
                _ => {}
            }
        }
        // `c` is the candidate; `x` the next cell to look at (every cell below it from `c`
        // on is free), so each cell is looked at once.
        let (mut c, mut x, mut bi) = (0, 0, 0);
        loop {
            while bi < blocked.len() && blocked[bi].1 <= c {
                bi += 1;
            }
            let limit = match blocked.get(bi) {
                Some(&(s, e)) if s <= c => {
                    c = e;
                    continue;
                }
                Some(&(s, _)) => s,
                None => n,
            };
            if c + want > limit {
                // Not before the next zone: past it, or nowhere.
                c = blocked.get(bi)?.1;
                continue;
            }
            x = x.max(c);
            while x < c + want && self.owners[x] == 0 {
                x += 1;
            }
            if x == c + want {
                return Some(c);
            }
            c = x + 1;
        }
    }

    /// Phase 2 of `reserve` under [`Placement::Blocks`]: each request's missing cells, as
    /// one contiguous stretch where the ladder finds one, else first fit. Validated: there
    /// are enough free cells.
    pub(super) fn place_blocks(
        &mut self,
        min: usize,
        out: &mut [Vec<usize>],
        reqs: &[(SeqId, usize, usize)],
    ) {
        // What phase 1 grew in place is the sequences' already: zones follow it.
        for (cells, &(seq, pos0, _)) in out.iter().zip(reqs) {
            self.push_cells(seq, pos0, cells);
        }
        let mut zones = self.zones();
        let holders = self.seqs.values().filter(|r| !r.is_empty()).count();
        let ladder = ladder(min, self.n_free / holders.max(1));
        let mut cursor = 0;
        for (cells, &(seq, pos0, n)) in out.iter_mut().zip(reqs) {
            let (have, need) = (cells.len(), n - cells.len());
            if need == 0 {
                continue;
            }
            let len: usize = self.seqs[&seq].iter().map(|r| r.len).sum();
            let room = ladder.iter().find_map(|&(own, others)| {
                let want = need + own.len(min, len + need);
                self.find_room(&zones, seq, want, min, others)
            });
            match room {
                Some(start) => {
                    for cell in start..start + need {
                        self.take(cell, pos0 + cells.len());
                        cells.push(cell);
                    }
                }
                None => {
                    while cells.len() < n {
                        let cell = self.take_lowest_free(&mut cursor, pos0 + cells.len());
                        cells.push(cell);
                    }
                }
            }
            self.push_cells(seq, pos0 + have, &cells[have..]);
            // The sequence's zone is now after its new last cell.
            zones.retain(|z| z.seq != seq);
            let runs = &self.seqs[&seq];
            if let Some(last) = runs.last() {
                let start = last.cell + last.len;
                if start < self.n_cells() && self.owners[start] == 0 {
                    let len = runs.iter().map(|r| r.len).sum();
                    let at = zones.partition_point(|z| z.start < start);
                    zones.insert(at, Zone { seq, len, start });
                }
            }
        }
    }

    /// Appends the cells reserved for positions `pos0..` to the sequence's runs.
    pub(super) fn push_cells(&mut self, seq: SeqId, pos0: usize, cells: &[usize]) {
        let runs = self.seqs.get_mut(&seq).expect("validated");
        for (k, &cell) in cells.iter().enumerate() {
            super::push_run(
                runs,
                Run {
                    cell,
                    len: 1,
                    pos: pos0 + k,
                },
            );
        }
    }
}
