//! Undoing a batch's staging without copying the table.
//!
//! Staging a batch only ever truncates and then reserves for the sequences in the batch
//! (`remove` and `reserve` change the runs of the sequence they are given and the owner
//! counts of its cells, nothing else). So a [`Checkpoint`] of those sequences' runs is enough
//! to put the table back: drop the references the sequences hold now, take back the ones
//! they held. A cell freed by one of them and handed to another in the same batch is dropped
//! by the second and taken by the first; a cell shared with a sequence outside the batch was
//! never free, so nothing else can have taken it. Free cells keep position 0 (see `unref`),
//! so the restored table equals the one checkpointed, field for field.
//!
//! This replaces a clone of the whole table per forward (two vectors of `n_ctx` entries): the
//! checkpoint costs the runs of a batch's sequences, a handful each.

use super::{KvCells, Run, SeqId};

/// The runs of some sequences, as they were.
#[derive(Debug)]
pub struct Checkpoint {
    seqs: Vec<(SeqId, Vec<Run>)>,
}

impl KvCells {
    /// Saves the runs of `seqs` (unknown ones are skipped: staging refuses them before it
    /// changes anything; duplicates are saved once).
    pub fn checkpoint(&self, seqs: impl IntoIterator<Item = SeqId>) -> Checkpoint {
        let mut saved: Vec<(SeqId, Vec<Run>)> = Vec::new();
        for seq in seqs {
            if saved.iter().any(|(s, _)| *s == seq) {
                continue;
            }
            if let Some(runs) = self.seqs.get(&seq) {
                saved.push((seq, runs.clone()));
            }
        }
        Checkpoint { seqs: saved }
    }

    /// Puts the checkpointed sequences back as they were, with the owner counts and
    /// positions of their cells. Only valid when nothing but `remove`/`truncate` and
    /// `reserve` on those sequences ran since the checkpoint (what staging does).
    pub fn restore(&mut self, cp: Checkpoint) {
        // Every current reference first, then every saved one: a cell moved between two
        // checkpointed sequences is released before it is taken back.
        for (seq, _) in &cp.seqs {
            let now = self
                .seqs
                .get_mut(seq)
                .map(std::mem::take)
                .unwrap_or_default();
            for run in now {
                for cell in run.cells() {
                    self.unref(cell);
                }
            }
        }
        for (seq, runs) in cp.seqs {
            for run in &runs {
                for (k, cell) in run.cells().enumerate() {
                    self.reref(cell, run.pos + k);
                }
            }
            self.seqs.insert(seq, runs);
        }
    }

    /// One more owner of `cell`, which holds position `pos`.
    fn reref(&mut self, cell: usize, pos: usize) {
        if self.owners[cell] == 0 {
            self.n_free -= 1;
        }
        self.owners[cell] += 1;
        self.pos[cell] = pos;
    }
}

#[cfg(test)]
mod tests {
    use super::super::sim::{Fault, Rng, Sim};
    use super::*;

    /// What staging does to a table: for 1..=3 distinct sequences (sometimes an unknown
    /// one), maybe truncate each, then one all-or-nothing reserve at their next positions.
    fn stage_like(cells: &mut KvCells, rng: &mut Rng) -> Vec<SeqId> {
        let known = cells.seqs();
        let mut batch: Vec<SeqId> = Vec::new();
        for _ in 0..1 + rng.below(3) {
            let seq = if rng.chance(5) || known.is_empty() {
                SeqId(9_999)
            } else {
                known[rng.below(known.len())]
            };
            if !batch.contains(&seq) {
                batch.push(seq);
            }
        }
        for &seq in &batch {
            if let Ok(next) = cells.next_pos(seq) {
                if next > 0 && rng.chance(40) {
                    cells.truncate(seq, rng.below(next)).unwrap();
                }
            }
        }
        let reqs: Vec<(SeqId, usize, usize)> = batch
            .iter()
            .map(|&s| (s, cells.next_pos(s).unwrap_or(0), rng.below(6)))
            .collect();
        let _ = cells.reserve(&reqs);
        batch
    }

    /// Random tables (the simulator's operation mix: shared prefixes, copies, shifts,
    /// defrags), then a staging-like change and a restore: the table equals the clone taken
    /// before, and passes its own checker. Controls (each failed the test, then was
    /// reverted): restoring the saved runs without taking their cells back (no `reref`), and
    /// taking them back without first dropping the current references (no `unref`).
    #[test]
    fn restore_gives_back_the_table_staging_changed() {
        let (mut changed, mut shared) = (0, 0);
        for seed in 0..3000 {
            let mut sim = Sim::run(seed, 40, Fault::None).unwrap_or_else(|e| panic!("{e}"));
            let mut rng = Rng::new(seed ^ 0x5eed);
            let before = sim.cells.clone();
            let batch = stage_like(&mut sim.cells, &mut rng);
            if sim.cells != before {
                changed += 1;
            }
            if batch.iter().any(|&s| {
                before
                    .runs(s)
                    .is_ok_and(|runs| runs.iter().any(|r| r.cells().any(|c| before.owners[c] > 1)))
            }) {
                shared += 1;
            }
            let cp = before.checkpoint(batch.iter().copied());
            sim.cells.restore(cp);
            assert_eq!(sim.cells, before, "seed {seed}: batch {batch:?}");
            sim.cells
                .check()
                .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        }
        // The cases that matter ran: most stagings changed the table, and many touched
        // cells shared with another sequence.
        assert!(
            changed > 1500,
            "{changed} of 3000 stagings changed the table"
        );
        assert!(shared > 200, "{shared} stagings touched shared cells");
    }
}
