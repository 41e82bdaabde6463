//! Batched forwards: entries of several sequences become one forward.
//!
//! An entry is `(sequence, tokens, first position, how many of its last rows need logits)`.
//! [`Engine::forward_batch`]:
//! 1. checks every entry (a known sequence, once per batch; `pos0` at most its length; tokens
//!    in the vocabulary; positions inside the context) and reserves the new cells of all of
//!    them at once on a copy of the cell table; any refusal is a typed error naming the entry
//!    and leaves the cache as it was;
//! 2. derives each query's attention window from the cells' positions (one run: a span; up
//!    to [`KV_MAP_RUNS`] runs: a kv map, the graph's layout then being the map); a sequence
//!    that would need more runs is defragmented first (cells moved verbatim, which changes no
//!    result: a row's attention depends on the values its window lists, not on their cells);
//! 3. rounds the token and output counts up a small ladder ([`bucket`]) so a changing batch
//!    reuses a handful of graphs; padding rows use token 0 at position 0, write the scratch
//!    cell past the context and attend only to it, so they never reach a real row;
//! 4. runs the graph and hands back each entry's logits. A failed run (or a fault a test
//!    armed, [`crate::faults`]) puts the cell table back as it was before step 1.
//!
//! A row's result never depends on what else shares the forward (docs/PRECISION.md, batch
//! invariance): kernels choose their arithmetic per row, never per forward.

use crate::engine::{Engine, Error, Result};
use crate::model::{BatchEntry, BatchLogits};
use minfer_graph::KV_MAP_RUNS;

impl Engine {
    /// Runs `entries` as one forward (see the module docs). Entries longer than
    /// [`Engine::n_batch`] in all are refused; the generation loop chunks prompts.
    pub fn forward_batch(&mut self, entries: &[BatchEntry]) -> Result<&BatchLogits> {
        let (vocab, n_batch) = (self.runner.hp().vocab_size, self.n_batch);
        let mut staged = self.kv.stage(entries, vocab, n_batch)?;
        if staged.runs_over(KV_MAP_RUNS).is_some() {
            // Too fragmented for the map: undo, compact, then stage again on the new layout.
            self.kv.roll_back(staged.undo);
            self.defrag()?;
            staged = self.kv.stage(entries, vocab, n_batch)?;
            if let Some(runs) = staged.runs_over(KV_MAP_RUNS) {
                self.kv.roll_back(staged.undo);
                return Err(Error::BadRequest(format!(
                    "a sequence needs {runs} runs of KV cells even after defragmenting (the map \
                     holds {KV_MAP_RUNS})"
                )));
            }
        }
        if let Err(e) = self.runner.forward(staged.input) {
            self.kv.roll_back(staged.undo);
            return Err(e);
        }
        if let Err(e) = self.strike_faults(entries) {
            self.kv.roll_back(staged.undo);
            return Err(e);
        }
        Ok(self.runner.out())
    }
}
