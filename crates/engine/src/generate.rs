//! The generation loop: sequences prefill their prompts, then sample, decode and stream
//! until a limit, an end-of-generation token or a stop string, all through one batch loop.
//!
//! Generation state belongs to a sequence ([`SeqGen`]: sampler chain, penalty window, stop
//! matcher, UTF-8-safe text hold). [`generate_batch`] drives any number of sequences:
//! every step is one forward holding one decode token per generating sequence plus prompt
//! chunks of the sequences still prefilling, up to the model's batch size (chunked prefill,
//! so running streams keep decoding while a long prompt is read). [`generate`] is a batch of
//! one; `run`, `chat` and `bench` all go through it.
//!
//! It is written against two small traits so it can be tested without a real model:
//! [`LogitsModel`] (batched forwards over sequences) and [`TokenBytes`] (id → bytes).

use crate::batch::{BatchEntry, BatchLogits};
use crate::kvcells::SeqId;
use crate::sampler::{Sampler, SamplerConfig, SamplerError};
use crate::stop::StopMatcher;
use std::time::{Duration, Instant};

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
    /// The sequence [`generate`] uses.
    fn default_seq(&self) -> SeqId;
}

/// Token id → the bytes it stands for.
pub trait TokenBytes {
    fn token_bytes(&self, id: u32) -> Vec<u8>;
}

#[derive(Debug, thiserror::Error)]
pub enum GenerateError<E: std::error::Error + 'static> {
    #[error("the prompt is empty: nothing to continue")]
    EmptyPrompt,
    #[error("the prompt has {prompt} tokens but the context holds {n_ctx} (raise --n-ctx or shorten the prompt)")]
    PromptTooLong { prompt: usize, n_ctx: usize },
    #[error(transparent)]
    Sampler(#[from] SamplerError),
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
}

/// Holds back a trailing incomplete UTF-8 sequence so a stream never splits a character.
#[derive(Default, Debug)]
struct Utf8Hold {
    pending: Vec<u8>,
}

impl Utf8Hold {
    fn push(&mut self, b: &[u8]) -> Vec<u8> {
        self.pending.extend_from_slice(b);
        let cut = complete_prefix_len(&self.pending);
        self.pending.drain(..cut).collect()
    }
    fn finish(&mut self) -> Vec<u8> {
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
    prompt: Vec<u32>,
    /// Prompt tokens already sent to the model.
    fed: usize,
    max_tokens: usize,
    eog: Vec<u32>,
    sampler: Sampler,
    stops: StopMatcher,
    utf8: Utf8Hold,
    /// Prompt and generated ids (the penalty window reads it).
    history: Vec<u32>,
    /// The last sampled id, to be decoded next.
    pending: Option<u32>,
    done: bool,
    started: Instant,
    prefilled_at: Option<Instant>,
    pub out: GenerateOutput,
}

/// A sequence's part of one forward.
#[derive(Clone, Copy)]
enum Part {
    /// Its last sampled token.
    Decode,
    /// Prompt tokens `start..start + len`.
    Prompt { start: usize, len: usize },
}

/// What one sampled token did.
enum Step {
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
        if req.prompt.is_empty() {
            return Err(GenerateError::EmptyPrompt);
        }
        if req.prompt.len() > n_ctx {
            return Err(GenerateError::PromptTooLong {
                prompt: req.prompt.len(),
                n_ctx,
            });
        }
        Ok(SeqGen {
            seq,
            prompt: req.prompt.clone(),
            fed: 0,
            max_tokens: req.max_tokens,
            eog: req.eog.clone(),
            sampler: Sampler::new(req.sampler.clone())?,
            stops: StopMatcher::new(req.stop_strings.iter().map(|s| s.as_bytes())),
            utf8: Utf8Hold::default(),
            history: req.prompt.clone(),
            pending: None,
            done: false,
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
            },
        })
    }

    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Samples from `logits` (the row after the last token fed) and updates the state.
    fn accept(
        &mut self,
        logits: &mut [f32],
        vocab: &dyn TokenBytes,
        n_ctx: usize,
    ) -> Result<Step, SamplerError> {
        let id = self.sampler.sample(logits, &self.history)?;
        self.out.tokens.push(id);
        self.history.push(id);
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
        if self.history.len() >= n_ctx {
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

    fn finish_timings(&mut self, now: Instant) {
        self.done = true;
        let pre = self.prefilled_at.unwrap_or(now);
        self.out.timings.prompt_ms = ms(pre - self.started);
        self.out.timings.generated_tokens = self.out.tokens.len();
        self.out.timings.generate_ms = ms(now - pre);
    }
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

/// Runs several generations, each on its own sequence, through one batch loop (see the
/// module docs). `on_text(i, bytes)` streams request `i`'s text. Each sequence's result is
/// what it would be alone (batch invariance), so its tokens do not depend on the others.
pub fn generate_batch<M: LogitsModel>(
    model: &mut M,
    vocab: &dyn TokenBytes,
    reqs: &[(SeqId, GenerateRequest)],
    mut on_text: impl FnMut(usize, &[u8]),
) -> Result<Vec<GenerateOutput>, GenerateError<M::Error>> {
    let n_ctx = model.context_len();
    let budget = model.max_batch().max(1);
    let mut gens = reqs
        .iter()
        .map(|(seq, r)| SeqGen::new(*seq, r, n_ctx))
        .collect::<Result<Vec<_>, _>>()?;
    let mut row = Vec::new();
    loop {
        // This step's entries: a decode token per generating sequence first, then prompt
        // chunks in request order while the batch has room.
        let mut plan: Vec<(usize, Part)> = Vec::new();
        let mut room = budget;
        for (i, g) in gens.iter().enumerate() {
            if !g.done && g.pending.is_some() && room > 0 {
                plan.push((i, Part::Decode));
                room -= 1;
            }
        }
        for (i, g) in gens.iter().enumerate() {
            if g.done || g.fed >= g.prompt.len() || room == 0 {
                continue;
            }
            let len = (g.prompt.len() - g.fed).min(room);
            plan.push((i, Part::Prompt { start: g.fed, len }));
            room -= len;
        }
        if plan.is_empty() {
            break;
        }
        let pending: Vec<[u32; 1]> = plan
            .iter()
            .map(|&(i, _)| [gens[i].pending.unwrap_or(0)])
            .collect();
        let entries: Vec<BatchEntry> = plan
            .iter()
            .zip(&pending)
            .map(|(&(i, part), tok)| {
                let g = &gens[i];
                match part {
                    Part::Decode => BatchEntry {
                        seq: g.seq,
                        tokens: tok,
                        pos0: g.history.len() - 1,
                        logits: 1,
                    },
                    Part::Prompt { start, len } => BatchEntry {
                        seq: g.seq,
                        tokens: &g.prompt[start..start + len],
                        pos0: start,
                        // Only the prompt's last chunk samples the first reply token.
                        logits: usize::from(start + len == g.prompt.len()),
                    },
                }
            })
            .collect();
        let wants: Vec<bool> = entries.iter().map(|e| e.logits > 0).collect();
        let out = model
            .forward_batch(&entries)
            .map_err(GenerateError::Model)?;
        let now = Instant::now();
        for (k, (&(i, part), &wants)) in plan.iter().zip(&wants).enumerate() {
            let g = &mut gens[i];
            if let Part::Prompt { len, .. } = part {
                g.fed += len;
                if !wants {
                    continue;
                }
                g.prefilled_at = Some(now);
            }
            if g.max_tokens == 0 {
                // Prefill only: nothing to sample.
                g.finish_timings(now);
                continue;
            }
            row.clear();
            row.extend_from_slice(out.logits(k));
            let (text, done) = match g.accept(&mut row, vocab, n_ctx)? {
                Step::Text(t) => (t, false),
                Step::Done(t) => (t, true),
            };
            if !text.is_empty() {
                g.out.text.extend_from_slice(&text);
                on_text(i, &text);
            }
            if done {
                g.finish_timings(Instant::now());
            }
        }
    }
    let now = Instant::now();
    for g in gens.iter_mut().filter(|g| !g.done) {
        g.finish_timings(now);
    }
    Ok(gens.into_iter().map(|g| g.out).collect())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }

    struct Letters;
    impl TokenBytes for Letters {
        fn token_bytes(&self, id: u32) -> Vec<u8> {
            vec![b'a' + id as u8]
        }
    }

    fn greedy_req(prompt: Vec<u32>, n: usize) -> GenerateRequest {
        GenerateRequest {
            prompt,
            max_tokens: n,
            sampler: SamplerConfig {
                temperature: 0.0,
                ..SamplerConfig::default()
            },
            stop_strings: vec![],
            eog: vec![],
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
        let out = generate(&mut m, &Letters, &greedy_req(vec![0, 1], 4), |b| {
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
        let mut req = greedy_req(vec![0], 10);
        req.eog = vec![3];
        let out = generate(&mut m, &Letters, &req, |_| {}).unwrap();
        assert_eq!(out.tokens, vec![1, 2, 3]);
        assert_eq!(out.text, b"bc");
        assert_eq!(out.finish, FinishReason::Eos);
    }

    #[test]
    fn stop_string_across_tokens_truncates() {
        let mut m = counter(100);
        let mut req = greedy_req(vec![0], 10);
        req.stop_strings = vec!["de".into()];
        let out = generate(&mut m, &Letters, &req, |_| {}).unwrap();
        assert_eq!(out.text, b"bc");
        assert_eq!(out.finish, FinishReason::Stop);
    }

    #[test]
    fn context_limit_and_prompt_too_long() {
        let mut m = counter(4);
        let out = generate(&mut m, &Letters, &greedy_req(vec![0, 1], 10), |_| {}).unwrap();
        assert_eq!(out.finish, FinishReason::Context);
        assert_eq!(out.tokens.len(), 2);
        let e = generate(&mut m, &Letters, &greedy_req(vec![0; 5], 1), |_| {}).unwrap_err();
        assert!(matches!(
            e,
            GenerateError::PromptTooLong {
                prompt: 5,
                n_ctx: 4
            }
        ));
    }

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
}
