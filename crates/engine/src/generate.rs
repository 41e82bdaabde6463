//! The generation loop: prefill the prompt, then sample, decode and stream until a limit,
//! an end-of-generation token or a stop string.
//!
//! It is written against two small traits so it can be tested without a real model:
//! [`LogitsModel`] (tokens in, last-row logits out) and [`TokenBytes`] (id → bytes).

use crate::sampler::{Sampler, SamplerConfig, SamplerError};
use crate::stop::StopMatcher;
use std::time::{Duration, Instant};

/// A model as the loop sees it.
pub trait LogitsModel {
    type Error: std::error::Error + Send + Sync + 'static;
    /// Appends `tokens` at positions `pos0..` of the sequence and returns the logits of the
    /// last token (vocab-sized).
    fn forward(&mut self, tokens: &[u32], pos0: usize) -> Result<&[f32], Self::Error>;
    /// Most positions the sequence may hold.
    fn context_len(&self) -> usize;
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

/// Runs one generation. `on_text` receives text as it becomes final (never a partial UTF-8
/// character, never a prefix of a stop string that might still complete).
pub fn generate<M: LogitsModel>(
    model: &mut M,
    vocab: &dyn TokenBytes,
    req: &GenerateRequest,
    mut on_text: impl FnMut(&[u8]),
) -> Result<GenerateOutput, GenerateError<M::Error>> {
    if req.prompt.is_empty() {
        return Err(GenerateError::EmptyPrompt);
    }
    let n_ctx = model.context_len();
    if req.prompt.len() > n_ctx {
        return Err(GenerateError::PromptTooLong {
            prompt: req.prompt.len(),
            n_ctx,
        });
    }
    let mut sampler = Sampler::new(req.sampler.clone())?;
    let mut stops = StopMatcher::new(req.stop_strings.iter().map(|s| s.as_bytes()));
    let mut utf8 = Utf8Hold::default();
    let mut history = req.prompt.clone();
    let mut out = GenerateOutput {
        tokens: Vec::new(),
        text: Vec::new(),
        finish: FinishReason::Length,
        timings: Timings {
            prompt_tokens: req.prompt.len(),
            ..Timings::default()
        },
    };
    let mut emit = |bytes: &[u8], out: &mut GenerateOutput| {
        if !bytes.is_empty() {
            out.text.extend_from_slice(bytes);
            on_text(bytes);
        }
    };

    let t0 = Instant::now();
    let mut logits = model
        .forward(&req.prompt, 0)
        .map_err(GenerateError::Model)?
        .to_vec();
    out.timings.prompt_ms = ms(t0.elapsed());
    let t1 = Instant::now();
    let mut finished = false;
    while out.tokens.len() < req.max_tokens {
        let id = sampler.sample(&mut logits, &history)?;
        out.tokens.push(id);
        history.push(id);
        if req.eog.contains(&id) {
            out.finish = FinishReason::Eos;
            finished = true;
            break;
        }
        let s = stops.push(&vocab.token_bytes(id));
        let text = utf8.push(&s.emit);
        emit(&text, &mut out);
        if s.stopped {
            out.finish = FinishReason::Stop;
            finished = true;
            break;
        }
        if out.tokens.len() >= req.max_tokens {
            break;
        }
        if history.len() >= n_ctx {
            out.finish = FinishReason::Context;
            break;
        }
        logits.clear();
        logits.extend_from_slice(
            model
                .forward(&[id], history.len() - 1)
                .map_err(GenerateError::Model)?,
        );
    }
    if !finished || out.finish == FinishReason::Eos {
        let rest = stops.finish();
        let mut text = utf8.push(&rest);
        text.extend(utf8.finish());
        emit(&text, &mut out);
    } else {
        let text = utf8.finish();
        emit(&text, &mut out);
    }
    out.timings.generated_tokens = out.tokens.len();
    out.timings.generate_ms = ms(t1.elapsed());
    Ok(out)
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
        logits: Vec<f32>,
        calls: Vec<(usize, usize)>,
    }

    impl LogitsModel for Counter {
        type Error = std::io::Error;
        fn forward(&mut self, tokens: &[u32], pos0: usize) -> Result<&[f32], std::io::Error> {
            self.calls.push((tokens.len(), pos0));
            let next = (*tokens.last().unwrap() as usize + 1) % self.vocab;
            self.logits = vec![0.0; self.vocab];
            self.logits[next] = 10.0;
            Ok(&self.logits)
        }
        fn context_len(&self) -> usize {
            self.n_ctx
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
            logits: vec![],
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
