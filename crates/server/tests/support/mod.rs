//! In-process server for the serving tests: the router called without a socket.

#![allow(dead_code)]

#[path = "../common/openai_spec.rs"]
pub mod openai_spec;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use minfer_engine::{Engine, EngineConfig};
use minfer_server::{app, AppState, ServeConfig};
use serde_json::Value;
use std::path::Path;
use std::sync::Arc;
use tower::ServiceExt;

pub struct Server {
    pub state: Arc<AppState>,
    pub app: Router,
}

pub fn start(model: &Path, n_ctx: usize, cfg: ServeConfig) -> Server {
    let engine = Engine::load(
        model,
        EngineConfig {
            n_ctx,
            threads: 2,
            ..EngineConfig::default()
        },
    )
    .expect("load the model");
    let state = AppState::start(engine, cfg).expect("start the server");
    let app = app(state.clone());
    Server { state, app }
}

impl Server {
    pub async fn request(&self, method: &str, path: &str, body: &str) -> (StatusCode, Vec<u8>) {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", "application/json")
            .body(Body::from(body.to_string()))
            .unwrap();
        let resp = self.app.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        (status, bytes.to_vec())
    }

    pub async fn post(&self, path: &str, body: &Value) -> (StatusCode, Value) {
        let (s, b) = self.request("POST", path, &body.to_string()).await;
        let v = serde_json::from_slice(&b)
            .unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {}", String::from_utf8_lossy(&b)));
        openai_spec::check_body(&v);
        (s, v)
    }

    /// A streamed request's `data:` payloads, in order (`[DONE]` included).
    pub async fn stream(&self, path: &str, body: &Value) -> (StatusCode, Vec<String>) {
        let (s, b) = self.request("POST", path, &body.to_string()).await;
        let text = String::from_utf8(b).expect("SSE is UTF-8");
        let mut out = Vec::new();
        for event in text.split("\n\n").filter(|e| !e.trim().is_empty()) {
            for line in event.lines() {
                if let Some(d) = line.strip_prefix("data: ") {
                    out.push(d.to_string());
                } else if !line.starts_with(':') {
                    panic!("not an SSE data line: {line:?}");
                }
            }
        }
        // A whole stream (ended by [DONE]) is held to OpenAI's chunk shapes.
        if let Some((_, json)) = out.split_last().filter(|(d, _)| *d == "[DONE]") {
            let v: Vec<Value> = json
                .iter()
                .map(|e| serde_json::from_str(e).unwrap_or_else(|x| panic!("event {e:?}: {x}")))
                .collect();
            openai_spec::check_stream(&v);
        }
        (s, out)
    }

    pub async fn metric(&self, name: &str) -> f64 {
        let (_, b) = self.request("GET", "/metrics", "").await;
        let text = String::from_utf8(b).unwrap();
        text.lines()
            .find_map(|l| {
                let (k, v) = l.split_once(' ')?;
                (k == name).then(|| v.trim().parse().ok())?
            })
            .unwrap_or_else(|| panic!("metric {name} missing"))
    }
}

/// The concatenated `delta.content` of a streamed chat, per choice index.
pub fn chat_stream_text(events: &[String], n: usize) -> Vec<String> {
    let mut out = vec![String::new(); n];
    for e in events.iter().filter(|e| *e != "[DONE]") {
        let v: Value = serde_json::from_str(e).unwrap();
        for c in v["choices"].as_array().unwrap() {
            let i = c["index"].as_u64().unwrap() as usize;
            if let Some(t) = c["delta"]["content"].as_str() {
                out[i].push_str(t);
            }
        }
    }
    out
}

pub fn chat(content: &str, max_tokens: usize) -> Value {
    serde_json::json!({
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
    })
}
