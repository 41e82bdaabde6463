//! What chat and text completions share: gathering a job's events per choice, usage,
//! finish reasons and the log-probability shapes.

use crate::engine_loop::JobEvent;
use crate::error::ApiError;
use crate::metrics::Finish;
use crate::AppState;
use minfer_generate::lookup::SpecStats;
use minfer_generate::{FinishReason, TokenLogprob};
use serde_json::{json, Value};
use tokio::sync::mpsc::UnboundedReceiver;

/// One choice as it completes.
#[derive(Default)]
pub struct ChoiceAcc {
    pub text: Vec<u8>,
    pub logprobs: Vec<TokenLogprob>,
    pub finish: Option<FinishReason>,
    pub completion_tokens: usize,
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    pub speculative: Option<SpecStats>,
    pub failed: Option<String>,
}

impl ChoiceAcc {
    pub fn is_over(&self) -> bool {
        self.finish.is_some() || self.failed.is_some()
    }
}

/// Applies one event to the choices; returns the index it concerned.
pub fn apply(accs: &mut [ChoiceAcc], e: JobEvent) -> usize {
    match e {
        JobEvent::Token {
            choice,
            text,
            logprob,
            ..
        } => {
            accs[choice].text.extend_from_slice(&text);
            if let Some(l) = logprob {
                accs[choice].logprobs.push(l);
            }
            choice
        }
        JobEvent::Text { choice, text } => {
            accs[choice].text.extend_from_slice(&text);
            choice
        }
        JobEvent::Done {
            choice,
            finish,
            prompt_tokens,
            completion_tokens,
            cached_tokens,
            speculative,
        } => {
            let a = &mut accs[choice];
            a.speculative = speculative;
            a.finish = Some(finish);
            a.prompt_tokens = prompt_tokens;
            a.completion_tokens = completion_tokens;
            a.cached_tokens = cached_tokens;
            choice
        }
        JobEvent::Failed { choice, message } => {
            accs[choice].failed = Some(message);
            choice
        }
    }
}

/// Waits for every choice to finish (non-streamed responses). A failed choice fails the
/// request with a 500.
pub async fn gather(
    events: &mut UnboundedReceiver<JobEvent>,
    n: usize,
) -> Result<Vec<ChoiceAcc>, ApiError> {
    let mut accs: Vec<ChoiceAcc> = (0..n).map(|_| ChoiceAcc::default()).collect();
    while !accs.iter().all(ChoiceAcc::is_over) {
        match events.recv().await {
            Some(e) => {
                apply(&mut accs, e);
            }
            None => return Err(ApiError::server("the engine loop stopped")),
        }
    }
    if let Some(why) = accs.iter().find_map(|a| a.failed.clone()) {
        return Err(ApiError::generation_failed(&why));
    }
    Ok(accs)
}

/// OpenAI's finish reasons: stop (EOS or a stop string), length (max_tokens or context).
pub fn finish_name(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Eos | FinishReason::Stop => "stop",
        FinishReason::Length | FinishReason::Context => "length",
    }
}

pub fn finish_metric(name: &str) -> Finish {
    match name {
        "length" => Finish::Length,
        "tool_calls" => Finish::ToolCalls,
        _ => Finish::Stop,
    }
}

/// The usage object; a prompt shared by `n` choices is counted once per prompt. When any
/// choice speculated, the drafts are counted in OpenAI's own fields for proposed tokens
/// (`completion_tokens_details.accepted_prediction_tokens` / `rejected_prediction_tokens`,
/// those of its Predicted Outputs), summed over the choices: the drafts are predictions
/// the model checked, and as there they do not change `completion_tokens`.
pub fn usage(
    prompt_tokens: usize,
    completion_tokens: usize,
    cached_tokens: usize,
    accs: &[ChoiceAcc],
) -> Value {
    let mut u = json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    });
    let spec: Vec<SpecStats> = accs.iter().filter_map(|a| a.speculative).collect();
    if !spec.is_empty() {
        let drafted: usize = spec.iter().map(|s| s.drafted).sum();
        let accepted: usize = spec.iter().map(|s| s.accepted).sum();
        u["completion_tokens_details"] = json!({
            "accepted_prediction_tokens": accepted,
            "rejected_prediction_tokens": drafted - accepted,
        });
    }
    u
}

fn piece(st: &AppState, id: u32) -> Vec<u8> {
    st.tok.piece(id).map(<[u8]>::to_vec).unwrap_or_default()
}

/// Chat's `logprobs.content` entries.
pub fn chat_logprobs(st: &AppState, lps: &[TokenLogprob]) -> Value {
    let entry = |id: u32, lp: f32| {
        let b = piece(st, id);
        json!({"token": String::from_utf8_lossy(&b), "logprob": lp, "bytes": b})
    };
    let content: Vec<Value> = lps
        .iter()
        .map(|l| {
            let mut e = entry(l.id, l.logprob);
            e["top_logprobs"] = l.top.iter().map(|&(id, lp)| entry(id, lp)).collect();
            e
        })
        .collect();
    json!({ "content": content })
}

/// Text completions' legacy `logprobs` object; `offset` is where the first token's text
/// starts in the choice's text.
pub fn completion_logprobs(st: &AppState, lps: &[TokenLogprob], mut offset: usize) -> Value {
    let mut tokens = Vec::new();
    let mut token_logprobs = Vec::new();
    let mut top = Vec::new();
    let mut offsets = Vec::new();
    for l in lps {
        let text = String::from_utf8_lossy(&piece(st, l.id)).into_owned();
        offsets.push(offset);
        offset += text.len();
        tokens.push(text);
        token_logprobs.push(l.logprob);
        let mut m = serde_json::Map::new();
        for &(id, lp) in &l.top {
            m.insert(
                String::from_utf8_lossy(&piece(st, id)).into_owned(),
                json!(lp),
            );
        }
        top.push(Value::Object(m));
    }
    json!({
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": top,
        "text_offset": offsets,
    })
}

pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
