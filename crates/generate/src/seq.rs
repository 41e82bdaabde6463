//! One sequence's generation state: its prompt and how much of it the KV holds, the sampler
//! chain, penalty window, stop matcher, UTF-8-safe text hold and log probabilities.

use crate::constrain::ConstraintState;
use crate::draft::SeqDraft;
use crate::lookup::Lookup;
use crate::sampler::{log_softmax, Mirostat, Sampler, SamplerError};
use crate::stop::StopMatcher;
use crate::{FinishReason, GenerateError, GenerateOutput, GenerateRequest, Timings, TokenBytes};
use minfer_engine::SeqId;
use std::time::{Duration, Instant};

/// The log probability (natural log, of the raw distribution before bias, penalties and
/// truncation, as OpenAI reports them) of a sampled token, and the most likely alternatives.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct TokenLogprob {
    pub id: u32,
    pub logprob: f32,
    /// The `n` most likely tokens, best first (ties by id).
    pub top: Vec<(u32, f32)>,
}

/// Why a sequence stopped without finishing.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum Failure {
    #[error(transparent)]
    Sampler(#[from] SamplerError),
    /// A forward that held the sequence failed (the message is the model's error).
    #[error("model forward failed: {0}")]
    Forward(String),
}

/// Holds back a trailing incomplete UTF-8 sequence so a stream never splits a character.
#[derive(Default, Debug)]
pub(crate) struct Utf8Hold {
    pending: Vec<u8>,
}

impl Utf8Hold {
    pub(crate) fn push(&mut self, b: &[u8]) -> Vec<u8> {
        self.pending.extend_from_slice(b);
        let cut = complete_prefix_len(&self.pending);
        self.pending.drain(..cut).collect()
    }
    pub(crate) fn finish(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.pending)
    }
}

/// Length of the longest prefix that does not end inside a UTF-8 sequence that could still
/// complete. Invalid bytes are passed through (the caller decides how to show them).
fn complete_prefix_len(b: &[u8]) -> usize {
    let n = b.len();
    for back in 1..=3.min(n) {
        let c = b[n - back];
        if c & 0xC0 == 0x80 {
            continue;
        }
        let need = match c {
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF7 => 4,
            _ => 1,
        };
        return if need > back { n - back } else { n };
    }
    n
}

/// One sequence's generation state.
pub struct SeqGen {
    pub seq: SeqId,
    /// Positions the sequence held before this generation (a conversation's earlier turns):
    /// its prompt starts at this position and the context left is `n_ctx - base`.
    base: usize,
    pub(crate) prompt: Vec<u32>,
    /// Prompt tokens the KV holds (sent to the model, or shared from a cached prefix).
    pub(crate) fed: usize,
    max_tokens: usize,
    eog: Vec<u32>,
    sampler: Sampler,
    stops: StopMatcher,
    utf8: Utf8Hold,
    logprobs: Option<usize>,
    /// The grammar's state (its mask is computed on a worker thread during the forward).
    constraint: Option<ConstraintState>,
    /// Prompt lookup's drafter, when the request speculates.
    pub(crate) lookup: Option<Lookup>,
    /// A draft model's (or self-drafting's) drafter, when the request speculates with one.
    pub(crate) model_draft: Option<SeqDraft>,
    /// Prompt and generated ids (the penalty window reads it).
    pub(crate) history: Vec<u32>,
    /// The last sampled id, to be decoded next.
    pub(crate) pending: Option<u32>,
    pub(crate) done: bool,
    failed: Option<Failure>,
    started: Instant,
    prefilled_at: Option<Instant>,
    pub out: GenerateOutput,
}

/// What a sequence drafts for its next forward ([`SeqGen::plan_drafts`]).
pub(crate) enum Planned {
    /// These drafts (maybe none).
    Ready(Vec<u32>),
    /// Ask the draft model for at most this many.
    Model(usize),
}

/// What one sampled token did.
pub(crate) enum Step {
    /// Text that became final (maybe empty); the sequence goes on.
    Text(Vec<u8>),
    /// The sequence finished; its last text.
    Done(Vec<u8>),
}

impl SeqGen {
    pub fn new<E: std::error::Error>(
        seq: SeqId,
        req: &GenerateRequest,
        n_ctx: usize,
    ) -> Result<SeqGen, GenerateError<E>> {
        SeqGen::resume(seq, 0, req, n_ctx)
    }

    /// A generation that continues a sequence already holding positions `0..base` (their
    /// tokens are not part of `req.prompt` nor of the penalty window): the prompt is fed
    /// from position `base` on, and the context left to it is `n_ctx - base`.
    pub fn resume<E: std::error::Error>(
        seq: SeqId,
        base: usize,
        req: &GenerateRequest,
        n_ctx: usize,
    ) -> Result<SeqGen, GenerateError<E>> {
        let n_ctx = n_ctx.saturating_sub(base);
        if req.prompt.is_empty() {
            return Err(GenerateError::EmptyPrompt);
        }
        if req.prompt.len() > n_ctx {
            return Err(GenerateError::PromptTooLong {
                prompt: req.prompt.len(),
                n_ctx,
            });
        }
        if req.lookup.is_some() && req.draft.is_some() {
            return Err(GenerateError::SpeculativeUnsupported {
                what: "two drafters at once (prompt lookup and a draft model)",
            });
        }
        if req.lookup.is_some() || req.draft.is_some() {
            // Drafts are verified by speculative sampling's rule (crate::speculative), which
            // needs the row's distribution to be a function of the history alone. Mirostat's
            // running μ moves with every draw and is not carried through verification.
            if req.sampler.temperature > 0.0 && req.sampler.mirostat != Mirostat::Off {
                return Err(GenerateError::SpeculativeUnsupported { what: "mirostat" });
            }
        }
        Ok(SeqGen {
            seq,
            base,
            prompt: req.prompt.clone(),
            fed: 0,
            max_tokens: req.max_tokens,
            eog: req.eog.clone(),
            sampler: Sampler::new(req.sampler.clone())?,
            stops: StopMatcher::new(req.stop_strings.iter().map(|s| s.as_bytes())),
            utf8: Utf8Hold::default(),
            logprobs: req.logprobs,
            constraint: req.constraint.as_ref().map(|g| g.start()),
            lookup: req.lookup.map(Lookup::new),
            model_draft: req
                .draft
                .clone()
                .map(|h| SeqDraft::new(h, req.sampler.temperature, req.sampler.seed)),
            history: req.prompt.clone(),
            pending: None,
            done: false,
            failed: None,
            started: Instant::now(),
            prefilled_at: None,
            out: GenerateOutput {
                tokens: Vec::new(),
                text: Vec::new(),
                finish: FinishReason::Length,
                timings: Timings {
                    prompt_tokens: req.prompt.len(),
                    ..Timings::default()
                },
                logprobs: Vec::new(),
                constraint: None,
                speculative: None,
            },
        })
    }

    /// Marks the first `n` prompt tokens as already in the sequence's KV (a cached prefix
    /// shared into it); at least the last prompt token is always fed, since its logits pick
    /// the first reply token. Returns the count taken.
    pub fn skip_cached(&mut self, n: usize) -> usize {
        let n = n.min(self.prompt.len() - 1);
        self.fed = self.fed.max(n);
        self.fed
    }

    /// The position the prompt starts at (0 unless [`SeqGen::resume`]d).
    pub fn base(&self) -> usize {
        self.base
    }

    pub fn prompt(&self) -> &[u32] {
        &self.prompt
    }

    /// Prompt tokens the KV holds so far.
    pub fn prompt_fed(&self) -> usize {
        self.fed
    }

    /// The tokens whose KV the sequence holds, in position order: the prompt as far as it
    /// was fed, then every generated token but the last sampled one (not decoded yet).
    pub fn kv_tokens(&self) -> &[u32] {
        let n = if self.fed < self.prompt.len() {
            self.fed
        } else {
            self.prompt.len() + self.out.tokens.len().saturating_sub(1)
        };
        &self.history[..n]
    }

    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Why the sequence failed, if it did.
    pub fn failure(&self) -> Option<&Failure> {
        self.failed.as_ref()
    }

    pub(crate) fn fail(&mut self, why: Failure) {
        self.failed = Some(why);
        self.done = true;
    }

    /// What the next forward drafts after the pending token, at most `room` (none without a
    /// drafter), bounded so that every row stays inside the context and no more tokens are
    /// sampled than `max_tokens` allows: lookup's drafts, made here, or how many tokens to
    /// ask the draft model for (the Batcher asks every sequence's at once,
    /// [`crate::draft::propose_all`]). Either goes through [`SeqGen::cut_drafts`].
    pub(crate) fn plan_drafts(&mut self, room: usize, n_ctx: usize) -> Planned {
        let limit = room.min(self.draft_limit(n_ctx));
        match (&self.lookup, &mut self.model_draft) {
            (Some(l), _) => Planned::Ready(l.draft(&self.history, limit)),
            (None, Some(m)) => match m.want(limit) {
                0 => Planned::Ready(Vec::new()),
                n => Planned::Model(n),
            },
            (None, None) => Planned::Ready(Vec::new()),
        }
    }

    /// The drafts a forward verifies, of those proposed.
    pub(crate) fn cut_drafts(&self, mut d: Vec<u32>) -> Vec<u32> {
        if let Some(c) = &self.constraint {
            // The grammar constrains the proposals: a draft ends before its first token the
            // matcher (advanced over every committed token) refuses, since verification
            // could never keep it (its probability under the mask is 0). The check leaves
            // the matcher where it was; verification advances it over kept tokens only.
            d.truncate(c.valid_prefix(&d));
        }
        // Nothing follows an end-of-generation token.
        if let Some(i) = d.iter().position(|t| self.eog.contains(t)) {
            d.truncate(i + 1);
        }
        d
    }

    /// At most how many drafts the next forward verifies, without running a draft model:
    /// the KV budget's bound ([`crate::Batcher::decode_rows`]).
    pub(crate) fn draft_bound(&self, n_ctx: usize) -> usize {
        let limit = self.draft_limit(n_ctx);
        match (&self.lookup, &self.model_draft) {
            (Some(l), _) => l.draft(&self.history, limit).len(),
            (None, Some(m)) => m.bound(limit),
            (None, None) => 0,
        }
    }

    /// The drafts the context and `max_tokens` leave room for: the pending token sits at
    /// `pos`, drafts take pos + 1 ..; a forward samples one token more than it drafts.
    fn draft_limit(&self, n_ctx: usize) -> usize {
        let pos = self.base + self.history.len() - 1;
        let ctx_left = n_ctx.saturating_sub(pos + 1);
        let tokens_left = self.max_tokens.saturating_sub(self.out.tokens.len() + 1);
        ctx_left.min(tokens_left)
    }

    /// Counts a forward's verdict with the drafter: `drafted` verified, `accepted` held.
    pub(crate) fn drafts_verified(&mut self, drafted: usize, accepted: usize) {
        if let Some(l) = &mut self.lookup {
            l.update(drafted, accepted);
        }
        if let Some(m) = &mut self.model_draft {
            m.update(drafted, accepted);
        }
    }

    /// Positions the sequence's KV should hold now: everything but the last sampled token.
    pub(crate) fn kv_len(&self) -> usize {
        self.base + self.history.len() - 1
    }

    pub(crate) fn max_tokens_is_zero(&self) -> bool {
        self.max_tokens == 0
    }

    /// Samples from `logits` (the row after the last token fed) and updates the state. With
    /// a `draft` (the `r`th draft of the forward and its token), the row's token is
    /// speculative sampling's verdict on it instead of a plain draw, against the draft's q
    /// (one-hot for lookup's and a greedy draft model's); the bool says whether it held.
    pub(crate) fn accept(
        &mut self,
        logits: &mut [f32],
        draft: Option<(usize, u32)>,
        vocab: &dyn TokenBytes,
        n_ctx: usize,
    ) -> Result<(Step, bool), SamplerError> {
        let mut held = false;
        let step = self.accept_inner(logits, draft, &mut held, vocab, n_ctx)?;
        Ok((step, held))
    }

    fn accept_inner(
        &mut self,
        logits: &mut [f32],
        draft: Option<(usize, u32)>,
        held: &mut bool,
        vocab: &dyn TokenBytes,
        n_ctx: usize,
    ) -> Result<Step, SamplerError> {
        // Raw logits, before any stage: a NaN here is the model's, never a setting's.
        let nan = logits.iter().filter(|l| l.is_nan()).count();
        if nan > 0 {
            return Err(SamplerError::NanLogits {
                nan,
                vocab: logits.len(),
                token: self.out.tokens.len(),
            });
        }
        let lp = self.logprobs.map(|n| top_logprobs(logits, n));
        if let Some(c) = &mut self.constraint {
            c.apply(logits)?;
        }
        let bytes = |t| vocab.token_bytes(t);
        let id = match draft {
            None => self.sampler.sample(logits, &self.history, &bytes)?,
            Some((r, x)) => {
                let one_hot = [(x, 1.0)];
                let q: &[(u32, f64)] = match &self.model_draft {
                    Some(m) if r < m.q.len() => &m.q[r],
                    _ => &one_hot,
                };
                let v = self.sampler.verify(logits, &self.history, &bytes, x, q)?;
                *held = v.accepted();
                v.token()
            }
        };
        if let Some((all, top)) = lp {
            self.out.logprobs.push(TokenLogprob {
                id,
                logprob: all[id as usize] as f32,
                top,
            });
        }
        self.out.tokens.push(id);
        self.history.push(id);
        if let Some(c) = &mut self.constraint {
            // The worker starts on the next mask now, while the forward of `id` runs.
            c.commit(id);
        }
        if self.eog.contains(&id) {
            self.out.finish = FinishReason::Eos;
            return Ok(Step::Done(self.flush(true)));
        }
        let s = self.stops.push(&vocab.token_bytes(id));
        let text = self.utf8.push(&s.emit);
        if s.stopped {
            self.out.finish = FinishReason::Stop;
            let mut text = text;
            text.extend(self.flush(false));
            return Ok(Step::Done(text));
        }
        if self.out.tokens.len() >= self.max_tokens {
            let mut text = text;
            text.extend(self.flush(true));
            return Ok(Step::Done(text));
        }
        if self.base + self.history.len() >= n_ctx {
            self.out.finish = FinishReason::Context;
            let mut text = text;
            text.extend(self.flush(true));
            return Ok(Step::Done(text));
        }
        self.pending = Some(id);
        Ok(Step::Text(text))
    }

    /// The held text at the end: a stop string that never completed is text after all
    /// (`with_stops`), a held partial UTF-8 character is passed through.
    fn flush(&mut self, with_stops: bool) -> Vec<u8> {
        let mut text = Vec::new();
        if with_stops {
            let rest = self.stops.finish();
            text = self.utf8.push(&rest);
        }
        text.extend(self.utf8.finish());
        text
    }

    /// Ends the sequence here (a context that cannot grow, a caller's limit): held text is
    /// released and the finish reason set.
    pub fn finish_now(&mut self, reason: FinishReason) -> Vec<u8> {
        let text = self.flush(true);
        self.out.text.extend_from_slice(&text);
        self.out.finish = reason;
        self.pending = None;
        self.finish_timings(Instant::now());
        text
    }

    pub(crate) fn mark_prefilled(&mut self, now: Instant) {
        self.prefilled_at = Some(now);
    }

    pub(crate) fn finish_timings(&mut self, now: Instant) {
        self.done = true;
        if let Some(c) = &self.constraint {
            self.out.constraint = Some(c.stats().clone());
        }
        if let Some(l) = &self.lookup {
            self.out.speculative = Some(l.stats());
        }
        if let Some(m) = &self.model_draft {
            self.out.speculative = Some(m.stats());
        }
        let pre = self.prefilled_at.unwrap_or(now);
        self.out.timings.prompt_ms = ms(pre - self.started);
        self.out.timings.generated_tokens = self.out.tokens.len();
        self.out.timings.generate_ms = ms(now - pre);
    }
}

/// The full log-softmax and its `n` best entries (best first, ties by id).
fn top_logprobs(logits: &[f32], n: usize) -> (Vec<f64>, Vec<(u32, f32)>) {
    let all = log_softmax(logits);
    let mut idx: Vec<u32> = (0..all.len() as u32).collect();
    let by = |a: &u32, b: &u32| all[*b as usize].total_cmp(&all[*a as usize]).then(a.cmp(b));
    let n = n.min(idx.len());
    if n > 0 && n < idx.len() {
        idx.select_nth_unstable_by(n - 1, by);
    }
    idx.truncate(n);
    idx.sort_unstable_by(by);
    let top = idx.iter().map(|&i| (i, all[i as usize] as f32)).collect();
    (all, top)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_is_never_split() {
        let s = "é日🙂".as_bytes();
        let mut h = Utf8Hold::default();
        let mut out = Vec::new();
        for b in s {
            let part = h.push(&[*b]);
            assert!(std::str::from_utf8(&part).is_ok());
            out.extend(part);
        }
        out.extend(h.finish());
        assert_eq!(out, s);
    }

    #[test]
    fn top_logprobs_are_the_best_of_a_normalised_distribution() {
        let (all, top) = top_logprobs(&[1.0, 3.0, 2.0, 3.0], 3);
        let total: f64 = all.iter().map(|l| l.exp()).sum();
        assert!((total - 1.0).abs() < 1e-12);
        let ids: Vec<u32> = top.iter().map(|t| t.0).collect();
        assert_eq!(ids, vec![1, 3, 2]);
        assert_eq!(top[0].1, top[1].1);
    }
}
