//! `minfer viz`: one process serving a page that shows the model's graph run.
//!
//! - `GET /` (and `/viz`): the page, one self-contained HTML file (inline JS and SVG, no
//!   external assets).
//! - `GET /viz/graph`: the decode graph ([`minfer_engine::Engine::graph_viz`]), or in replay
//!   mode the nodes a saved trace names ([`replay`]).
//! - `GET /viz/events`: server-sent events, one JSON object each: `hello`, then per run
//!   `run_start`, `step` (a forward's per-node stats, the trace format's phase), `token`,
//!   `run_end` or `error` (docs/TRACE.md, "minfer viz").
//! - `POST /viz/run {prompt, max_tokens, temperature}`: 202, then the run's events on the
//!   stream; 409 while one runs, 400 naming a bad field.
//!
//! Capture is armed for a run only while at least one page holds the event stream
//! (a live run with nobody watching pays nothing); the engine runs on its own thread
//! ([`live`]).

pub mod live;
pub mod replay;

use crate::error::ApiError;
use axum::extract::rejection::JsonRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::StreamExt;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::broadcast;

/// The page, embedded at build time.
pub const PAGE_HTML: &str = include_str!("page.html");

/// Most tokens one run may ask for.
pub const MAX_TOKENS: u64 = 1024;

/// Events kept for a slow page before it misses some (it is told: `lagged`). A step of a
/// 30-layer model is ~0.6 MB of JSON (measured on a synthetic SmolLM2-deep model), so this
/// bounds what a stalled page holds to ~40 MB.
const EVENT_BUFFER: usize = 64;

/// A validated `POST /viz/run` body.
#[derive(Clone, Debug, PartialEq)]
pub struct RunRequest {
    pub id: u64,
    pub prompt: String,
    pub max_tokens: usize,
    pub temperature: f32,
    /// Capture armed: a page held the event stream when the run was asked for.
    pub armed: bool,
}

/// Where runs come from.
enum Source {
    /// A loaded model on the engine thread.
    Live(Mutex<std::sync::mpsc::Sender<RunRequest>>),
    /// A saved trace: a run replays its phases.
    Replay(Arc<Value>),
}

pub struct VizState {
    /// `GET /viz/graph`'s body.
    pub graph: Value,
    /// What `hello` says: the mode and the model.
    hello: Value,
    events: broadcast::Sender<String>,
    source: Source,
    /// A run is in progress.
    busy: Arc<AtomicBool>,
    next_id: AtomicU64,
    /// Runs that had capture armed (the engine thread counts them).
    captured: Arc<AtomicU64>,
}

impl VizState {
    /// Pages holding the event stream now.
    pub fn pages(&self) -> usize {
        self.events.receiver_count()
    }

    /// Whether a run is in progress.
    pub fn busy(&self) -> bool {
        self.busy.load(Ordering::SeqCst)
    }

    /// How many runs so far had capture armed.
    pub fn captured_runs(&self) -> u64 {
        self.captured.load(Ordering::SeqCst)
    }

    fn new(graph: Value, hello: Value, source: Source) -> (VizState, Arc<AtomicBool>) {
        let busy = Arc::new(AtomicBool::new(false));
        let (events, _) = broadcast::channel(EVENT_BUFFER);
        let st = VizState {
            graph,
            hello,
            events,
            source,
            busy: busy.clone(),
            next_id: AtomicU64::new(1),
            captured: Arc::new(AtomicU64::new(0)),
        };
        (st, busy)
    }
}

/// Sends one event to every page (none connected: dropped, as nobody would see it).
fn emit(events: &broadcast::Sender<String>, v: Value) {
    let _ = events.send(v.to_string());
}

pub fn app(state: Arc<VizState>) -> Router {
    Router::new()
        .route("/", get(page))
        .route("/viz", get(page))
        .route("/viz/graph", get(graph))
        .route("/viz/events", get(events))
        .route("/viz/run", post(run))
        .fallback(
            |req: axum::extract::Request| async move { ApiError::not_found(req.uri().path()) },
        )
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed() })
        .with_state(state)
}

/// Serves `state` on `listener` until the process ends (Ctrl-C: no drain, since an open
/// page holds its event stream for ever and there is nothing to save).
pub async fn serve(state: Arc<VizState>, listener: tokio::net::TcpListener) -> std::io::Result<()> {
    axum::serve(listener, app(state)).await
}

async fn page() -> Html<&'static str> {
    Html(PAGE_HTML)
}

async fn graph(State(st): State<Arc<VizState>>) -> Json<Value> {
    Json(st.graph.clone())
}

async fn events(State(st): State<Arc<VizState>>) -> impl IntoResponse {
    let rx = st.events.subscribe();
    let hello = json!({"type": "hello", "busy": st.busy.load(Ordering::SeqCst)});
    let mut hello_obj = st.hello.clone();
    if let (Some(h), Some(extra)) = (hello_obj.as_object_mut(), hello.as_object()) {
        h.extend(extra.clone());
    }
    let first = futures_util::stream::once(async move { hello_obj.to_string() });
    let rest = tokio_stream::wrappers::BroadcastStream::new(rx).map(|m| match m {
        Ok(s) => s,
        Err(tokio_stream::wrappers::errors::BroadcastStreamRecvError::Lagged(n)) => {
            json!({"type": "lagged", "missed": n}).to_string()
        }
    });
    let stream = first
        .chain(rest)
        .map(|s| Ok::<_, Infallible>(Event::default().data(s)));
    // Keep-alive comments let the server notice a closed page soon (its receiver then
    // drops, and the next run is not captured for nobody).
    Sse::new(stream).keep_alive(KeepAlive::new().interval(std::time::Duration::from_secs(2)))
}

/// Parses and checks a `POST /viz/run` body; every refusal names the field.
pub fn parse_run(body: &Value, replay: bool) -> Result<(String, usize, f32), ApiError> {
    let obj = body
        .as_object()
        .ok_or_else(|| ApiError::bad_request("the body must be a JSON object"))?;
    if let Some(k) = obj
        .keys()
        .find(|k| !["prompt", "max_tokens", "temperature"].contains(&k.as_str()))
    {
        return Err(ApiError::bad_field(
            k,
            format!("unknown field \"{k}\" (want prompt, max_tokens, temperature)"),
        ));
    }
    let prompt = match obj.get("prompt") {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        None if replay => String::new(),
        Some(Value::String(_)) => {
            return Err(ApiError::bad_field("prompt", "\"prompt\" is empty"));
        }
        Some(_) => return Err(ApiError::bad_field("prompt", "\"prompt\" is not a string")),
        None => return Err(ApiError::bad_field("prompt", "\"prompt\" is missing")),
    };
    let max_tokens = match obj.get("max_tokens") {
        None => 32,
        Some(v) => match v.as_u64() {
            Some(n) if (1..=MAX_TOKENS).contains(&n) => n as usize,
            _ => {
                return Err(ApiError::bad_field(
                    "max_tokens",
                    format!("\"max_tokens\" {v}: want an integer from 1 to {MAX_TOKENS}"),
                ))
            }
        },
    };
    let temperature = match obj.get("temperature") {
        None => 0.0,
        Some(v) => match v.as_f64() {
            Some(t) if (0.0..=2.0).contains(&t) => t as f32,
            _ => {
                return Err(ApiError::bad_field(
                    "temperature",
                    format!("\"temperature\" {v}: want a number from 0 to 2"),
                ))
            }
        },
    };
    Ok((prompt, max_tokens, temperature))
}

async fn run(
    State(st): State<Arc<VizState>>,
    body: Result<Json<Value>, JsonRejection>,
) -> Response {
    let Json(body) = match body {
        Ok(b) => b,
        Err(e) => return ApiError::bad_request(format!("not a JSON body: {e}")).into_response(),
    };
    let replay = matches!(st.source, Source::Replay(_));
    let (prompt, max_tokens, temperature) = match parse_run(&body, replay) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    if st
        .busy
        .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
        .is_err()
    {
        return ApiError::conflict("a run is in progress; wait for its run_end event")
            .into_response();
    }
    let id = st.next_id.fetch_add(1, Ordering::SeqCst);
    // Armed only while a page watches: a run nobody sees captures nothing.
    let armed = st.pages() > 0;
    let req = RunRequest {
        id,
        prompt,
        max_tokens,
        temperature,
        armed,
    };
    match &st.source {
        Source::Live(tx) => {
            let sent = tx.lock().map(|tx| tx.send(req)).map_err(|_| ());
            if !matches!(sent, Ok(Ok(()))) {
                st.busy.store(false, Ordering::SeqCst);
                return ApiError::server("the engine thread has stopped").into_response();
            }
        }
        Source::Replay(doc) => {
            tokio::spawn(replay::play(
                doc.clone(),
                req,
                st.events.clone(),
                st.busy.clone(),
            ));
        }
    }
    (
        StatusCode::ACCEPTED,
        Json(json!({"run": id, "armed": armed, "mode": if replay { "replay" } else { "live" }})),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::PAGE_HTML;

    #[test]
    fn the_page_has_the_ids_the_browser_test_uses() {
        for id in [
            "graph",
            "pipeline",
            "run",
            "prompt",
            "max-tokens",
            "temperature",
            "tokens",
            "run-stats",
            "step-slider",
            "step-prev",
            "step-next",
            "step-play",
            "step-label",
            "f-kv",
            "f-io",
            "f-attn",
            "f-ffn",
            "view-graph",
            "view-pipeline",
            "inspector",
            "inspector-back",
            "insp-name",
            "insp-op",
            "insp-stats",
            "insp-inputs",
            "sparkline",
            "status",
            "error",
        ] {
            assert!(
                PAGE_HTML.contains(&format!("id=\"{id}\"")),
                "the page lost #{id}"
            );
        }
    }

    /// No external asset, and no HTML built from strings (every text goes in through
    /// textContent, so token text and node names cannot inject markup).
    #[test]
    fn the_page_is_self_contained_and_sets_no_html() {
        let lower = PAGE_HTML.to_ascii_lowercase();
        for banned in [
            "<script src",
            "@import",
            "url(",
            "src=\"http",
            "href=\"http",
            "src=\"//",
            "href=\"//",
            "innerhtml",
            "outerhtml",
            "insertadjacenthtml",
            "document.write",
        ] {
            assert!(!lower.contains(banned), "the page has {banned}");
        }
        // The one <link> is the empty inline icon (no favicon request, no console 404).
        assert_eq!(lower.matches("<link").count(), 1);
        assert!(PAGE_HTML.contains(r#"<link rel="icon" href="data:,">"#));
    }
}
