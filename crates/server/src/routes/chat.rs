//! `POST /v1/chat/completions`, streamed (SSE) and not, with tool calls parsed from the
//! model's `<tool_call>` blocks (streamed as OpenAI streams them: one `tool_calls` delta per
//! call, with its id, name and arguments).

use super::collect::{self, apply, chat_logprobs, finish_metric, finish_name, gather, ChoiceAcc};
use super::sse::{self, send, Gone, SseTx};
use super::{body, refused};
use crate::engine_loop::JobEvent;
use crate::error::ApiError;
use crate::metrics::Finish;
use crate::prompt::chat_prompt;
use crate::request::chat::{parse, ChatRequest, ToolChoice};
use crate::request::parse_json;
use crate::submit::{choices, submit, Submitted};
use crate::tools::{new_call_id, parse_reply, random_id, ParsedCall, ToolDelta, ToolStream};
use crate::AppState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use std::sync::Arc;

pub async fn handle(
    State(st): State<Arc<AppState>>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let (req, forced, sub) = start(&st, b).map_err(|e| refused(&st, e))?;
    if req.gen.stream {
        Ok(
            sse::respond(move |tx| async move { drive(&st, &req, &forced, sub, &tx).await })
                .into_response(),
        )
    } else {
        let mut sub = sub;
        let r = respond(&st, &req, &forced, &mut sub).await;
        if r.is_err() {
            st.metrics.request_finished(Finish::Error);
        }
        r.map(IntoResponse::into_response)
    }
}

fn start(
    st: &Arc<AppState>,
    b: Result<Bytes, BytesRejection>,
) -> Result<(ChatRequest, String, Submitted), ApiError> {
    let v = parse_json(&body(st, b)?)?;
    let req = parse(&v, &st.limits)?;
    let prompt = chat_prompt(st, &req)?;
    let grammar = crate::constraint::chat_grammar(st, &req)?;
    let sub = submit(st, choices(st, &prompt.tokens, &req.gen, grammar.as_ref())?)?;
    Ok((req, prompt.forced, sub))
}

fn tools_on(req: &ChatRequest) -> bool {
    req.tool_choice != ToolChoice::None
}

/// The names of the request's tools: a reply that is bare JSON calling one of them is a
/// call (`tools` module docs).
fn tool_names(req: &ChatRequest) -> Vec<String> {
    req.tools
        .as_ref()
        .and_then(Value::as_array)
        .map(|l| {
            l.iter()
                .filter_map(|t| t.pointer("/function/name").and_then(Value::as_str))
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
}

fn call_json(index: usize, c: &ParsedCall) -> Value {
    json!({
        "index": index,
        "id": new_call_id(),
        "type": "function",
        "function": {"name": c.name, "arguments": c.arguments},
    })
}

async fn respond(
    st: &AppState,
    req: &ChatRequest,
    forced: &str,
    sub: &mut Submitted,
) -> Result<Json<Value>, ApiError> {
    let accs = gather(&mut sub.events, req.gen.n).await?;
    let mut out = Vec::new();
    for (i, a) in accs.iter().enumerate() {
        let text = String::from_utf8_lossy(&a.text).into_owned();
        let mut finish = finish_name(a.finish.expect("gathered"));
        let mut message = json!({"role": "assistant", "content": text});
        if tools_on(req) {
            let full = format!("{forced}{text}");
            // A block the model got wrong is its text, not a server error: the reply is
            // then plain content (what it wrote, forced opening included).
            let (content, calls) =
                parse_reply(&full, &tool_names(req)).unwrap_or_else(|_| (Some(full), Vec::new()));
            if calls.is_empty() {
                message["content"] = json!(content.unwrap_or_default());
            } else {
                finish = "tool_calls";
                message["content"] = content.map_or(Value::Null, Value::String);
                message["tool_calls"] = calls
                    .iter()
                    .enumerate()
                    .map(|(k, c)| {
                        let mut j = call_json(k, c);
                        j.as_object_mut().map(|o| o.remove("index"));
                        j
                    })
                    .collect();
            }
        }
        let logprobs = req
            .gen
            .logprobs
            .map_or(Value::Null, |_| chat_logprobs(st, &a.logprobs));
        out.push(json!({
            "index": i,
            "message": message,
            "logprobs": logprobs,
            "finish_reason": finish,
        }));
        if i == 0 {
            st.metrics.request_finished(finish_metric(finish));
        }
    }
    let (prompt, completion, cached) = totals(&accs);
    Ok(Json(json!({
        "id": random_id("chatcmpl-"),
        "object": "chat.completion",
        "created": collect::unix_now(),
        "model": st.cfg.model_id,
        "choices": out,
        "usage": collect::usage(prompt, completion, cached, &accs),
        "system_fingerprint": "minfer",
    })))
}

/// Usage over the choices of one prompt (its tokens counted once).
fn totals(accs: &[ChoiceAcc]) -> (usize, usize, usize) {
    let prompt = accs.first().map_or(0, |a| a.prompt_tokens);
    let cached = accs.iter().map(|a| a.cached_tokens).min().unwrap_or(0);
    (
        prompt,
        accs.iter().map(|a| a.completion_tokens).sum(),
        cached,
    )
}

/// A streamed choice's text through the tool-call parser. A block the model gets wrong
/// turns the choice into plain content from that block on (its text is the model's, not a
/// server error), as the non-streamed reply does.
struct ToolState {
    parser: Option<ToolStream>,
    /// Everything the model wrote, the forced opening included.
    raw: String,
}

impl ToolState {
    fn new(tools: Option<Vec<String>>, forced: &str) -> ToolState {
        let mut t = ToolState {
            parser: tools.map(ToolStream::with_bare_json),
            raw: String::new(),
        };
        // The forced opening is inside a call: it yields no content.
        t.push(forced);
        t
    }

    fn push(&mut self, piece: &str) -> Vec<ToolDelta> {
        self.raw.push_str(piece);
        let Some(p) = &mut self.parser else {
            return if piece.is_empty() {
                Vec::new()
            } else {
                vec![ToolDelta::Content(piece.to_string())]
            };
        };
        match p.push(piece) {
            Ok(d) => d,
            Err(_) => self.give_up(),
        }
    }

    fn finish(&mut self) -> Vec<ToolDelta> {
        let Some(p) = &mut self.parser else {
            return Vec::new();
        };
        match p.finish() {
            Ok(d) => d,
            Err(_) => self.give_up(),
        }
    }

    /// Plain content from the failing block on.
    fn give_up(&mut self) -> Vec<ToolDelta> {
        self.parser = None;
        let from = self.raw.rfind(crate::prompt::TOOL_CALL_OPEN).unwrap_or(0);
        vec![ToolDelta::Content(self.raw[from..].to_string())]
    }
}

async fn drive(
    st: &AppState,
    req: &ChatRequest,
    forced: &str,
    mut sub: Submitted,
    tx: &SseTx,
) -> Result<(), Gone> {
    let id = random_id("chatcmpl-");
    let created = collect::unix_now();
    let n = req.gen.n;
    let chunk = |choice: usize, delta: Value, logprobs: Value, finish: Value| {
        json!({
            "id": id, "object": "chat.completion.chunk", "created": created,
            "model": st.cfg.model_id, "system_fingerprint": "minfer",
            "choices": [{"index": choice, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
        })
    };
    for i in 0..n {
        send(
            tx,
            &chunk(
                i,
                json!({"role": "assistant", "content": ""}),
                Value::Null,
                Value::Null,
            ),
        )
        .await?;
    }
    let tools = tools_on(req).then(|| tool_names(req));
    let mut parsers: Vec<ToolState> = (0..n)
        .map(|_| ToolState::new(tools.clone(), forced))
        .collect();
    let mut calls = vec![0usize; n];
    let mut accs: Vec<ChoiceAcc> = (0..n).map(|_| ChoiceAcc::default()).collect();
    while !accs.iter().all(ChoiceAcc::is_over) {
        let Some(ev) = sse::next_event(&mut sub.events, tx).await? else {
            let e = ApiError::server("the engine loop stopped");
            send(tx, &e.body()).await?;
            break;
        };
        let text_of = |e: &JobEvent| match e {
            JobEvent::Token { text, .. } | JobEvent::Text { text, .. } => {
                Some(String::from_utf8_lossy(text).into_owned())
            }
            _ => None,
        };
        let text = text_of(&ev);
        let lp = match &ev {
            JobEvent::Token {
                logprob: Some(l), ..
            } => Some(l.clone()),
            _ => None,
        };
        let c = apply(&mut accs, ev);
        if let Some(why) = accs[c].failed.clone() {
            return sse::fail(st, tx, &why).await;
        }
        let logprobs = match &lp {
            Some(l) => chat_logprobs(st, std::slice::from_ref(l)),
            None => Value::Null,
        };
        let mut deltas: Vec<ToolDelta> = Vec::new();
        if let Some(t) = text.filter(|t| !t.is_empty()) {
            deltas = parsers[c].push(&t);
        }
        if accs[c].finish.is_some() {
            deltas.extend(parsers[c].finish());
        }
        let mut lp_sent = false;
        for d in deltas {
            let delta = match d {
                ToolDelta::Content(s) => json!({"content": s}),
                ToolDelta::Call(call) => {
                    calls[c] += 1;
                    json!({"tool_calls": [call_json(calls[c] - 1, &call)]})
                }
            };
            let l = if lp_sent {
                Value::Null
            } else {
                logprobs.clone()
            };
            lp_sent = true;
            send(tx, &chunk(c, delta, l, Value::Null)).await?;
        }
        if !lp_sent && !logprobs.is_null() {
            send(tx, &chunk(c, json!({}), logprobs, Value::Null)).await?;
        }
        if let Some(f) = accs[c].finish {
            let finish = if calls[c] > 0 {
                "tool_calls"
            } else {
                finish_name(f)
            };
            if c == 0 {
                st.metrics.request_finished(finish_metric(finish));
            }
            send(tx, &chunk(c, json!({}), Value::Null, json!(finish))).await?;
        }
    }
    if req.gen.include_usage {
        let (p, c, cached) = totals(&accs);
        let v = json!({
            "id": id, "object": "chat.completion.chunk", "created": created,
            "model": st.cfg.model_id, "system_fingerprint": "minfer",
            "choices": [], "usage": collect::usage(p, c, cached, &accs),
        });
        send(tx, &v).await?;
    }
    sse::done(tx).await
}
