//! Issue 37 (3): the server's size limits at the exact boundary, one under and one over:
//! the request body (`body_limit` bytes: the limit itself is accepted, one more byte is a
//! 413), the prompt (n_ctx − 1 tokens run, n_ctx are refused: a prompt must leave room for
//! a token), `max_tokens` (with the prompt, n_ctx accepted, n_ctx + 1 refused), `n` (up to
//! --parallel),
//! `top_logprobs` / `logprobs` (20), `logit_bias` ids (below the vocabulary), `stop` strings
//! (16) and `repeat_last_n` (n_ctx). Every limit's value is written here, not read from the
//! server's constants. On a synthetic model, so it runs everywhere.
//!
//! Control: the prompt check `tokens.len() >= n_ctx` made `>` lets the n_ctx-token prompt
//! through and this test fails (in `scripts/mutants`).

mod common;

use axum::http::{Method, StatusCode};
use common::{assert_error_shape, post, send};
use minfer_engine::{Engine, EngineConfig};
use minfer_models::synth::{write_synth, SynthSpec};
use minfer_models::Arch;
use minfer_server::{AppState, ServeConfig};
use serde_json::{json, Value};

const N_CTX: usize = 64;
const BODY_LIMIT: usize = 4096;
const PARALLEL: usize = 3;
/// The built-in tokenizer's size (256 bytes, 37 merges, 3 control tokens).
const VOCAB: usize = 296;

fn app() -> axum::Router {
    let dir = std::env::temp_dir().join(format!("minfer-limits-exact-{}", std::process::id()));
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
            n_ctx: N_CTX,
            ..Default::default()
        },
    )
    .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let state = AppState::start(
        engine,
        ServeConfig {
            parallel: PARALLEL,
            body_limit: BODY_LIMIT,
            ..Default::default()
        },
    )
    .unwrap();
    minfer_server::app(state)
}

/// A completion of one token with `extra` fields.
fn one(extra: Value) -> Value {
    let mut b = json!({"prompt": "Hello", "max_tokens": 1, "temperature": 0});
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

async fn status(app: &axum::Router, path: &str, body: &Value) -> (StatusCode, Value) {
    let r = post(app, path, body).await;
    let v = r.json();
    if !r.status.is_success() {
        assert_error_shape(&v);
    }
    (r.status, v)
}

/// `accepted` must succeed, `refused` must be a 400 naming `param`.
async fn edge(app: &axum::Router, path: &str, accepted: Value, refused: Value, param: &str) {
    let (s, v) = status(app, path, &accepted).await;
    assert_eq!(s, StatusCode::OK, "accepted {accepted}: {v}");
    let (s, v) = status(app, path, &refused).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "refused {refused}: {v}");
    assert_eq!(
        v["error"]["param"].as_str(),
        Some(param),
        "refused {refused}: {v}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_limit_holds_at_its_exact_value() {
    let app = app();
    let cmpl = "/v1/completions";
    let chat = "/v1/chat/completions";

    // The body: exactly BODY_LIMIT bytes (JSON padded with trailing spaces), then one more.
    let base = one(json!({})).to_string();
    for (len, want) in [
        (BODY_LIMIT - 1, StatusCode::OK),
        (BODY_LIMIT, StatusCode::OK),
        (BODY_LIMIT + 1, StatusCode::PAYLOAD_TOO_LARGE),
    ] {
        let body = format!("{base}{}", " ".repeat(len - base.len()));
        assert_eq!(body.len(), len);
        let r = send(
            &app,
            Method::POST,
            cmpl,
            &[("content-type", "application/json")],
            body,
        )
        .await;
        assert_eq!(r.status, want, "a body of {len} bytes: {}", r.text());
        if want != StatusCode::OK {
            assert_error_shape(&r.json());
        }
    }

    // The prompt, as token ids: n_ctx - 1 leave room for one token, n_ctx do not.
    let ids = |n: usize| json!((0..n).map(|i| 50 + (i % 200)).collect::<Vec<_>>());
    let (s, v) = status(&app, cmpl, &one(json!({"prompt": ids(N_CTX - 1)}))).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["usage"]["prompt_tokens"], N_CTX - 1);
    let (s, v) = status(&app, cmpl, &one(json!({"prompt": ids(N_CTX)}))).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["error"]["code"], "context_length_exceeded", "{v}");
    // And through the chat template: the accepted side is checked by the prompt size the
    // reply reports, the refused one by the code.
    let (s, v) = status(
        &app,
        chat,
        &json!({"messages": [{"role": "user", "content": "x".repeat(4 * N_CTX)}], "max_tokens": 1}),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["error"]["code"], "context_length_exceeded", "{v}");

    let n_ctx = N_CTX as i64;
    // A prompt and max_tokens together fill at most the context (tests/kv_capacity.rs has
    // the message).
    edge(
        &app,
        cmpl,
        one(json!({"max_tokens": n_ctx - 10, "prompt": ids(10)})),
        one(json!({"max_tokens": n_ctx - 9, "prompt": ids(10)})),
        "max_tokens",
    )
    .await;
    edge(
        &app,
        cmpl,
        one(json!({"n": PARALLEL, "temperature": 1.0})),
        one(json!({"n": PARALLEL + 1})),
        "n",
    )
    .await;
    edge(
        &app,
        cmpl,
        one(json!({"logprobs": 20})),
        one(json!({"logprobs": 21})),
        "logprobs",
    )
    .await;
    let msgs = json!([{"role": "user", "content": "hi"}]);
    let stops = |n: usize| json!((0..n).map(|i| format!("zz{i}")).collect::<Vec<_>>());
    edge(
        &app,
        chat,
        json!({"messages": msgs, "max_tokens": 1, "logprobs": true, "top_logprobs": 20}),
        json!({"messages": msgs, "max_tokens": 1, "logprobs": true, "top_logprobs": 21}),
        "top_logprobs",
    )
    .await;
    edge(
        &app,
        cmpl,
        one(json!({"logit_bias": {(VOCAB - 1).to_string(): -1.0}})),
        one(json!({"logit_bias": {VOCAB.to_string(): -1.0}})),
        "logit_bias",
    )
    .await;
    edge(
        &app,
        cmpl,
        one(json!({"stop": stops(16)})),
        one(json!({"stop": stops(17)})),
        "stop",
    )
    .await;
    edge(
        &app,
        cmpl,
        one(json!({"repeat_last_n": n_ctx})),
        one(json!({"repeat_last_n": n_ctx + 1})),
        "repeat_last_n",
    )
    .await;
}
