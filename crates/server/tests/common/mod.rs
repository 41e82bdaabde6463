//! Helpers shared by the server's integration tests: an app over a real model, requests
//! sent in-process (`tower::ServiceExt::oneshot`, no socket), JSON and SSE bodies read back.
#![allow(dead_code)]

pub mod openai_spec;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Method, Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use minfer_engine::{Engine, EngineConfig};
use minfer_server::{AppState, ServeConfig};
use serde_json::Value;
use std::path::Path;
use std::sync::Arc;
use tower::ServiceExt;

/// The context the tests' engines get.
pub const N_CTX: usize = 2048;

/// An app state over the model at `path`, with a context of [`N_CTX`] tokens.
pub fn state_with(path: &Path, cfg: ServeConfig) -> Arc<AppState> {
    let engine = Engine::load(
        path,
        EngineConfig {
            n_ctx: N_CTX,
            ..Default::default()
        },
    )
    .expect("load the model");
    AppState::start(engine, cfg).expect("start the engine loop")
}

/// [`state_with`] the default [`ServeConfig`] but for 4 parallel sequences.
pub fn state(path: &Path) -> Arc<AppState> {
    state_with(
        path,
        ServeConfig {
            parallel: 4,
            ..Default::default()
        },
    )
}

/// One response, whole.
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    /// The body as JSON; panics (naming the body) when it is not.
    pub fn json(&self) -> Value {
        let v = serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "status {}: body is not JSON ({e}): {:?}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        });
        openai_spec::check_body(&v);
        v
    }

    pub fn content_type(&self) -> &str {
        self.headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Sends a request with a raw body and reads the whole response.
pub async fn send(
    app: &Router,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: impl Into<Body>,
) -> Reply {
    let mut b = Request::builder().method(method).uri(path);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let req = b.body(body.into()).expect("a valid request");
    let resp = app
        .clone()
        .oneshot(req)
        .await
        .expect("the router is infallible");
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.expect("read the body").to_bytes();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}

/// POSTs `body` as JSON.
pub async fn post(app: &Router, path: &str, body: &Value) -> Reply {
    send(
        app,
        Method::POST,
        path,
        &[("content-type", "application/json")],
        body.to_string(),
    )
    .await
}

/// POSTs `body` as JSON and returns the status and the JSON reply.
pub async fn post_json(app: &Router, path: &str, body: &Value) -> (StatusCode, Value) {
    let r = post(app, path, body).await;
    (r.status, r.json())
}

/// One server-sent event of a body: its `data` lines joined (other fields are dropped).
/// Panics when the body is not `data: …` events each ended by a blank line.
pub fn sse_events(body: &[u8]) -> Vec<String> {
    let text = std::str::from_utf8(body).expect("an SSE body is UTF-8");
    assert!(
        text.is_empty() || text.ends_with("\n\n"),
        "an SSE body ends with a blank line: {text:?}"
    );
    let mut events = Vec::new();
    for block in text.split("\n\n").filter(|b| !b.is_empty()) {
        let mut data: Vec<&str> = Vec::new();
        for line in block.lines() {
            if let Some(d) = line.strip_prefix("data:") {
                data.push(d.strip_prefix(' ').unwrap_or(d));
            } else {
                // Comments (keep-alives) and the other fields carry no data.
                assert!(
                    line.starts_with(':')
                        || ["event:", "id:", "retry:"]
                            .iter()
                            .any(|f| line.starts_with(f)),
                    "not an SSE line: {line:?}"
                );
            }
        }
        if !data.is_empty() {
            events.push(data.join("\n"));
        }
    }
    events
}

/// The JSON events of an SSE body, which must end with `[DONE]` (not included).
pub fn sse_json(body: &[u8]) -> Vec<Value> {
    let mut ev = sse_events(body);
    assert_eq!(
        ev.pop().as_deref(),
        Some("[DONE]"),
        "a stream ends with [DONE]"
    );
    let v: Vec<Value> = ev
        .iter()
        .map(|e| serde_json::from_str(e).unwrap_or_else(|x| panic!("event {e:?}: {x}")))
        .collect();
    openai_spec::check_stream(&v);
    v
}

/// A chat request for a few greedy tokens.
pub fn small_chat(text: &str, max_tokens: usize) -> Value {
    serde_json::json!({
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "temperature": 0,
    })
}

/// Asserts `v` is an OpenAI error body and returns its `param`.
pub fn assert_error_shape(v: &Value) -> Option<String> {
    let e = v
        .get("error")
        .and_then(Value::as_object)
        .unwrap_or_else(|| panic!("no `error` object: {v}"));
    let msg = e.get("message").and_then(Value::as_str);
    assert!(
        msg.is_some_and(|m| !m.trim().is_empty()),
        "error.message must be a non-empty string: {v}"
    );
    assert!(
        e.get("type").is_some_and(Value::is_string),
        "error.type must be a string: {v}"
    );
    for k in ["param", "code"] {
        let x = e
            .get(k)
            .unwrap_or_else(|| panic!("error.{k} is missing: {v}"));
        assert!(
            x.is_string() || x.is_null(),
            "error.{k} must be a string or null: {v}"
        );
    }
    e["param"].as_str().map(str::to_string)
}
