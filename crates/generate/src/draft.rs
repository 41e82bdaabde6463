//! Model drafters (issue 31): a draft model (`--draft MODEL`) or the target's own first
//! blocks (`--self-draft LAYERS`) proposes the tokens after a sequence's pending one, and the
//! target verifies them in one forward exactly as it verifies prompt lookup's
//! ([`crate::speculative`]): greedy output is plain decoding's token for token, sampled
//! output is distributed as plain sampling's.
//!
//! The draft engine is an engine of its own (own graphs, own KV; [`EngineDraft`]), shared by
//! the requests that draft with it through a [`DraftHandle`]. Each drafting sequence holds
//! a sequence of the draft's own ([`DraftSeq`], opened at its first proposal, closed when the
//! sequence is dropped) and the tokens its KV holds; before each proposal it keeps the
//! longest common prefix of those and the sequence's history and truncates the rest
//! (`seq_truncate`: what a rejected draft left behind), feeds the history's remaining tokens,
//! then decodes one token per forward, the forwards batched across every sequence asking the
//! same engine in one step ([`propose_all`]):
//! - greedy (the target's temperature ≤ 0): the draft's argmax, its q one-hot;
//! - sampled: a draw from q, the draft's softmax at the target's temperature cut to its
//!   [`Q_TOP`] most likely tokens and renormalised (any q is exact under the acceptance
//!   rule; the cut keeps each q small), drawn from the sequence's own draft RNG (seeded
//!   from the request's seed, so a seeded run repeats).
//!
//! It stops at `draft_max` tokens, or before a token whose draft probability is under
//! `p_min`; a proposal shorter than `draft_min` is dropped (and counts as a miss). The
//! length adapts as prompt lookup's does ([`crate::adaptive`]: doubling while every draft
//! holds, the accepted run + 1 otherwise), and after three forwards with nothing accepted
//! the sequence stops drafting for a pause that doubles each time it recurs (8, 16, … 256
//! forwards): a draft that is always rejected costs a few draft forwards in hundreds,
//! within noise of plain decoding.
//!
//! The draft sees the sequence's history of this generation (a chat turn's prompt and reply,
//! not the turns before it), at positions from 0: only its proposals depend on it.

use crate::adaptive::{Adaptive, MODEL_PAUSE_MAX};
use crate::lookup::SpecStats;
use crate::sampler::Rng;
use std::sync::{Arc, Mutex};

/// The drafter's settings (`--draft-max`, `--draft-min`, `--draft-p-min`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DraftConfig {
    /// Most tokens drafted for one forward.
    pub draft_max: usize,
    /// A proposal shorter than this is not verified (0: any).
    pub draft_min: usize,
    /// The draft stops before a token it gives less than this probability.
    pub p_min: f32,
}

impl Default for DraftConfig {
    fn default() -> Self {
        DraftConfig {
            draft_max: 8,
            draft_min: 0,
            p_min: 0.75,
        }
    }
}

/// Most entries of a sampled draft's q.
pub const Q_TOP: usize = 32;

/// What a draft engine proposed: tokens, and each one's q (empty: greedy, q one-hot).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Proposal {
    pub tokens: Vec<u32>,
    pub q: Vec<Vec<(u32, f64)>>,
}

/// How a proposal is drawn.
#[derive(Clone, Copy, Debug)]
pub struct DraftHow {
    /// The target's temperature: ≤ 0 greedy.
    pub temperature: f32,
    pub p_min: f32,
}

/// A sequence of the draft engine's own, opened for one target sequence (its KV cells) and
/// closed when that sequence ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DraftSeq(pub usize);

/// One sequence's part of a batched proposal: up to `max` tokens after `history` (prompt
/// and tokens so far; its last token is the sequence's pending one), the first `n_prompt`
/// of which are the prompt (prompt rows; the rest were sampled).
pub struct Ask<'a> {
    pub seq: DraftSeq,
    pub history: &'a [u32],
    pub n_prompt: usize,
    pub max: usize,
    pub how: DraftHow,
    pub rng: &'a mut Rng,
}

/// A draft engine behind the handle.
pub trait DraftModel: Send {
    /// A sequence for one target sequence; refused when the engine holds no more.
    fn open(&mut self) -> Result<DraftSeq, String>;
    /// Frees a sequence [`DraftModel::open`] gave, and its KV cells.
    fn close(&mut self, seq: DraftSeq);
    /// Proposes for every ask at once, the draft's forwards batched across them: one result
    /// per ask, in order (an error fails that ask's sequence).
    fn propose(&mut self, asks: &mut [Ask<'_>]) -> Vec<Result<Proposal, String>>;
    /// Sequences open now (a server's leak check).
    fn open_seqs(&self) -> usize;
    /// Draft forwards run so far (the cost side of the figures).
    fn forwards(&self) -> usize;
}

/// A draft engine and the drafter's settings, shared by the requests that draft with it.
#[derive(Clone)]
pub struct DraftHandle {
    model: Arc<Mutex<dyn DraftModel>>,
    pub cfg: DraftConfig,
}

impl std::fmt::Debug for DraftHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DraftHandle")
            .field("cfg", &self.cfg)
            .finish()
    }
}

impl DraftHandle {
    pub fn new(model: impl DraftModel + 'static, cfg: DraftConfig) -> DraftHandle {
        DraftHandle {
            model: Arc::new(Mutex::new(model)),
            cfg,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, dyn DraftModel + 'static> {
        // A panic inside a proposal leaves nothing half-written that the next one trusts:
        // a sequence's KV list is only extended after its forward returned.
        self.model.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Draft sequences open now: one per running sequence that drafted (a finished,
    /// cancelled or disconnected one has closed its own).
    pub fn open_seqs(&self) -> usize {
        self.lock().open_seqs()
    }

    /// Draft forwards run so far.
    pub fn forwards(&self) -> usize {
        self.lock().forwards()
    }

    fn same(&self, other: &DraftHandle) -> bool {
        Arc::ptr_eq(&self.model, &other.model)
    }
}

/// The draft's token for a row: (token, the draft's top probability, q when sampled).
#[allow(clippy::type_complexity)]
pub(crate) fn pick(
    logits: &[f32],
    how: DraftHow,
    rng: &mut Rng,
) -> Result<(u32, f32, Option<Vec<(u32, f64)>>), String> {
    if logits.is_empty() || logits.iter().any(|l| l.is_nan()) {
        return Err("the draft model's logits are empty or NaN".into());
    }
    let t = if how.temperature > 0.0 {
        how.temperature as f64
    } else {
        1.0
    };
    // Softmax at `t` (1 for greedy's confidence), by the max logit for stability.
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    let keep = Q_TOP.min(order.len());
    let by = |a: &u32, b: &u32| {
        logits[*b as usize]
            .total_cmp(&logits[*a as usize])
            .then(a.cmp(b))
    };
    order.select_nth_unstable_by(keep - 1, by);
    order.truncate(keep);
    order.sort_unstable_by(by);
    let sum: f64 = logits.iter().map(|&l| ((l as f64 - max) / t).exp()).sum();
    let top = (1.0 / sum) as f32; // the best token's probability
    if how.temperature <= 0.0 {
        return Ok((order[0], top, None));
    }
    let w: Vec<f64> = order
        .iter()
        .map(|&id| ((logits[id as usize] as f64 - max) / t).exp())
        .collect();
    let mass: f64 = w.iter().sum();
    let q: Vec<(u32, f64)> = order
        .iter()
        .zip(&w)
        .map(|(&id, &x)| (id, x / mass))
        .collect();
    let r = rng.next_f64();
    let mut cum = 0.0;
    let mut tok = q[q.len() - 1].0;
    for &(id, pi) in &q {
        cum += pi;
        if r < cum {
            tok = id;
            break;
        }
    }
    Ok((tok, top, Some(q)))
}

/// A sequence's model drafter: the shared engine and its own sequence there (opened at its
/// first proposal, closed when the drafter is dropped: the sequence finished, failed or was
/// cancelled), the adaptive length (a pause that doubles: each draft costs a draft forward),
/// its RNG and the last proposal's q (read by verification).
pub(crate) struct SeqDraft {
    handle: DraftHandle,
    seq: Option<DraftSeq>,
    rng: Rng,
    how: DraftHow,
    adapt: Adaptive,
    /// The q of each draft of the forward being verified (empty: greedy).
    pub(crate) q: Vec<Vec<(u32, f64)>>,
}

impl SeqDraft {
    pub(crate) fn new(handle: DraftHandle, temperature: f32, seed: u64) -> SeqDraft {
        let how = DraftHow {
            temperature,
            p_min: handle.cfg.p_min,
        };
        SeqDraft {
            adapt: Adaptive::new(handle.cfg.draft_max, handle.cfg.draft_min, MODEL_PAUSE_MAX),
            handle,
            seq: None,
            // Its own stream: the target's draws are not moved by the draft's.
            rng: Rng::new(seed ^ 0xD4AF_7000_0000_0031),
            how,
            q: Vec::new(),
        }
    }

    pub(crate) fn stats(&self) -> SpecStats {
        self.adapt.stats
    }

    /// At most how many drafts the next forward verifies (the KV budget's bound; the model
    /// is not run).
    pub(crate) fn bound(&self, limit: usize) -> usize {
        self.adapt.want(limit)
    }

    /// How many tokens to ask the draft engine for this forward (0: none, the engine is not
    /// run).
    pub(crate) fn want(&mut self, limit: usize) -> usize {
        self.q.clear();
        let want = self.adapt.want(limit);
        if want < self.handle.cfg.draft_min {
            0
        } else {
            want
        }
    }

    /// Takes the engine's proposal: the drafts to verify, maybe none.
    fn take(&mut self, p: Result<Proposal, String>) -> Result<Vec<u32>, String> {
        let p = p?;
        if p.tokens.len() < self.handle.cfg.draft_min.max(1) {
            // The draft ran and had nothing sure enough (p-min) or long enough: a miss, so
            // a draft that is never confident pauses as a rejected one does.
            self.adapt.miss();
            return Ok(Vec::new());
        }
        self.q = p.q;
        Ok(p.tokens)
    }

    /// Counts a forward: `drafted` verified, `accepted` of them held.
    pub(crate) fn update(&mut self, drafted: usize, accepted: usize) {
        self.adapt.update(drafted, accepted);
    }
}

impl Drop for SeqDraft {
    fn drop(&mut self) {
        if let Some(s) = self.seq.take() {
            self.handle.lock().close(s);
        }
    }
}

/// A sequence that asks its draft model for `want` tokens this forward; `result` is what
/// [`propose_all`] leaves: the drafts to verify, or the failure that fails the sequence.
pub(crate) struct DraftJob<'a> {
    pub(crate) draft: &'a mut SeqDraft,
    pub(crate) history: &'a [u32],
    pub(crate) n_prompt: usize,
    pub(crate) want: usize,
    pub(crate) result: Result<Vec<u32>, String>,
}

/// Runs the proposals of every job, one batched proposal per draft engine (the sequences
/// that share an engine share its forwards: one per drafted position, not one per sequence
/// and position).
pub(crate) fn propose_all(jobs: &mut [DraftJob<'_>]) {
    let mut done = vec![false; jobs.len()];
    for first in 0..jobs.len() {
        if done[first] {
            continue;
        }
        let handle = jobs[first].draft.handle.clone();
        let group: Vec<usize> = (first..jobs.len())
            .filter(|&j| !done[j] && jobs[j].draft.handle.same(&handle))
            .collect();
        let mut model = handle.lock();
        // Each sequence's own draft sequence, opened at its first proposal.
        let mut asked = Vec::new();
        for &j in &group {
            done[j] = true;
            let job = &mut jobs[j];
            if job.draft.seq.is_none() {
                match model.open() {
                    Ok(s) => job.draft.seq = Some(s),
                    Err(e) => {
                        job.result = Err(e);
                        continue;
                    }
                }
            }
            asked.push(j);
        }
        let mut asks: Vec<Ask<'_>> = Vec::with_capacity(asked.len());
        let mut idx = asked.iter().peekable();
        for (j, job) in jobs.iter_mut().enumerate() {
            if idx.peek() != Some(&&j) {
                continue;
            }
            idx.next();
            let d = &mut *job.draft;
            asks.push(Ask {
                seq: d.seq.expect("opened above"),
                history: job.history,
                n_prompt: job.n_prompt,
                max: job.want,
                how: d.how,
                rng: &mut d.rng,
            });
        }
        let results = model.propose(&mut asks);
        drop(asks);
        drop(model);
        for (&j, r) in asked.iter().zip(results) {
            let job = &mut jobs[j];
            job.result = job.draft.take(r);
        }
    }
}

#[path = "draft_vocab.rs"]
mod vocab;
pub use vocab::check_vocab;

#[path = "draft_engine.rs"]
mod engine;
pub use engine::EngineDraft;

#[cfg(test)]
#[path = "draft_tests.rs"]
mod tests;
