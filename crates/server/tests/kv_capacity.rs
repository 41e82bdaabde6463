//! Issue 29 (3): running out of KV cells is a clear refusal per request, never a crash nor a
//! hang. On a synthetic model (CPU), so it runs everywhere:
//! - a prompt and `max_tokens` that together pass one sequence's context are a 400
//!   `context_length_exceeded` naming the sizes, before anything runs (control: the request
//!   that fits exactly runs);
//! - under load, a reply whose cells the other sequences took is ended with a 503
//!   `kv_cache_full` (an error event in a stream) saying how far it got, the others finish,
//!   and the server goes on serving (control: the same load over a context that holds every
//!   reply finishes every one with its full `max_tokens`, so the failures are the cells').

mod common;

use axum::http::StatusCode;
use common::{assert_error_shape, post, sse_events};
use minfer_engine::{Engine, EngineConfig};
use minfer_models::synth::{write_synth, SynthSpec};
use minfer_models::Arch;
use minfer_server::{AppState, ServeConfig};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

const PARALLEL: usize = 4;
/// Prompt tokens and tokens asked of each reply under load: one fits a context of 64, four
/// at once do not.
const PROMPT: usize = 8;
const REPLY: usize = 56;

fn app(n_ctx: usize, tag: &str) -> (axum::Router, Arc<AppState>) {
    let dir = std::env::temp_dir().join(format!("minfer-kv-cap-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("m.gguf");
    write_synth(
        &SynthSpec::new(Arch::Qwen2, 1, 64, 4, 2, 128),
        &path,
        &mut |_, _| {},
    )
    .unwrap();
    let engine = Engine::load(
        &path,
        EngineConfig {
            n_ctx,
            ..Default::default()
        },
    )
    .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let state = AppState::start(
        engine,
        ServeConfig {
            parallel: PARALLEL,
            ..Default::default()
        },
    )
    .unwrap();
    (minfer_server::app(state.clone()), state)
}

/// `n` prompt token ids starting at `from` (distinct prompts share no prefix).
fn ids(from: usize, n: usize) -> Value {
    json!((0..n).map(|i| 50 + from + i).collect::<Vec<_>>())
}

/// A greedy completion of `max_tokens` with every end-of-generation token banned, so a
/// reply runs until `max_tokens` or its cells give out.
fn completion(state: &AppState, prompt: Value, max_tokens: usize, stream: bool) -> Value {
    let bias: serde_json::Map<String, Value> = state
        .eog
        .iter()
        .map(|id| (id.to_string(), json!(-100)))
        .collect();
    json!({
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "logit_bias": bias,
        "stream": stream,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_and_max_tokens_past_the_context_are_refused_naming_the_sizes() {
    const N_CTX: usize = 64;
    let (app, state) = app(N_CTX, "refuse");
    // Control: a prompt of 10 and max_tokens 54 fill the 64 positions exactly and run.
    let fits = completion(&state, ids(0, 10), N_CTX - 10, false);
    let r = post(&app, "/v1/completions", &fits).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.json()["usage"]["completion_tokens"], N_CTX - 10);
    // One more token is refused before it runs, naming the sizes.
    let over = completion(&state, ids(0, 10), N_CTX - 9, false);
    let r = post(&app, "/v1/completions", &over).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text());
    let v = r.json();
    assert_eq!(assert_error_shape(&v).as_deref(), Some("max_tokens"));
    assert_eq!(v["error"]["code"], "context_length_exceeded", "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    for figure in [
        "10 tokens",
        "55 more",
        "65 in all",
        "at most 64 tokens",
        "at most 54",
    ] {
        assert!(msg.contains(figure), "{figure:?} not in {msg:?}");
    }
    // The same through chat (the rendered prompt's size is the server's to count).
    let r = post(
        &app,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": N_CTX}),
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "context_length_exceeded");
    // Without max_tokens the reply runs until the context is full: accepted.
    let mut open = completion(&state, ids(0, 10), 0, false);
    open.as_object_mut().unwrap().remove("max_tokens");
    let r = post(&app, "/v1/completions", &open).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.json()["usage"]["completion_tokens"], N_CTX - 10);
}

/// What became of one reply under load.
#[derive(Debug, PartialEq)]
enum Outcome {
    /// Finished with this many tokens.
    Done(usize),
    /// Ended for want of cells, with the error's message.
    KvFull(String),
}

async fn one_reply(app: axum::Router, body: Value, stream: bool) -> Outcome {
    let r = post(&app, "/v1/completions", &body).await;
    if !stream {
        if r.status == StatusCode::OK {
            return Outcome::Done(r.json()["usage"]["completion_tokens"].as_u64().unwrap() as usize);
        }
        let v = r.json();
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{v}");
        assert_error_shape(&v);
        assert_eq!(v["error"]["code"], "kv_cache_full", "{v}");
        assert!(r.headers.contains_key("retry-after"), "no Retry-After: {v}");
        return Outcome::KvFull(v["error"]["message"].as_str().unwrap().to_string());
    }
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let mut events = sse_events(&r.body);
    assert_eq!(events.pop().as_deref(), Some("[DONE]"), "{events:?}");
    let last: Value = serde_json::from_str(events.last().expect("an event")).unwrap();
    if last.get("error").is_some() {
        assert_error_shape(&last);
        assert_eq!(last["error"]["code"], "kv_cache_full", "{last}");
        return Outcome::KvFull(last["error"]["message"].as_str().unwrap().to_string());
    }
    let tokens = events
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .filter(|e| {
            e["choices"][0]["text"]
                .as_str()
                .is_some_and(|t| !t.is_empty())
        })
        .count();
    Outcome::Done(tokens)
}

/// Four replies at once over `n_ctx` cells; each waits at most a minute (a hang fails).
async fn load(n_ctx: usize, stream: bool, tag: &str) -> (Vec<Outcome>, axum::Router) {
    let (app, state) = app(n_ctx, tag);
    let handles: Vec<_> = (0..PARALLEL)
        .map(|i| {
            let body = completion(&state, ids(40 * i, PROMPT), REPLY, stream);
            tokio::spawn(one_reply(app.clone(), body, stream))
        })
        .collect();
    let mut out = Vec::new();
    for h in handles {
        let o = tokio::time::timeout(Duration::from_secs(60), h)
            .await
            .expect("a reply hung")
            .expect("the request task panicked");
        out.push(o);
    }
    (out, app)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_out_of_cells_under_load_ends_a_reply_with_a_clear_error() {
    // Control: 4 × (8 + 56) cells fit 256, so every reply runs to max_tokens (EOG banned).
    let (all, _) = load(256, false, "roomy").await;
    assert!(
        all.iter().all(|o| *o == Outcome::Done(REPLY)),
        "with room for all: {all:?}"
    );
    for stream in [false, true] {
        let tag = if stream { "tight-sse" } else { "tight" };
        let (out, app) = load(PROMPT + REPLY, stream, tag).await;
        let full: Vec<&String> = out
            .iter()
            .filter_map(|o| match o {
                Outcome::KvFull(m) => Some(m),
                Outcome::Done(_) => None,
            })
            .collect();
        assert!(!full.is_empty(), "stream {stream}: nobody ran out: {out:?}");
        for m in &full {
            assert!(m.starts_with(minfer_server::engine_loop::KV_FULL), "{m}");
            assert!(m.contains("tokens of a 8-token prompt"), "{m}");
        }
        // The server goes on: a request alone after the load runs.
        let r = post(
            &app,
            "/v1/completions",
            &json!({"prompt": ids(0, PROMPT), "max_tokens": 4, "temperature": 0}),
        )
        .await;
        assert_eq!(r.status, StatusCode::OK, "after the load: {}", r.text());
    }
}
