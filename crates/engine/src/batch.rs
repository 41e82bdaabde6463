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
//! 4. runs the graph and hands back each entry's logits.
//!
//! A row's result never depends on what else shares the forward (docs/PRECISION.md, batch
//! invariance): kernels choose their arithmetic per row, never per forward.

use crate::engine::{Engine, Error, Result};
use crate::kvcells::{KvCells, SeqId};
use crate::model::{bucket, BatchEntry, BatchLogits};
use minfer_graph::{sched, InputKind, RowClass, RowClasses, WindowLayout, KV_MAP_RUNS};

/// Everything a forward's inputs need, computed before anything changes.
struct Staged {
    cells: KvCells,
    ids: Vec<i32>,
    pos: Vec<i32>,
    kv_cells: Vec<i32>,
    windows: Vec<Vec<(usize, usize)>>,
    /// Row (in the batch) of each output, in entry order.
    out_rows: Vec<usize>,
    /// Each row's class.
    classes: Vec<RowClass>,
}

fn entry_err(entry: usize, e: impl Into<Error>) -> Error {
    Error::Entry {
        entry,
        source: Box::new(e.into()),
    }
}

impl Engine {
    /// Runs `entries` as one forward (see the module docs). Entries longer than
    /// [`Engine::n_batch`] in all are refused; the generation loop chunks prompts.
    pub fn forward_batch(&mut self, entries: &[BatchEntry]) -> Result<&BatchLogits> {
        let mut staged = self.stage(entries)?;
        if staged.windows.iter().any(|w| w.len() > KV_MAP_RUNS) {
            // Too fragmented for the map: compact, then stage again on the new layout.
            self.defrag()?;
            staged = self.stage(entries)?;
            if let Some(w) = staged.windows.iter().find(|w| w.len() > KV_MAP_RUNS) {
                return Err(Error::BadRequest(format!(
                    "a sequence needs {} runs of KV cells even after defragmenting (the map \
                     holds {KV_MAP_RUNS})",
                    w.len()
                )));
            }
        }
        let cells = std::mem::replace(&mut staged.cells, KvCells::new(0));
        let before = std::mem::replace(&mut self.cells, cells);
        match self.run_staged(entries, staged) {
            Ok(()) => Ok(&self.out),
            Err(e) => {
                // The forward failed: the cells it reserved hold nothing valid.
                self.cells = before;
                Err(e)
            }
        }
    }

    fn stage(&self, entries: &[BatchEntry]) -> Result<Staged> {
        if entries.is_empty() {
            return Err(Error::BadRequest("an empty batch".into()));
        }
        let vocab = self.hp.vocab_size;
        let mut cells = self.cells.clone();
        let mut total = 0;
        for (i, e) in entries.iter().enumerate() {
            let nt = e.tokens.len();
            if nt == 0 || e.logits > nt {
                return Err(entry_err(
                    i,
                    Error::BadRequest(format!(
                        "{nt} tokens, logits for {}: need 1 token and at most one logit row per token",
                        e.logits
                    )),
                ));
            }
            if entries[..i].iter().any(|o| o.seq == e.seq) {
                return Err(entry_err(
                    i,
                    Error::BadRequest(format!("sequence {} appears twice in the batch", e.seq)),
                ));
            }
            let n_past = cells.next_pos(e.seq).map_err(|c| entry_err(i, c))?;
            if e.pos0 > n_past {
                return Err(entry_err(
                    i,
                    Error::PositionGap {
                        pos0: e.pos0,
                        n_past,
                    },
                ));
            }
            if e.pos0 + nt > self.n_ctx {
                return Err(entry_err(
                    i,
                    Error::ContextOverflow {
                        pos0: e.pos0,
                        n_tokens: nt,
                        n_ctx: self.n_ctx,
                    },
                ));
            }
            if let Some((index, &id)) = e
                .tokens
                .iter()
                .enumerate()
                .find(|(_, &t)| t as usize >= vocab)
            {
                return Err(entry_err(i, Error::TokenOutOfRange { id, index, vocab }));
            }
            total += nt;
        }
        if total > self.n_batch {
            return Err(Error::BadRequest(format!(
                "the batch holds {total} tokens, more than n_batch {}",
                self.n_batch
            )));
        }
        for (i, e) in entries.iter().enumerate() {
            if e.pos0 < cells.next_pos(e.seq).map_err(|c| entry_err(i, c))? {
                cells.truncate(e.seq, e.pos0).map_err(|c| entry_err(i, c))?;
            }
        }
        let reqs: Vec<(SeqId, usize, usize)> = entries
            .iter()
            .map(|e| (e.seq, e.pos0, e.tokens.len()))
            .collect();
        let needed: usize = reqs.iter().map(|r| r.2).sum();
        let free = cells.n_free();
        if needed > free {
            return Err(Error::ArenaFull {
                needed,
                free,
                n_cells: cells.n_cells(),
            });
        }
        let reserved = cells.reserve(&reqs)?;
        let mut staged = Staged {
            ids: Vec::with_capacity(total),
            pos: Vec::with_capacity(total),
            kv_cells: Vec::with_capacity(total),
            windows: Vec::with_capacity(total),
            out_rows: Vec::new(),
            classes: Vec::with_capacity(total),
            cells: KvCells::new(0),
        };
        for (e, new_cells) in entries.iter().zip(&reserved) {
            let row0 = staged.ids.len();
            for (j, (&t, &c)) in e.tokens.iter().zip(new_cells).enumerate() {
                let p = e.pos0 + j;
                staged.ids.push(t as i32);
                staged.pos.push(p as i32);
                staged.kv_cells.push(c as i32);
                staged.windows.push(cells.window(e.seq, p)?);
            }
            let nt = e.tokens.len();
            staged.out_rows.extend(row0 + nt - e.logits..row0 + nt);
            staged.classes.extend(std::iter::repeat_n(e.class, nt));
        }
        staged.cells = cells;
        Ok(staged)
    }

    fn run_staged(&mut self, entries: &[BatchEntry], s: Staged) -> Result<()> {
        let nt = s.ids.len();
        // A backend whose arithmetic depends on the row count runs the exact shape.
        let round = |n: usize| if self.bucketed { bucket(n) } else { n };
        let n_tok = round(nt);
        let n_real_out = s.out_rows.len();
        let n_out = round(n_real_out.max(1)).min(n_tok);
        let window = if s.windows.iter().all(|w| w.len() <= 1) {
            WindowLayout::Span
        } else {
            WindowLayout::KvMap
        };
        let mut params = self.params(n_tok, n_out, window);
        params.prompt_rows = s.classes.contains(&RowClass::Prompt);
        self.prepare(&params)?;
        let scratch = self.n_ctx as i32;
        let Staged {
            mut ids,
            mut pos,
            kv_cells: mut kvc,
            windows,
            out_rows,
            classes,
            ..
        } = s;
        ids.resize(n_tok, 0);
        pos.resize(n_tok, 0);
        kvc.resize(n_tok, scratch);
        let win: Vec<i32> = match window {
            WindowLayout::Span => {
                let mut w = Vec::with_capacity(2 * n_tok);
                for runs in &windows {
                    let (c, len) = runs.first().copied().unwrap_or((0, 0));
                    w.extend([c as i32, (c + len) as i32]);
                }
                for _ in nt..n_tok {
                    w.extend([scratch, scratch + 1]);
                }
                w
            }
            WindowLayout::KvMap => {
                let width = 2 * KV_MAP_RUNS;
                let mut w = vec![0i32; width * n_tok];
                for (r, runs) in windows.iter().enumerate() {
                    for (k, &(c, len)) in runs.iter().enumerate() {
                        w[r * width + 2 * k] = c as i32;
                        w[r * width + 2 * k + 1] = len as i32;
                    }
                }
                for r in nt..n_tok {
                    w[r * width] = scratch;
                    w[r * width + 1] = 1;
                }
                w
            }
        };
        // With a tail, the graph gathers the output rows; without one (n_out == n_tok) every
        // row gets logits and the real ones are picked below.
        // A forward with no logit row still computes one output row (ignored).
        let tail: Option<Vec<i32>> = (n_out < n_tok).then(|| {
            let mut t: Vec<i32> = out_rows.iter().map(|&r| r as i32).collect();
            t.resize(n_out, (nt - 1) as i32);
            t
        });
        if self.trace.is_some() {
            // Captures of an earlier, failed forward belong to no phase.
            for b in &mut self.backends {
                b.take_captures()?;
            }
        }
        let weights = crate::weights::ModelWeights {
            model: &self.model,
            ids: &self.ids,
        };
        let (graph, plan) = self
            .cache
            .most_recent()
            .ok_or_else(|| Error::BadRequest("no graph built".into()))?;
        let be = &mut self.backends;
        sched::fill_input(graph, plan, be, InputKind::TokenIds, &ids)?;
        sched::fill_input(graph, plan, be, InputKind::Positions, &pos)?;
        sched::fill_input(graph, plan, be, InputKind::KvCells, &kvc)?;
        let win_kind = match window {
            WindowLayout::Span => InputKind::AttnSpan,
            WindowLayout::KvMap => InputKind::KvMap,
        };
        sched::fill_input(graph, plan, be, win_kind, &win)?;
        if let Some(t) = &tail {
            sched::fill_input(graph, plan, be, InputKind::TailIds, t)?;
        }
        // Padding rows take the class of the last real row (one run more would cost a
        // launch; a padding row's result is never read).
        let last = classes[nt - 1];
        let mut rows = RowClasses {
            tokens: classes,
            outputs: Vec::new(),
        };
        rows.tokens.resize(n_tok, last);
        rows.outputs = match &tail {
            Some(t) => t.iter().map(|&r| rows.tokens[r as usize]).collect(),
            None => rows.tokens.clone(),
        };
        sched::execute(graph, plan, be, &weights, &rows)?;
        // The output buffer is reused from the last forward; the real rows are compacted to
        // its front in place (with a tail they are already there).
        let mut data = self.out.take_buffer();
        sched::read_output(graph, plan, be, &mut data)?;
        let vocab = self.hp.vocab_size;
        if tail.is_none() {
            // Output rows ascend, so each one moves down (or stays): in place is safe.
            for (k, &r) in out_rows.iter().enumerate() {
                if r != k {
                    data.copy_within(r * vocab..(r + 1) * vocab, k * vocab);
                }
            }
        }
        data.truncate(n_real_out * vocab);
        let mut rows = Vec::with_capacity(entries.len());
        let mut at = 0;
        for e in entries {
            rows.push((at, e.logits));
            at += e.logits;
        }
        self.out = BatchLogits::from_rows(data, rows, vocab);
        if self.trace.is_some() {
            let shape = crate::trace::ForwardShape {
                tokens: entries
                    .iter()
                    .flat_map(|e| e.tokens.iter().copied())
                    .collect(),
                graph_tokens: n_tok,
                graph_out: n_out,
            };
            self.trace_forward(shape)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::bucket;

    #[test]
    fn buckets_round_up_and_are_few() {
        for n in 1..=2048 {
            let b = bucket(n);
            assert!(b >= n, "{n} -> {b}");
            assert_eq!(bucket(b), b, "a bucket is its own bucket");
            if n > 64 {
                assert!((b - n) * 4 <= n, "{n} -> {b} wastes too much");
            } else {
                assert!(2 * b <= 3 * n, "{n} -> {b} wastes too much");
            }
        }
        let distinct: std::collections::BTreeSet<usize> = (1..=512).map(bucket).collect();
        assert_eq!(distinct.len(), 26);
    }
}
