//! Request bodies: reading and validating them into what the engine loop runs. Everything
//! a request can get wrong is found here, before it takes a place in the queue.

pub mod chat;
pub mod completion;
pub mod constraint;
pub mod fields;
pub mod sampling_extra;
pub mod speculative;

use crate::error::ApiError;
use fields::Fields;
use minfer_generate::sampler::SamplerConfig;
use serde_json::Value;

/// What a request may ask for, set by the server's configuration.
#[derive(Clone, Debug)]
pub struct Limits {
    pub n_ctx: usize,
    /// Most choices (`n`) in one request (`--max-n`; at most the sequences that run at once).
    pub max_n: usize,
    pub vocab: usize,
    /// Most prompt tokens (`--max-prompt-tokens`; a prompt must also leave room for a reply).
    pub max_prompt_tokens: usize,
    /// Most tokens one request may ask to generate in all, `max_tokens` (or the context when
    /// unset) × `n` (`--max-total-tokens`): bounds the work one request can queue.
    pub max_total_tokens: usize,
    /// Most bytes of the `tools` list as JSON (`--max-tools-bytes`): the schemas are
    /// rendered into the prompt and compiled into grammars, both costly for huge ones.
    pub max_tools_bytes: usize,
}

/// The generation settings shared by chat and text completions.
#[derive(Clone, Debug)]
pub struct GenParams {
    pub sampler: SamplerConfig,
    /// None: until an end-of-generation token, a stop string or a full context.
    pub max_tokens: Option<usize>,
    pub stop: Vec<String>,
    pub n: usize,
    /// Alternatives per token to report; `Some(0)` reports only the sampled token's.
    pub logprobs: Option<usize>,
    pub stream: bool,
    pub include_usage: bool,
    /// What the reply must follow, and the field that asked for it.
    pub constraint: Option<(minfer_generate::constrain::ConstraintSpec, &'static str)>,
    /// minfer's `speculative` field (checked against the sampling and the constraint when
    /// the request is submitted, where a forced tool call's grammar is known too).
    pub speculative: speculative::Speculative,
}

/// Most alternatives per token a request may ask for (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: i64 = 20;
/// Most stop strings in one request.
pub const MAX_STOPS: usize = 16;

/// Reads the sampling and length fields (llama-server's defaults where OpenAI leaves them
/// open; `logprobs` differs between the two endpoints and is read by each).
pub fn gen_params(
    f: &Fields,
    lim: &Limits,
    logprobs: Option<usize>,
) -> Result<GenParams, ApiError> {
    let d = SamplerConfig::default();
    let n_ctx = lim.n_ctx as i64;
    let mut max_tokens = None;
    for name in ["max_tokens", "max_completion_tokens", "n_predict"] {
        if let Some(m) = f.int(name, -1..=i64::MAX)? {
            if m > n_ctx {
                return Err(ApiError::bad_field(
                    name,
                    format!("`{name}` = {m} is more than the context of {n_ctx} tokens"),
                )
                .with_code("context_length_exceeded"));
            }
            max_tokens = if m < 0 { None } else { Some(m as usize) };
            break;
        }
    }
    let temperature = f
        .number("temperature", 0.0..=2.0)?
        .map_or(d.temperature, |x| x as f32);
    let top_p = f.number("top_p", 0.0..=1.0)?.map_or(d.top_p, |x| x as f32);
    let top_k = f
        .int("top_k", -1..=i32::MAX as i64)?
        .map_or(d.top_k, |x| x as i32);
    let min_p = f.number("min_p", 0.0..=1.0)?.map_or(d.min_p, |x| x as f32);
    let presence = f
        .number("presence_penalty", -2.0..=2.0)?
        .map_or(0.0, |x| x as f32);
    let frequency = f
        .number("frequency_penalty", -2.0..=2.0)?
        .map_or(0.0, |x| x as f32);
    let mut repeat = d.repeat_penalty;
    for name in ["repetition_penalty", "repeat_penalty"] {
        if let Some(x) = f.number(name, 0.0..=10.0)? {
            if x <= 0.0 {
                return Err(ApiError::bad_field(name, format!("`{name}` must be > 0")));
            }
            repeat = x as f32;
        }
    }
    let repeat_last_n = match f.int("repeat_last_n", -1..=n_ctx)? {
        None => d.repeat_last_n,
        Some(-1) => lim.n_ctx,
        Some(x) => x as usize,
    };
    let seed = match f.get("seed") {
        None => random_seed(),
        Some(v) => v
            .as_u64()
            .or_else(|| v.as_i64().map(|x| x as u64))
            .ok_or_else(|| {
                ApiError::bad_field(
                    "seed",
                    format!("`seed` must be an integer, got {}", fields::kind(v)),
                )
            })?,
    };
    let logit_bias = logit_bias(f, lim.vocab)?;
    let stop = {
        let mut s = f.strings("stop", MAX_STOPS)?;
        s.extend(f.strings("stop_sequences", MAX_STOPS)?);
        s
    };
    let n = f.int("n", 1..=lim.max_n as i64).map_err(|e| {
        if f.get("n").is_some_and(|v| v.is_number()) {
            ApiError::bad_field(
                "n",
                format!(
                    "`n` must be between 1 and {} (the choices one request may ask for: --max-n, at most --parallel)",
                    lim.max_n
                ),
            )
        } else {
            e
        }
    })?;
    let n_choices = n.unwrap_or(1) as usize;
    let per_choice = max_tokens.unwrap_or(lim.n_ctx);
    if per_choice.saturating_mul(n_choices) > lim.max_total_tokens {
        let what = match max_tokens {
            Some(m) => format!("`max_tokens` {m}"),
            None => format!("no `max_tokens` (up to the context, {} tokens)", lim.n_ctx),
        };
        return Err(ApiError::bad_field(
            "max_tokens",
            format!(
                "{what} × `n` {n_choices} is more than the {} tokens one request may generate \
                 (--max-total-tokens); ask for fewer tokens or fewer choices",
                lim.max_total_tokens
            ),
        )
        .with_code("too_many_tokens"));
    }
    let stream = f.bool("stream")?.unwrap_or(false);
    let include_usage = match f.object("stream_options")? {
        Some(o) => match o.get("include_usage") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(v) => {
                return Err(ApiError::bad_field(
                    "stream_options.include_usage",
                    format!(
                        "`stream_options.include_usage` must be a boolean, got {}",
                        fields::kind(v)
                    ),
                ))
            }
        },
        None => false,
    };
    f.str("user")?;
    f.str("model")?;
    let constraint = constraint::read(f)?;
    let speculative = speculative::read(f.get("speculative"))?;
    let mut sampler = SamplerConfig {
        temperature,
        top_k,
        top_p,
        min_p,
        repeat_last_n,
        repeat_penalty: repeat,
        frequency_penalty: frequency,
        presence_penalty: presence,
        logit_bias,
        seed,
        ..SamplerConfig::default()
    };
    sampling_extra::apply(f, &mut sampler, lim.n_ctx)?;
    sampler
        .validate()
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    Ok(GenParams {
        sampler,
        max_tokens,
        stop,
        n: n_choices,
        logprobs,
        stream,
        include_usage,
        constraint,
        speculative,
    })
}

/// OpenAI's `{"token id": bias}` map (bias −100…100; −100 bans), or llama.cpp's
/// `[[id, bias], …]` list where a bias of `false` bans.
fn logit_bias(f: &Fields, vocab: usize) -> Result<Vec<(u32, f32)>, ApiError> {
    let bad = |m: String| ApiError::bad_field("logit_bias", m);
    let token = |id: i64| -> Result<u32, ApiError> {
        if id < 0 || id as usize >= vocab {
            return Err(bad(format!(
                "`logit_bias` names token {id}; the vocabulary has {vocab}"
            )));
        }
        Ok(id as u32)
    };
    let bias = |v: &Value| -> Result<f32, ApiError> {
        match v {
            Value::Bool(false) => Ok(f32::NEG_INFINITY),
            Value::Number(n) => {
                let b = n.as_f64().unwrap_or(f64::NAN);
                if !(-100.0..=100.0).contains(&b) {
                    return Err(bad(format!(
                        "`logit_bias` value {b} is out of range (-100 to 100)"
                    )));
                }
                Ok(if b <= -100.0 {
                    f32::NEG_INFINITY
                } else {
                    b as f32
                })
            }
            other => Err(bad(format!(
                "`logit_bias` values must be numbers, got {}",
                fields::kind(other)
            ))),
        }
    };
    let list: Vec<(u32, f32)> = match f.get("logit_bias") {
        None => Ok(Vec::new()),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| {
                let id: i64 = k
                    .trim()
                    .parse()
                    .map_err(|_| bad(format!("`logit_bias` key {k:?} is not a token id")))?;
                Ok((token(id)?, bias(v)?))
            })
            .collect(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|pair| match pair.as_array().map(Vec::as_slice) {
                Some([Value::Number(id), b]) => {
                    let id = id
                        .as_i64()
                        .ok_or_else(|| bad("`logit_bias` token ids must be integers".into()))?;
                    Ok((token(id)?, bias(b)?))
                }
                _ => Err(bad(
                    "`logit_bias` as a list holds [token id, bias] pairs".into()
                )),
            })
            .collect(),
        Some(v) => Err(bad(format!(
            "`logit_bias` must be an object of token id → bias, got {}",
            fields::kind(v)
        ))),
    }?;
    // Banning the whole vocabulary leaves the sampler nothing to pick: the request's fault.
    let mut banned: Vec<u32> = list
        .iter()
        .filter(|(_, b)| *b == f32::NEG_INFINITY)
        .map(|&(id, _)| id)
        .collect();
    banned.sort_unstable();
    banned.dedup();
    if !banned.is_empty() && banned.len() >= vocab {
        return Err(bad(format!(
            "`logit_bias` bans all {vocab} tokens of the vocabulary; nothing is left to sample"
        )));
    }
    Ok(list)
}

/// A seed for requests that give none: different per request, like llama-server's.
fn random_seed() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos() as u64;
    let mut z = t ^ COUNTER.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Parses a body as JSON (invalid UTF-8 and syntax errors are 400s naming the place).
pub fn parse_json(body: &[u8]) -> Result<Value, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request(
            "the request body is empty; expected a JSON object",
        ));
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))
}
