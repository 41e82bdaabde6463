//! Faults the serving tests inject (`crates/server/tests/faults.rs`, `serving.rs`): the
//! model as the batcher sees it, and the faults the loop arms on the engine for marked
//! requests. Nothing sets one in normal use: an empty list and a zero counter, checked
//! once per forward and once per admitted choice.

use minfer_engine::{BatchEntry, BatchLogits, Engine, InjectedFault, LogitsModel, SeqId};
use minfer_generate::chat::Pieces;
use minfer_generate::sched::SeqHost;
use minfer_generate::TokenBytes;
use minfer_tokenizer::Tokenizer;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// A fault for the requests whose prompt text contains `prompt_contains`: armed on the
/// engine for each of their choices once it has sampled `after_tokens` tokens (0: from its
/// first forward on), and striking every forward that holds it from then on.
#[derive(Clone, Debug)]
pub struct MarkedFault {
    pub prompt_contains: String,
    pub after_tokens: usize,
    pub fault: InjectedFault,
}

/// Faults tests inject.
#[derive(Default, Debug)]
pub struct Faults {
    /// The next `fail_forwards` forwards fail before the engine sees them (an error that
    /// names no request).
    pub fail_forwards: AtomicUsize,
    /// Faults for marked requests, matched when a request is admitted.
    pub marked: Mutex<Vec<MarkedFault>>,
}

impl Faults {
    /// The fault of a prompt, if a marked fault names it.
    fn for_prompt(&self, tok: &Tokenizer, prompt: &[u32]) -> Option<MarkedFault> {
        let marked = self.marked.lock().unwrap_or_else(|p| p.into_inner());
        if marked.is_empty() {
            return None;
        }
        let pieces = Pieces(tok);
        let bytes: Vec<u8> = prompt.iter().flat_map(|&t| pieces.token_bytes(t)).collect();
        let text = String::from_utf8_lossy(&bytes);
        marked
            .iter()
            .find(|m| text.contains(&m.prompt_contains))
            .cloned()
    }
}

/// Marked sequences whose fault is not armed on the engine yet.
#[derive(Default)]
pub(super) struct PendingFaults {
    seqs: Vec<(SeqId, MarkedFault)>,
}

impl PendingFaults {
    /// Notes a newly admitted sequence if its prompt is marked.
    pub(super) fn admit(&mut self, faults: &Faults, tok: &Tokenizer, seq: SeqId, prompt: &[u32]) {
        if let Some(m) = faults.for_prompt(tok, prompt) {
            self.seqs.push((seq, m));
        }
    }

    /// Arms the faults that are due: `sampled(seq)` is the tokens the sequence has sampled,
    /// None once it is no longer running (its fault is dropped). Returns whether one was
    /// armed (it strikes in the next forward).
    pub(super) fn arm_due(
        &mut self,
        engine: &mut Engine,
        sampled: impl Fn(SeqId) -> Option<usize>,
    ) -> bool {
        let mut armed = false;
        self.seqs.retain(|(seq, m)| match sampled(*seq) {
            None => false,
            Some(n) if n >= m.after_tokens => {
                engine.inject_fault(*seq, m.fault);
                armed = true;
                false
            }
            Some(_) => true,
        });
        armed
    }
}

/// The engine as the batcher sees it, with the injected forward failures.
pub(super) struct Model<'a> {
    pub(super) engine: &'a mut Engine,
    pub(super) faults: &'a Faults,
    /// Time spent inside the engine's forwards (the loop's profile).
    pub(super) in_forward: std::time::Duration,
}

impl LogitsModel for Model<'_> {
    type Error = minfer_engine::Error;
    fn forward_batch(&mut self, entries: &[BatchEntry]) -> Result<&BatchLogits, Self::Error> {
        let f = &self.faults.fail_forwards;
        if f.load(Ordering::Relaxed) > 0 {
            f.fetch_sub(1, Ordering::Relaxed);
            return Err(minfer_engine::Error::Injected(
                "the forward failed before the engine ran it".into(),
            ));
        }
        let t = std::time::Instant::now();
        let out = self.engine.forward_batch(entries);
        self.in_forward += t.elapsed();
        out
    }
    fn context_len(&self) -> usize {
        self.engine.n_ctx()
    }
    fn max_batch(&self) -> usize {
        self.engine.n_batch()
    }
    fn default_seq(&self) -> SeqId {
        self.engine.default_seq()
    }
    fn seq_truncate(&mut self, seq: SeqId, len: usize) -> Result<(), Self::Error> {
        self.engine.seq_truncate(seq, len)
    }
    fn failed_entry(error: &Self::Error) -> Option<usize> {
        Engine::failed_entry(error)
    }
}

impl SeqHost for Model<'_> {
    fn seq_create(&mut self) -> SeqId {
        SeqHost::seq_create(self.engine)
    }
    fn seq_release(&mut self, seq: SeqId) {
        SeqHost::seq_release(self.engine, seq)
    }
    fn seq_share_prefix(&mut self, dst: SeqId, src: SeqId, n: usize) -> bool {
        SeqHost::seq_share_prefix(self.engine, dst, src, n)
    }
    fn shareable_prefix(&self, src: SeqId) -> usize {
        self.engine.shareable_prefix(src)
    }
    fn free_cells(&self) -> usize {
        SeqHost::free_cells(self.engine)
    }
}
