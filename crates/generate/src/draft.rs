//! Model drafters (issue 31): a draft model (`--draft MODEL`) or the target's own first
//! blocks (`--self-draft LAYERS`) proposes the tokens after a sequence's pending one, and the
//! target verifies them in one forward exactly as it verifies prompt lookup's
//! ([`crate::speculative`]): greedy output is plain decoding's token for token, sampled
//! output is distributed as plain sampling's.
//!
//! The draft engine is a [`LogitsModel`] of its own (own graphs, own KV), shared by the
//! requests that draft with it through a [`DraftHandle`]. It keeps the tokens its KV holds;
//! before each proposal it keeps the longest common prefix of those and the sequence's
//! history and truncates the rest (`seq_truncate`: what a rejected draft left behind, or
//! another sequence's tokens), feeds the history's remaining tokens in one entry, then
//! decodes one token per forward:
//! - greedy (the target's temperature ≤ 0): the draft's argmax, its q one-hot;
//! - sampled: a draw from q, the draft's softmax at the target's temperature cut to its
//!   [`Q_TOP`] most likely tokens and renormalised (any q is exact under the acceptance
//!   rule; the cut keeps each q small), drawn from the sequence's own draft RNG (seeded
//!   from the request's seed, so a seeded run repeats).
//!
//! It stops at `draft_max` tokens, or before a token whose draft probability is under
//! `p_min`; a proposal shorter than `draft_min` is dropped (and counts as a miss). The length adapts as prompt
//! lookup's does (doubling while every draft holds, the accepted run + 1 otherwise), and
//! after three forwards with nothing accepted the sequence stops drafting for a pause that
//! doubles each time it recurs (8, 16, … 256 forwards): a draft that is always rejected
//! costs a few draft forwards in hundreds, within noise of plain decoding.
//!
//! The draft sees the sequence's history of this generation (a chat turn's prompt and reply,
//! not the turns before it), at positions from 0: only its proposals depend on it.

use crate::lookup::SpecStats;
use crate::sampler::Rng;
use minfer_engine::{BatchEntry, LogitsModel, SeqId};
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

/// A draft engine behind the handle: proposes up to `max` tokens after `history` (prompt
/// and tokens so far; its last token is the sequence's pending one).
pub trait DraftModel: Send {
    /// `n_prompt`: how many of `history` are the prompt (prompt rows; the rest were sampled).
    fn propose(
        &mut self,
        history: &[u32],
        n_prompt: usize,
        max: usize,
        how: DraftHow,
        rng: &mut Rng,
    ) -> Result<Proposal, String>;
}

/// A draft engine and the drafter's settings, shared by the requests that draft with it
/// (run, chat: one sequence at a time).
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
}

/// A [`LogitsModel`] (an engine) as a draft: its default sequence holds `fed`.
pub struct EngineDraft<M: LogitsModel> {
    model: M,
    seq: SeqId,
    /// The tokens the draft's KV holds, by position.
    fed: Vec<u32>,
    /// Draft forwards run (the cost side of the figures).
    pub forwards: usize,
    /// Ids the draft reads (its vocabulary) and may propose (the target's): a history with
    /// an id the draft lacks gets no proposal, and a proposal stops before an id the target
    /// lacks (the vocabulary check allows sizes 128 apart).
    draft_vocab: usize,
    target_vocab: usize,
}

impl<M: LogitsModel> EngineDraft<M> {
    pub fn new(model: M) -> EngineDraft<M> {
        let seq = model.default_seq();
        EngineDraft {
            model,
            seq,
            fed: Vec::new(),
            forwards: 0,
            draft_vocab: usize::MAX,
            target_vocab: usize::MAX,
        }
    }

    /// Bounds the ids read and proposed (see the fields).
    pub fn with_vocab(mut self, draft: usize, target: usize) -> EngineDraft<M> {
        self.draft_vocab = draft;
        self.target_vocab = target;
        self
    }

    /// The tokens the draft's KV holds (the gates read it).
    pub fn fed(&self) -> &[u32] {
        &self.fed
    }

    /// Feeds `tokens` after `fed`, the last row's logits. Rows at positions below
    /// `n_prompt` are prompt rows, the rest generation rows, as the target computed them
    /// (ADR 0011's row classes), so a draft that is the target itself proposes exactly the
    /// target's picks. Chunks of the model's batch.
    fn feed(&mut self, tokens: &[u32], n_prompt: usize) -> Result<Vec<f32>, String> {
        let chunk = self.model.max_batch().max(1);
        let split = n_prompt.saturating_sub(self.fed.len()).min(tokens.len());
        let (prompt, generated) = tokens.split_at(split);
        let mut parts: Vec<(&[u32], bool)> = prompt.chunks(chunk).map(|c| (c, true)).collect();
        parts.extend(generated.chunks(chunk).map(|c| (c, false)));
        let mut out = Vec::new();
        let n_parts = parts.len();
        for (n, (part, is_prompt)) in parts.into_iter().enumerate() {
            let last = n + 1 == n_parts;
            let pos0 = self.fed.len();
            let entry = if is_prompt {
                BatchEntry::prompt(self.seq, part, pos0, usize::from(last))
            } else {
                BatchEntry::generated(self.seq, part, pos0)
            };
            self.forwards += 1;
            let res = match self.model.forward_batch(std::slice::from_ref(&entry)) {
                Ok(l) => {
                    if last {
                        let rows = l.logits(0);
                        out = rows[rows.len() - l.vocab()..].to_vec();
                    }
                    Ok(())
                }
                Err(e) => Err(format!("draft model forward failed: {e}")),
            };
            if let Err(e) = res {
                // Whatever the failed forward wrote is not known to be whole: start over.
                let _ = self.model.seq_truncate(self.seq, 0);
                self.fed.clear();
                return Err(e);
            }
            self.fed.extend_from_slice(part);
        }
        Ok(out)
    }
}

impl<M: LogitsModel + Send> DraftModel for EngineDraft<M> {
    fn propose(
        &mut self,
        history: &[u32],
        n_prompt: usize,
        max: usize,
        how: DraftHow,
        rng: &mut Rng,
    ) -> Result<Proposal, String> {
        // The history and every draft but the last are fed: they must fit the draft's context.
        let max = max.min((self.model.context_len() + 1).saturating_sub(history.len()));
        let mut p = Proposal::default();
        if max == 0 || history.is_empty() {
            return Ok(p);
        }
        // Keep what the KV shares with the history (at least the last token is fed again:
        // its row gives the first draft).
        let common = self
            .fed
            .iter()
            .zip(history)
            .take_while(|(a, b)| a == b)
            .count()
            .min(history.len() - 1);
        if history[common..]
            .iter()
            .any(|&t| t as usize >= self.draft_vocab)
        {
            return Ok(p);
        }
        if common < self.fed.len() {
            self.model
                .seq_truncate(self.seq, common)
                .map_err(|e| format!("draft model KV truncate failed: {e}"))?;
            self.fed.truncate(common);
        }
        let mut logits = self.feed(&history[common..], n_prompt)?;
        loop {
            let (tok, top, q) = pick(&logits, how, rng)?;
            if top < how.p_min || tok as usize >= self.target_vocab {
                break;
            }
            p.tokens.push(tok);
            if let Some(q) = q {
                p.q.push(q);
            }
            if p.tokens.len() == max {
                break;
            }
            logits = self.feed(&[tok], 0)?;
        }
        Ok(p)
    }
}

/// The draft's token for a row: (token, the draft's top probability, q when sampled).
#[allow(clippy::type_complexity)]
fn pick(
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

/// Forwards a sequence drafts nothing after three misses in a row, at first; it doubles
/// each time the misses recur, up to [`PAUSE_MAX`].
const PAUSE: usize = 8;
const PAUSE_MAX: usize = 256;

/// A sequence's model drafter: the shared engine, the adaptive length, its RNG and the last
/// proposal's q (read by verification).
pub(crate) struct SeqDraft {
    handle: DraftHandle,
    rng: Rng,
    how: DraftHow,
    k: usize,
    misses: usize,
    pause: usize,
    next_pause: usize,
    /// The q of each draft of the forward being verified (empty: greedy).
    pub(crate) q: Vec<Vec<(u32, f64)>>,
    pub(crate) stats: SpecStats,
}

impl SeqDraft {
    pub(crate) fn new(handle: DraftHandle, temperature: f32, seed: u64) -> SeqDraft {
        let how = DraftHow {
            temperature,
            p_min: handle.cfg.p_min,
        };
        SeqDraft {
            k: (handle.cfg.draft_max.clamp(1, 4))
                .max(handle.cfg.draft_min)
                .min(handle.cfg.draft_max.max(1)),
            handle,
            // Its own stream: the target's draws are not moved by the draft's.
            rng: Rng::new(seed ^ 0xD4AF_7000_0000_0031),
            how,
            misses: 0,
            pause: 0,
            next_pause: PAUSE,
            q: Vec::new(),
            stats: SpecStats::default(),
        }
    }

    /// At most how many drafts the next forward verifies (the KV budget's bound; the model
    /// is not run).
    pub(crate) fn bound(&self, limit: usize) -> usize {
        if self.pause > 0 {
            0
        } else {
            self.k.min(limit)
        }
    }

    /// Runs the draft for the row after `history`: at most `limit` tokens, maybe none.
    pub(crate) fn draft(
        &mut self,
        history: &[u32],
        n_prompt: usize,
        limit: usize,
    ) -> Result<Vec<u32>, String> {
        self.q.clear();
        let want = self.bound(limit);
        if want == 0 || want < self.handle.cfg.draft_min {
            return Ok(Vec::new());
        }
        let p = self
            .handle
            .model
            .lock()
            .map_err(|_| "the draft model's lock is poisoned".to_string())?
            .propose(history, n_prompt, want, self.how, &mut self.rng)?;
        if p.tokens.len() < self.handle.cfg.draft_min.max(1) {
            // The draft ran and had nothing sure enough (p-min) or long enough: a miss, so
            // a draft that is never confident pauses as a rejected one does.
            self.miss();
            return Ok(Vec::new());
        }
        self.q = p.q;
        Ok(p.tokens)
    }

    /// A forward whose draft gained nothing; the third in a row starts a pause.
    fn miss(&mut self) {
        self.misses += 1;
        if self.misses >= 3 {
            self.misses = 0;
            self.pause = self.next_pause;
            self.next_pause = (self.next_pause * 2).min(PAUSE_MAX);
        }
    }

    /// Counts a forward: `drafted` verified, `accepted` of them held.
    pub(crate) fn update(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            self.pause = self.pause.saturating_sub(1);
            return;
        }
        self.stats.drafted += drafted;
        self.stats.accepted += accepted;
        self.stats.verify_forwards += 1;
        let (max, min) = (self.handle.cfg.draft_max.max(1), self.handle.cfg.draft_min);
        if accepted == drafted {
            self.k = (self.k * 2).min(max);
            self.misses = 0;
            self.next_pause = PAUSE;
        } else {
            self.k = (accepted + 1).max(min).min(max);
            if accepted == 0 {
                self.miss();
            } else {
                self.misses = 0;
                self.next_pause = PAUSE;
            }
        }
    }
}

#[path = "draft_vocab.rs"]
mod vocab;
pub use vocab::check_vocab;

#[cfg(test)]
#[path = "draft_tests.rs"]
mod tests;
