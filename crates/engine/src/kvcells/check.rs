//! The consistency checker: the cell table and the runs describe the same ownership.

use super::{KvCells, Run, SeqId, MAX_POS};

impl KvCells {
    /// Checks the table's invariants (tests call it after every operation): the owner
    /// counts and positions of the cell table agree with every sequence's runs; runs are
    /// non-empty, inside the table, in strictly increasing position order, merged where
    /// they can be, and never hold one cell twice (two positions in one cell); shared
    /// cells hold the same position for all owners; the free count is right; every id is
    /// below the next one `create` hands out. `Err` describes the first violation.
    pub fn check(&self) -> Result<(), String> {
        let n = self.n_cells();
        if self.pos.len() != n {
            return Err(format!(
                "{} owner counts but {} positions",
                n,
                self.pos.len()
            ));
        }
        let free = self.owners.iter().filter(|&&o| o == 0).count();
        if free != self.n_free {
            return Err(format!(
                "n_free is {} but {free} cells have no owner",
                self.n_free
            ));
        }
        let mut count = vec![0u32; n];
        // The last sequence seen holding each cell: sequences are checked one at a time,
        // so seeing the current one again means it holds the cell twice.
        let mut seen_by: Vec<Option<SeqId>> = vec![None; n];
        for (&id, runs) in &self.seqs {
            if u64::from(id.0) >= self.next_id {
                return Err(format!(
                    "sequence {id} is not below the next id {}",
                    self.next_id
                ));
            }
            let mut prev: Option<Run> = None;
            for (i, r) in runs.iter().enumerate() {
                if r.len == 0 {
                    return Err(format!("sequence {id}: run {i} is empty"));
                }
                if r.cell.checked_add(r.len).is_none_or(|end| end > n) {
                    return Err(format!(
                        "sequence {id}: run {i} {r:?} is outside the {n} cells"
                    ));
                }
                if r.pos
                    .checked_add(r.len - 1)
                    .is_none_or(|last| last > MAX_POS)
                {
                    return Err(format!(
                        "sequence {id}: run {i} {r:?} passes position {MAX_POS}"
                    ));
                }
                if let Some(p) = prev {
                    if r.pos < p.end_pos() {
                        return Err(format!(
                            "sequence {id}: run {i} {r:?} does not start past run {} {p:?}",
                            i - 1
                        ));
                    }
                    if r.pos == p.end_pos() && r.cell == p.cell + p.len {
                        return Err(format!(
                            "sequence {id}: runs {} {p:?} and {i} {r:?} are not merged",
                            i - 1
                        ));
                    }
                }
                for (cell, pos) in r.cells().zip(r.pos..) {
                    if seen_by[cell] == Some(id) {
                        return Err(format!(
                            "sequence {id} holds cell {cell} twice (again at position {pos})"
                        ));
                    }
                    seen_by[cell] = Some(id);
                    count[cell] += 1;
                    if self.owners[cell] == 0 {
                        return Err(format!(
                            "cell {cell} is free, yet sequence {id} holds position {pos} there"
                        ));
                    }
                    if self.pos[cell] != pos {
                        return Err(format!(
                            "cell {cell} holds position {}, yet sequence {id} holds position \
                             {pos} there",
                            self.pos[cell]
                        ));
                    }
                }
                prev = Some(*r);
            }
        }
        for (cell, (&owners, &held)) in self.owners.iter().zip(&count).enumerate() {
            if owners != held {
                return Err(format!(
                    "cell {cell} has {owners} owners in the table but {held} sequences hold it"
                ));
            }
        }
        Ok(())
    }
}
