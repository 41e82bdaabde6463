//! The KV cache as the engine's second owner: the cell table of every sequence, the staging
//! of a batch onto it, and the capacity (ADR 0012, step 4).
//!
//! Staging checks every entry of a batch (a known sequence, once per batch; `pos0` at most its
//! length; tokens in the vocabulary; positions inside the context) and reserves the new cells
//! of all of them at once on a copy of the table; any refusal is a typed error naming the
//! entry and leaves the cache as it was. Staging works on the live table under a checkpoint
//! of the batch's sequences (`kvcells::undo`: no copy of the table per forward), which puts
//! it back on a refusal or a failed forward ([`KvCache::roll_back`]). Each row's attention window comes from the cells' positions.
//! Which backend calls a cell operation needs is the engine's (`kv.rs`); this module only
//! decides cells.

use crate::error::{Error, Result};
use crate::kvcells::{Checkpoint, KvCells, Placement, SeqId};
use crate::model::{BatchEntry, ForwardInput};

/// A batch staged on the live table (its cells reserved) and its forward's rows; `undo`
/// puts the table back if the forward fails.
pub(crate) struct Staged {
    pub undo: Checkpoint,
    pub input: ForwardInput,
}

impl Staged {
    /// The runs of cells of the first row whose window needs more than `limit`.
    pub fn runs_over(&self, limit: usize) -> Option<usize> {
        self.input
            .windows
            .iter()
            .map(|w| w.len())
            .find(|&n| n > limit)
    }
}

/// How full the KV cache is: what a scheduler asks before it admits work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvBudget {
    /// Cells of the arena (the context: one sequence can hold at most this many positions).
    pub n_cells: usize,
    /// Cells no sequence holds.
    pub free: usize,
}

/// The cell table, the default sequence and what the table has been through.
pub(crate) struct KvCache {
    cells: KvCells,
    /// The sequence of the one-sequence API (`Engine::decode`, `kv_*`, sessions of one).
    default_seq: SeqId,
    /// Defragmentations run so far (by a forward or `Engine::defrag`).
    defrags: usize,
    n_ctx: usize,
}

fn entry_err(entry: usize, e: impl Into<Error>) -> Error {
    Error::Entry {
        entry,
        source: Box::new(e.into()),
    }
}

impl KvCache {
    pub(crate) fn new(n_ctx: usize) -> KvCache {
        // Blocks keep a sequence's window a few runs while many grow together (no defrag).
        let mut cells = KvCells::with_placement(n_ctx, Placement::SERVER);
        let default_seq = cells.create();
        KvCache {
            cells,
            default_seq,
            defrags: 0,
            n_ctx,
        }
    }

    pub(crate) fn cells(&self) -> &KvCells {
        &self.cells
    }

    /// The table, for changes that move no stored row (create, release, clear, truncate,
    /// remove, share): the ones that do are decided on a copy and swapped in with
    /// [`KvCache::replace_cells`] once the backends have moved the rows.
    pub(crate) fn cells_mut(&mut self) -> &mut KvCells {
        &mut self.cells
    }

    /// Makes `cells` the table and hands back the one it replaces.
    pub(crate) fn replace_cells(&mut self, cells: KvCells) -> KvCells {
        std::mem::replace(&mut self.cells, cells)
    }

    pub(crate) fn default_seq(&self) -> SeqId {
        self.default_seq
    }

    pub(crate) fn defrags(&self) -> usize {
        self.defrags
    }

    pub(crate) fn count_defrag(&mut self) {
        self.defrags += 1;
    }

    /// The one place that knows the capacity.
    pub(crate) fn budget(&self) -> KvBudget {
        KvBudget {
            n_cells: self.cells.n_cells(),
            free: self.cells.n_free(),
        }
    }

    /// The forward of a staged batch failed: the cells it reserved hold nothing valid, and
    /// the cells it truncated are the sequences' again (their rows were never overwritten).
    pub(crate) fn roll_back(&mut self, undo: Checkpoint) {
        self.cells.restore(undo);
    }

    /// Checks every entry and reserves the cells of all of them at once on a copy of the
    /// table (module docs); the live table is untouched until [`KvCache::commit`].
    pub(crate) fn stage(
        &mut self,
        entries: &[BatchEntry],
        vocab: usize,
        n_batch: usize,
    ) -> Result<Staged> {
        let undo = self.cells.checkpoint(entries.iter().map(|e| e.seq));
        match stage_on(&mut self.cells, self.n_ctx, entries, vocab, n_batch) {
            Ok(input) => Ok(Staged { undo, input }),
            Err(e) => {
                self.cells.restore(undo);
                Err(e)
            }
        }
    }
}

/// Staging on the live table (its caller restores it on an error).
fn stage_on(
    cells: &mut KvCells,
    n_ctx: usize,
    entries: &[BatchEntry],
    vocab: usize,
    n_batch: usize,
) -> Result<ForwardInput> {
    if entries.is_empty() {
        return Err(Error::BadRequest("an empty batch".into()));
    }
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
        if e.pos0 + nt > n_ctx {
            return Err(entry_err(
                i,
                Error::ContextOverflow {
                    pos0: e.pos0,
                    n_tokens: nt,
                    n_ctx,
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
    if total > n_batch {
        return Err(Error::BadRequest(format!(
            "the batch holds {total} tokens, more than n_batch {}",
            n_batch
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
    let mut input = ForwardInput {
        tokens: Vec::with_capacity(total),
        positions: Vec::with_capacity(total),
        kv_cells: Vec::with_capacity(total),
        windows: Vec::with_capacity(total),
        out_rows: Vec::new(),
        classes: Vec::with_capacity(total),
        entry_logits: entries.iter().map(|e| e.logits).collect(),
    };
    for (e, new_cells) in entries.iter().zip(&reserved) {
        let row0 = input.tokens.len();
        for (j, (&t, &c)) in e.tokens.iter().zip(new_cells).enumerate() {
            let p = e.pos0 + j;
            input.tokens.push(t as i32);
            input.positions.push(p as i32);
            input.kv_cells.push(c as i32);
            input.windows.push(cells.window(e.seq, p)?);
        }
        let nt = e.tokens.len();
        input.out_rows.extend(row0 + nt - e.logits..row0 + nt);
        input.classes.extend(std::iter::repeat_n(e.class, nt));
    }
    Ok(input)
}
