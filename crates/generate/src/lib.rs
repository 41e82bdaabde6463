//! The generation loop: sequences prefill their prompts, then sample, decode and stream
//! until a limit, an end-of-generation token or a stop string, all through one batch loop.
//!
//! Generation state belongs to a sequence ([`SeqGen`]: sampler chain, penalty window, stop
//! matcher, UTF-8-safe text hold, log probabilities). [`Batcher`] is the steppable loop:
//! sequences join and leave between forwards, and every step is one forward holding one
//! decode token per generating sequence plus prompt chunks of the sequences still
//! prefilling (chunked prefill, so running streams keep decoding while a long prompt is
//! read); the server drives it. [`generate_batch`] runs a fixed set of requests through it
//! to the end, and [`generate`] is a batch of one; `run`, `chat` and `bench` go through them.
//!
//! It is written against two small traits so it can be tested without a real model:
//! [`LogitsModel`] (batched forwards over sequences) and [`TokenBytes`] (id → bytes), both
//! the engine's (`minfer_engine::model`), which implements the first.
//!
//! Beside the loop: the sampler chain ([`sampler`]), constrained decoding ([`constrain`]),
//! stop strings ([`stop`]) and chat ([`chat`]: templates, turns, session files' app data).

mod adaptive;
mod batcher;
pub mod chat;
pub mod constrain;
pub mod draft;
pub mod lookup;
pub mod sampler;
pub mod sched;
mod seq;
pub mod speculative;
pub mod stop;
#[cfg(test)]
mod test_support;

pub use batcher::{Batcher, Event, StepFailed};
pub use seq::{Failure, SeqGen, TokenLogprob};

use sched::{Direct, SchedConfig, SchedEvent, Scheduler};

use crate::constrain::{ConstraintStats, Grammar};
use crate::lookup::{LookupConfig, SpecStats};
use crate::sampler::{SamplerConfig, SamplerError};
use minfer_engine::SeqId;
pub use minfer_engine::{LogitsModel, TokenBytes};

#[derive(Debug, thiserror::Error)]
pub enum GenerateError<E: std::error::Error + 'static> {
    #[error("the prompt is empty: nothing to continue")]
    EmptyPrompt,
    #[error("the prompt has {prompt} tokens but the context holds {n_ctx} (raise --n-ctx or shorten the prompt)")]
    PromptTooLong { prompt: usize, n_ctx: usize },
    #[error(transparent)]
    Sampler(#[from] SamplerError),
    /// A speculative drafter asked for with a setting it does not support yet.
    #[error("speculative decoding does not support {what} yet")]
    SpeculativeUnsupported { what: &'static str },
    /// The message carries the cause (not also a `source`, so error chains print it once).
    #[error("model forward failed: {0}")]
    Model(E),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// `max_tokens` generated.
    Length,
    /// An end-of-generation token was sampled.
    Eos,
    /// A stop string matched.
    Stop,
    /// The context is full.
    Context,
}

#[derive(Clone, Debug)]
pub struct GenerateRequest {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampler: SamplerConfig,
    pub stop_strings: Vec<String>,
    /// Tokens that end generation (EOS, EOT, …). The sampled one is kept in `tokens`
    /// but contributes no text.
    pub eog: Vec<u32>,
    /// Record each sampled token's log probability and this many alternatives.
    pub logprobs: Option<usize>,
    /// The grammar the reply must follow (each sequence gets a fresh state from it).
    pub constraint: Option<Grammar>,
    /// Prompt lookup decoding: drafts verified in the sampled token's forward ([`lookup`]).
    pub lookup: Option<LookupConfig>,
    /// A draft model (or self-drafting) proposes the drafts instead ([`draft`]); not with
    /// `lookup`.
    pub draft: Option<draft::DraftHandle>,
}

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Timings {
    pub prompt_tokens: usize,
    pub prompt_ms: f64,
    pub generated_tokens: usize,
    /// Decode time only (llama-bench "tg" calibre: excludes prefill).
    pub generate_ms: f64,
}

impl Timings {
    pub fn prompt_tps(&self) -> f64 {
        rate(self.prompt_tokens, self.prompt_ms)
    }
    pub fn generate_tps(&self) -> f64 {
        rate(self.generated_tokens, self.generate_ms)
    }
}

fn rate(n: usize, ms: f64) -> f64 {
    if ms > 0.0 {
        n as f64 * 1e3 / ms
    } else {
        0.0
    }
}

#[derive(Clone, Debug)]
pub struct GenerateOutput {
    /// Generated ids (an end-of-generation token, when it ended the run, is the last).
    pub tokens: Vec<u32>,
    /// The emitted text bytes (stop string and EOG excluded).
    pub text: Vec<u8>,
    pub finish: FinishReason,
    pub timings: Timings,
    /// One entry per generated token when the request asked for log probabilities.
    pub logprobs: Vec<TokenLogprob>,
    /// Mask timings, when the request had a constraint.
    pub constraint: Option<ConstraintStats>,
    /// What the drafter did, when the request speculated.
    pub speculative: Option<SpecStats>,
}

/// Runs one generation on the model's default sequence. `on_text` receives text as it
/// becomes final (never a partial UTF-8 character, never a prefix of a stop string that
/// might still complete).
pub fn generate<M: LogitsModel>(
    model: &mut M,
    vocab: &dyn TokenBytes,
    req: &GenerateRequest,
    mut on_text: impl FnMut(&[u8]),
) -> Result<GenerateOutput, GenerateError<M::Error>> {
    let seq = model.default_seq();
    let mut outs = generate_batch(model, vocab, &[(seq, req.clone())], |_, b| on_text(b))?;
    Ok(outs.remove(0))
}

/// Runs several generations, each on its own sequence, to the end through the
/// [`sched::Scheduler`] (prompt chunks up to the model's batch size). `on_text(i, bytes)`
/// streams request `i`'s text. Each sequence's result is what it would be alone (batch
/// invariance). A failed forward or sampler ends the whole run with its error.
pub fn generate_batch<M: LogitsModel>(
    model: &mut M,
    vocab: &dyn TokenBytes,
    reqs: &[(SeqId, GenerateRequest)],
    mut on_text: impl FnMut(usize, &[u8]),
) -> Result<Vec<GenerateOutput>, GenerateError<M::Error>> {
    let n_ctx = model.context_len();
    let mut sched = Scheduler::new(SchedConfig::direct(model.max_batch()));
    for (i, (seq, r)) in reqs.iter().enumerate() {
        sched.start(i, SeqGen::new(*seq, r, n_ctx)?);
    }
    let mut outs: Vec<Option<GenerateOutput>> = vec![None; reqs.len()];
    let mut host = Direct(model);
    while !sched.is_idle() {
        let mut failed = None;
        sched
            .step(&mut host, vocab, |&mut i, ev| match ev {
                SchedEvent::Token { text, .. } | SchedEvent::Text(text) if !text.is_empty() => {
                    on_text(i, text)
                }
                SchedEvent::Done { gen, .. } => outs[i] = Some(gen.out.clone()),
                // A forward's failure ends the step with its error (below); a sampler's
                // fails its sequence alone, and ends the run here.
                SchedEvent::Failed {
                    failure: Some(Failure::Sampler(e)),
                    ..
                } => {
                    failed.get_or_insert(e.clone());
                }
                _ => {}
            })
            .map_err(|f| f.error)?;
        if let Some(e) = failed {
            return Err(GenerateError::Sampler(e));
        }
        if !sched.last_step().forwarded {
            // Nothing had work yet some sequence is not done: end it with what it has
            // rather than loop.
            sched.finish_all(&mut host, FinishReason::Length, "", |&mut i, ev| {
                if let SchedEvent::Done { gen, .. } = ev {
                    outs[i] = Some(gen.out.clone());
                }
            });
        }
    }
    Ok(outs
        .into_iter()
        .map(|o| o.expect("every started sequence ends with Done or Failed"))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{greedy, Letters};
    use minfer_engine::{BatchEntry, BatchLogits};

    /// A fake model whose next token is always (last + 1) mod vocab, greedily.
    struct Counter {
        vocab: usize,
        n_ctx: usize,
        logits: BatchLogits,
        calls: Vec<(usize, usize)>,
    }

    impl LogitsModel for Counter {
        type Error = std::io::Error;
        fn forward_batch(
            &mut self,
            entries: &[BatchEntry],
        ) -> Result<&BatchLogits, std::io::Error> {
            let mut data = Vec::new();
            let mut rows = Vec::new();
            for e in entries {
                self.calls.push((e.tokens.len(), e.pos0));
                rows.push((rows.len(), e.logits));
                if e.logits == 1 {
                    let next = (*e.tokens.last().unwrap() as usize + 1) % self.vocab;
                    let mut l = vec![0.0; self.vocab];
                    l[next] = 10.0;
                    data.extend(l);
                }
            }
            let mut at = 0;
            for r in rows.iter_mut() {
                r.0 = at;
                at += r.1;
            }
            self.logits = BatchLogits::from_rows(data, rows, self.vocab);
            Ok(&self.logits)
        }
        fn context_len(&self) -> usize {
            self.n_ctx
        }
        fn max_batch(&self) -> usize {
            512
        }
        fn default_seq(&self) -> SeqId {
            SeqId(0)
        }
        fn seq_truncate(&mut self, _: SeqId, _: usize) -> Result<(), std::io::Error> {
            Ok(())
        }
    }

    fn counter(n_ctx: usize) -> Counter {
        Counter {
            vocab: 26,
            n_ctx,
            logits: BatchLogits::default(),
            calls: vec![],
        }
    }

    #[test]
    fn prefill_once_then_one_token_per_step_at_the_right_positions() {
        let mut m = counter(100);
        let mut streamed = Vec::new();
        let out = generate(&mut m, &Letters, &greedy(vec![0, 1], 4), |b| {
            streamed.extend_from_slice(b)
        })
        .unwrap();
        assert_eq!(out.tokens, vec![2, 3, 4, 5]);
        assert_eq!(out.text, b"cdef");
        assert_eq!(streamed, b"cdef");
        assert_eq!(out.finish, FinishReason::Length);
        assert_eq!(m.calls, vec![(2, 0), (1, 2), (1, 3), (1, 4)]);
    }

    #[test]
    fn eog_token_ends_without_text() {
        let mut m = counter(100);
        let mut req = greedy(vec![0], 10);
        req.eog = vec![3];
        let out = generate(&mut m, &Letters, &req, |_| {}).unwrap();
        assert_eq!(out.tokens, vec![1, 2, 3]);
        assert_eq!(out.text, b"bc");
        assert_eq!(out.finish, FinishReason::Eos);
    }

    #[test]
    fn stop_string_across_tokens_truncates() {
        let mut m = counter(100);
        let mut req = greedy(vec![0], 10);
        req.stop_strings = vec!["de".into()];
        let out = generate(&mut m, &Letters, &req, |_| {}).unwrap();
        assert_eq!(out.text, b"bc");
        assert_eq!(out.finish, FinishReason::Stop);
    }

    #[test]
    fn context_limit_and_prompt_too_long() {
        let mut m = counter(4);
        let out = generate(&mut m, &Letters, &greedy(vec![0, 1], 10), |_| {}).unwrap();
        assert_eq!(out.finish, FinishReason::Context);
        assert_eq!(out.tokens.len(), 2);
        let e = generate(&mut m, &Letters, &greedy(vec![0; 5], 1), |_| {}).unwrap_err();
        assert!(matches!(
            e,
            GenerateError::PromptTooLong {
                prompt: 5,
                n_ctx: 4
            }
        ));
    }
}
