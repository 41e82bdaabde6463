//! `POST /v1/completions`: raw prompts (a string, strings, token ids), `echo`, legacy
//! `logprobs`, streamed and not. Prompt `p`'s choice `j` has index `p * n + j`.

use super::collect::{
    self, apply, completion_logprobs, finish_metric, finish_name, gather, ChoiceAcc,
};
use super::sse::{self, send, Gone, SseTx};
use super::{body, refused};
use crate::engine_loop::JobEvent;
use crate::error::ApiError;
use crate::metrics::Finish;
use crate::prompt::text_prompt;
use crate::request::completion::{parse, CompletionRequest};
use crate::request::parse_json;
use crate::submit::{choices, submit, Submitted};
use crate::tools::random_id;
use crate::AppState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use std::sync::Arc;

struct Started {
    req: CompletionRequest,
    /// Each prompt's tokens.
    prompts: Vec<Vec<u32>>,
    sub: Submitted,
}

pub async fn handle(
    State(st): State<Arc<AppState>>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let s = start(&st, b).map_err(|e| refused(&st, e))?;
    if s.req.gen.stream {
        Ok(sse::respond(move |tx| async move { drive(&st, s, &tx).await }).into_response())
    } else {
        let r = respond(&st, s).await;
        if r.is_err() {
            st.metrics.request_finished(Finish::Error);
        }
        r.map(IntoResponse::into_response)
    }
}

fn start(st: &Arc<AppState>, b: Result<Bytes, BytesRejection>) -> Result<Started, ApiError> {
    let v = parse_json(&body(st, b)?)?;
    let req = parse(&v, &st.limits)?;
    let special = req.parse_special.unwrap_or(st.cfg.parse_special);
    let prompts = req
        .prompts
        .iter()
        .map(|p| text_prompt(st, p, special))
        .collect::<Result<Vec<_>, _>>()?;
    let grammar = crate::constraint::text_grammar(st, &req.gen)?;
    let mut all = Vec::new();
    for p in &prompts {
        all.extend(choices(st, p, &req.gen, grammar.as_ref())?);
    }
    let sub = submit(st, all)?;
    Ok(Started { req, prompts, sub })
}

/// The text `echo` puts before a choice's completion.
fn echo_text(st: &AppState, s: &Started, prompt: usize) -> String {
    if !s.req.echo {
        return String::new();
    }
    let ids = &s.prompts[prompt];
    // Decoded without the BOS the tokenizer may have added.
    let skip = usize::from(st.tok.add_bos() && ids.first() == st.tok.special_ids().bos.as_ref());
    String::from_utf8_lossy(&st.tok.decode(&ids[skip..]).unwrap_or_default()).into_owned()
}

fn usage_of(s: &Started, accs: &[ChoiceAcc]) -> Value {
    let n = s.req.gen.n;
    let prompt: usize = accs.iter().step_by(n).map(|a| a.prompt_tokens).sum();
    let cached: usize = accs.iter().step_by(n).map(|a| a.cached_tokens).sum();
    collect::usage(
        prompt,
        accs.iter().map(|a| a.completion_tokens).sum(),
        cached,
        accs,
    )
}

async fn respond(st: &AppState, mut s: Started) -> Result<Json<Value>, ApiError> {
    let n = s.req.gen.n;
    let accs = gather(&mut s.sub.events, s.prompts.len() * n).await?;
    let mut out = Vec::new();
    for (i, a) in accs.iter().enumerate() {
        let echo = echo_text(st, &s, i / n);
        let finish = finish_name(a.finish.expect("gathered"));
        let logprobs = s.req.gen.logprobs.map_or(Value::Null, |_| {
            completion_logprobs(st, &a.logprobs, echo.len())
        });
        out.push(json!({
            "index": i,
            "text": format!("{echo}{}", String::from_utf8_lossy(&a.text)),
            "logprobs": logprobs,
            "finish_reason": finish,
        }));
        if i.is_multiple_of(n) {
            st.metrics.request_finished(finish_metric(finish));
        }
    }
    Ok(Json(json!({
        "id": random_id("cmpl-"),
        "object": "text_completion",
        "created": collect::unix_now(),
        "model": st.cfg.model_id,
        "choices": out,
        "usage": usage_of(&s, &accs),
        "system_fingerprint": "minfer",
    })))
}

async fn drive(st: &AppState, mut s: Started, tx: &SseTx) -> Result<(), Gone> {
    let id = random_id("cmpl-");
    let created = collect::unix_now();
    let n = s.req.gen.n;
    let total = s.prompts.len() * n;
    let chunk = |index: usize, text: &str, logprobs: Value, finish: Value| {
        json!({
            "id": id, "object": "text_completion", "created": created,
            "model": st.cfg.model_id, "system_fingerprint": "minfer",
            "choices": [{"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}],
        })
    };
    let mut offsets = vec![0usize; total];
    for (i, off) in offsets.iter_mut().enumerate() {
        let echo = echo_text(st, &s, i / n);
        if !echo.is_empty() {
            send(tx, &chunk(i, &echo, Value::Null, Value::Null)).await?;
        }
        *off = echo.len();
    }
    let mut accs: Vec<ChoiceAcc> = (0..total).map(|_| ChoiceAcc::default()).collect();
    while !accs.iter().all(ChoiceAcc::is_over) {
        let Some(ev) = sse::next_event(&mut s.sub.events, tx).await? else {
            send(tx, &ApiError::server("the engine loop stopped").body()).await?;
            break;
        };
        let (text, lp) = match &ev {
            JobEvent::Token { text, logprob, .. } => {
                (String::from_utf8_lossy(text).into_owned(), logprob.clone())
            }
            JobEvent::Text { text, .. } => (String::from_utf8_lossy(text).into_owned(), None),
            _ => (String::new(), None),
        };
        let c = apply(&mut accs, ev);
        if let Some(why) = accs[c].failed.clone() {
            return sse::fail(st, tx, &why).await;
        }
        let logprobs = match &lp {
            Some(l) if s.req.gen.logprobs.is_some() => {
                completion_logprobs(st, std::slice::from_ref(l), offsets[c])
            }
            _ => Value::Null,
        };
        if !text.is_empty() || !logprobs.is_null() {
            send(tx, &chunk(c, &text, logprobs, Value::Null)).await?;
            offsets[c] += text.len();
        }
        if let Some(f) = accs[c].finish {
            if c.is_multiple_of(n) {
                st.metrics.request_finished(finish_metric(finish_name(f)));
            }
            send(tx, &chunk(c, "", Value::Null, json!(finish_name(f)))).await?;
        }
    }
    if s.req.gen.include_usage {
        let v = json!({
            "id": id, "object": "text_completion", "created": created,
            "model": st.cfg.model_id, "choices": [], "usage": usage_of(&s, &accs),
        });
        send(tx, &v).await?;
    }
    sse::done(tx).await
}
