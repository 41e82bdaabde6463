//! What the scheduler needs of the engine beyond its forwards: sequences and their cells.
//!
//! A trait rather than the engine itself so that the scheduler can be driven over a model that
//! wraps the engine (the server's fault injection) and tested over a fake without a model.

use minfer_engine::{Engine, LogitsModel, SeqId};

/// A model whose sequences the scheduler creates, shares prefixes between and releases.
pub trait SeqHost: LogitsModel {
    /// A new, empty sequence.
    fn seq_create(&mut self) -> SeqId;
    /// Forgets a sequence the scheduler created (its unshared cells become free).
    fn seq_release(&mut self, seq: SeqId);
    /// `dst` takes `src`'s positions `0..n` by sharing its cells in place; false when the
    /// KV refused (nothing shared then).
    fn seq_share_prefix(&mut self, dst: SeqId, src: SeqId, n: usize) -> bool;
    /// How many leading positions of `src` a new sequence may share and still have its window
    /// mapped by a forward (see `Engine::shareable_prefix`).
    fn shareable_prefix(&self, src: SeqId) -> usize;
    /// KV cells no sequence holds: the one capacity answer (`Engine::kv_budget`).
    fn free_cells(&self) -> usize;
}

impl SeqHost for Engine {
    fn seq_create(&mut self) -> SeqId {
        Engine::seq_create(self)
    }
    fn seq_release(&mut self, seq: SeqId) {
        // Only sequences the scheduler created are released: a refusal would be its bug.
        let _ = Engine::seq_release(self, seq);
    }
    fn seq_share_prefix(&mut self, dst: SeqId, src: SeqId, n: usize) -> bool {
        Engine::seq_share_prefix(self, dst, src, n).is_ok()
    }
    fn shareable_prefix(&self, src: SeqId) -> usize {
        Engine::shareable_prefix(self, src)
    }
    fn free_cells(&self) -> usize {
        self.kv_budget().free
    }
}

/// A plain model as a host for sequences the caller [`start`](super::Scheduler::start)s
/// itself (`generate`, `run`, `chat`): the scheduler never creates, shares or releases one
/// of those, and with no capacity known it leaves the KV's own refusal (an arena that is
/// full) to the forward, as a caller driving the model directly would see it.
pub(crate) struct Direct<'a, M>(pub &'a mut M);

impl<M: LogitsModel> LogitsModel for Direct<'_, M> {
    type Error = M::Error;
    fn forward_batch(
        &mut self,
        entries: &[minfer_engine::BatchEntry],
    ) -> Result<&minfer_engine::BatchLogits, M::Error> {
        self.0.forward_batch(entries)
    }
    fn context_len(&self) -> usize {
        self.0.context_len()
    }
    fn max_batch(&self) -> usize {
        self.0.max_batch()
    }
    fn default_seq(&self) -> SeqId {
        self.0.default_seq()
    }
    fn seq_truncate(&mut self, seq: SeqId, len: usize) -> Result<(), M::Error> {
        self.0.seq_truncate(seq, len)
    }
    fn failed_entry(error: &M::Error) -> Option<usize> {
        M::failed_entry(error)
    }
}

impl<M: LogitsModel> SeqHost for Direct<'_, M> {
    fn seq_create(&mut self) -> SeqId {
        unreachable!("a direct scheduler is never submitted a job, only started sequences")
    }
    fn seq_release(&mut self, _: SeqId) {}
    fn seq_share_prefix(&mut self, _: SeqId, _: SeqId, _: usize) -> bool {
        false
    }
    fn shareable_prefix(&self, _: SeqId) -> usize {
        0
    }
    fn free_cells(&self) -> usize {
        usize::MAX
    }
}
