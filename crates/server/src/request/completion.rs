//! `POST /v1/completions` bodies: raw prompts (text, texts, token ids) and `echo`.

use super::fields::{kind, Fields};
use super::{gen_params, GenParams, Limits, MAX_TOP_LOGPROBS};
use crate::error::ApiError;
use serde_json::Value;

/// One prompt as given: text (tokenized by the server) or token ids.
#[derive(Clone, Debug, PartialEq)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
}

#[derive(Clone, Debug)]
pub struct CompletionRequest {
    pub prompts: Vec<Prompt>,
    pub echo: bool,
    /// Parse special-token text in text prompts (None: the server's default).
    pub parse_special: Option<bool>,
    pub gen: GenParams,
}

/// Most prompts in one request.
pub const MAX_PROMPTS: usize = 64;

pub fn parse(body: &Value, lim: &Limits) -> Result<CompletionRequest, ApiError> {
    let f = Fields::of(body)?;
    let prompts = prompts(f.get("prompt"), lim.vocab)?;
    let logprobs = f.int("logprobs", 0..=MAX_TOP_LOGPROBS)?.map(|n| n as usize);
    let echo = f.bool("echo")?.unwrap_or(false);
    if echo && logprobs.is_some() {
        return Err(ApiError::bad_field(
            "echo",
            "`echo` with `logprobs` needs the prompt's log probabilities, which minfer does not compute",
        ));
    }
    if f.get("suffix").is_some() {
        f.str("suffix")?;
        return Err(ApiError::bad_field(
            "suffix",
            "`suffix` (insertion) is not supported",
        ));
    }
    let gen = gen_params(&f, lim, logprobs)?;
    if let Some(b) = f.int("best_of", 1..=i64::MAX)? {
        if b as usize != gen.n {
            return Err(ApiError::bad_field(
                "best_of",
                "`best_of` other than `n` is not supported",
            ));
        }
    }
    if prompts.len() * gen.n > lim.max_n {
        return Err(ApiError::bad_field(
            "prompt",
            format!(
                "{} prompts × n = {} make {} sequences; this server runs at most {} at once (--parallel)",
                prompts.len(),
                gen.n,
                prompts.len() * gen.n,
                lim.max_n
            ),
        ));
    }
    Ok(CompletionRequest {
        prompts,
        echo,
        parse_special: f.bool("parse_special")?,
        gen,
    })
}

fn prompts(v: Option<&Value>, vocab: usize) -> Result<Vec<Prompt>, ApiError> {
    let bad = |m: String| ApiError::bad_field("prompt", m);
    let ids = |list: &[Value]| -> Result<Vec<u32>, ApiError> {
        list.iter()
            .map(|t| match t.as_u64() {
                Some(id) if (id as usize) < vocab => Ok(id as u32),
                Some(id) => Err(bad(format!(
                    "token id {id} is outside the vocabulary of {vocab}"
                ))),
                None => Err(bad(format!(
                    "token ids must be non-negative integers, got {}",
                    kind(t)
                ))),
            })
            .collect()
    };
    let list = match v {
        None => return Err(bad("`prompt` is required".into())),
        Some(Value::String(s)) => vec![Prompt::Text(s.clone())],
        Some(Value::Array(a)) if a.is_empty() => return Err(bad("`prompt` is empty".into())),
        Some(Value::Array(a)) if a.iter().all(Value::is_number) => vec![Prompt::Tokens(ids(a)?)],
        Some(Value::Array(a)) => a
            .iter()
            .map(|p| match p {
                Value::String(s) => Ok(Prompt::Text(s.clone())),
                Value::Array(t) => Ok(Prompt::Tokens(ids(t)?)),
                other => Err(bad(format!(
                    "`prompt` lists must hold strings or token-id arrays, got {}",
                    kind(other)
                ))),
            })
            .collect::<Result<_, _>>()?,
        Some(v) => {
            return Err(bad(format!(
                "`prompt` must be a string, a list of strings or token ids, got {}",
                kind(v)
            )))
        }
    };
    if list.len() > MAX_PROMPTS {
        return Err(bad(format!(
            "{} prompts; at most {MAX_PROMPTS}",
            list.len()
        )));
    }
    // An empty text prompt is OpenAI's: generation starts from the BOS token (see
    // `prompt::text_prompt`); an empty token list says nothing to start from.
    if list
        .iter()
        .any(|p| matches!(p, Prompt::Tokens(t) if t.is_empty()))
    {
        return Err(bad("a token-id prompt is empty".into()));
    }
    Ok(list)
}
