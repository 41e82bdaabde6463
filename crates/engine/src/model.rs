//! What every layer above the engine shares: the batch types a forward takes and gives back,
//! and the model as a generation loop sees it ([`LogitsModel`], [`TokenBytes`]).
//!
//! They live at the bottom so the engine can implement the model trait and the generation
//! crate can drive it without either importing the other's internals (ADR 0012, step 3a).

use crate::kvcells::SeqId;
use minfer_graph::RowClass;

/// One sequence's part of a batch.
#[derive(Clone, Copy, Debug)]
pub struct BatchEntry<'a> {
    pub seq: SeqId,
    pub tokens: &'a [u32],
    /// Position of `tokens[0]`; below the sequence's length, the tail is dropped first.
    pub pos0: usize,
    /// How many of the entry's last rows get logits (0: none, a prefill chunk).
    pub logits: usize,
    /// Whether the tokens are the sequence's prompt or tokens it generated (its phase: a
    /// backend may compute the two classes differently, docs/PRECISION.md "Row classes").
    pub class: RowClass,
}

impl<'a> BatchEntry<'a> {
    /// A prompt chunk whose last row gets logits.
    pub fn new(seq: SeqId, tokens: &'a [u32], pos0: usize) -> Self {
        BatchEntry::prompt(seq, tokens, pos0, 1)
    }

    /// A chunk of the sequence's prompt, its last `logits` rows getting logits.
    pub fn prompt(seq: SeqId, tokens: &'a [u32], pos0: usize, logits: usize) -> Self {
        BatchEntry {
            seq,
            tokens,
            pos0,
            logits,
            class: RowClass::Prompt,
        }
    }

    /// Tokens the engine generated (sampled, or drafted and being verified), each row
    /// getting logits.
    pub fn generated(seq: SeqId, tokens: &'a [u32], pos0: usize) -> Self {
        BatchEntry {
            seq,
            tokens,
            pos0,
            logits: tokens.len(),
            class: RowClass::Generation,
        }
    }
}

/// The logits of one forward, per entry.
#[derive(Clone, Debug, Default)]
pub struct BatchLogits {
    data: Vec<f32>,
    /// Per entry: first row in `data` and number of rows.
    rows: Vec<(usize, usize)>,
    vocab: usize,
}

impl BatchLogits {
    /// Logits of `rows` = per entry (first row in `data`, rows), `vocab` floats a row.
    pub fn from_rows(data: Vec<f32>, rows: Vec<(usize, usize)>, vocab: usize) -> Self {
        BatchLogits { data, rows, vocab }
    }

    /// Entry `i`'s logits: its last `logits` rows, `vocab` floats each.
    pub fn logits(&self, i: usize) -> &[f32] {
        let (r0, n) = self.rows.get(i).copied().unwrap_or((0, 0));
        &self.data[r0 * self.vocab..(r0 + n) * self.vocab]
    }
    pub fn n_entries(&self) -> usize {
        self.rows.len()
    }
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// Sets every second logit of entry `i` to NaN (an armed fault's NaN logits).
    pub(crate) fn poison_entry(&mut self, i: usize) {
        let (r0, n) = self.rows.get(i).copied().unwrap_or((0, 0));
        for l in self.data[r0 * self.vocab..(r0 + n) * self.vocab]
            .iter_mut()
            .step_by(2)
        {
            *l = f32::NAN;
        }
    }

    /// The float buffer, left empty here, for the next forward to refill (no reallocation).
    pub(crate) fn take_buffer(&mut self) -> Vec<f32> {
        std::mem::take(&mut self.data)
    }
}

/// The bucket a token or output count is rounded up to: every count up to 8, then 12, 16,
/// 24, 32, 48, 64, multiples of 16 up to 128, of 32 up to 256, of 64 up to 512, then of
/// 128. Decode batches (a handful of rows) waste nothing; past 64 rows the padding stays
/// under a quarter of the rows (under half up to 64), and 1..=512 rows need 26 graphs.
pub fn bucket(n: usize) -> usize {
    match n {
        0..=8 => n.max(1),
        9..=12 => 12,
        13..=16 => 16,
        17..=24 => 24,
        25..=32 => 32,
        33..=48 => 48,
        49..=64 => 64,
        65..=128 => n.div_ceil(16) * 16,
        129..=256 => n.div_ceil(32) * 32,
        257..=512 => n.div_ceil(64) * 64,
        _ => n.div_ceil(128) * 128,
    }
}

/// A model as the loop sees it.
pub trait LogitsModel {
    type Error: std::error::Error + Send + Sync + 'static;
    /// One forward: each entry appends its tokens to its sequence at `pos0..`; the logits of
    /// each entry's last `logits` rows come back in entry order.
    fn forward_batch(&mut self, entries: &[BatchEntry]) -> Result<&BatchLogits, Self::Error>;
    /// Most positions a sequence may hold.
    fn context_len(&self) -> usize;
    /// Most tokens one forward takes.
    fn max_batch(&self) -> usize;
    /// The sequence a one-sequence generation uses.
    fn default_seq(&self) -> SeqId;
    /// Keeps the sequence's positions below `len` (drafted rows that were not accepted).
    fn seq_truncate(&mut self, seq: SeqId, len: usize) -> Result<(), Self::Error>;
    /// The entry (index into the forward's entries) a failed forward's error names, when it
    /// names one: the loop then fails only that sequence and reruns the others without it.
    fn failed_entry(_error: &Self::Error) -> Option<usize> {
        None
    }
}

/// Token id → the bytes it stands for.
pub trait TokenBytes {
    fn token_bytes(&self, id: u32) -> Vec<u8>;
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

/// One forward's rows, computed by the KV cache before anything changes.
#[derive(Debug, Default)]
pub(crate) struct ForwardInput {
    pub tokens: Vec<i32>,
    pub positions: Vec<i32>,
    /// The cell each row's K and V are written to.
    pub kv_cells: Vec<i32>,
    /// Each row's attention window: runs of (first cell, length).
    pub windows: Vec<Vec<(usize, usize)>>,
    /// Row (in the batch) of each output, in entry order.
    pub out_rows: Vec<usize>,
    /// Each row's class.
    pub classes: Vec<RowClass>,
    /// How many logit rows each entry gets, in entry order.
    pub entry_logits: Vec<usize>,
}
