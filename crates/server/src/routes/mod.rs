//! The router: routes, the API-key and draining guard, JSON errors for unknown routes,
//! wrong methods and oversized bodies.

mod chat;
mod collect;
mod completions;
mod misc;
mod sse;

use crate::error::ApiError;
use crate::metrics::Reject;
use crate::AppState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub fn app(state: Arc<AppState>) -> Router {
    let limit = state.cfg.body_limit;
    Router::new()
        .route("/", get(crate::page::index))
        .route("/health", get(misc::health))
        .route("/metrics", get(misc::metrics))
        .route("/v1/models", get(misc::models))
        .route("/v1/chat/completions", post(chat::handle))
        .route("/v1/completions", post(completions::handle))
        .route("/tokenize", post(misc::tokenize))
        .route("/detokenize", post(misc::detokenize))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), guard))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}

async fn not_found(req: Request) -> ApiError {
    ApiError::not_found(req.uri().path())
}

async fn method_not_allowed() -> ApiError {
    ApiError::method_not_allowed()
}

/// The routes `--api-key` leaves open: `/health`, and the chat page at `/` (static; its own
/// key field sends the key with each API call the page makes).
pub const PUBLIC_ROUTES: [&str; 2] = ["/health", "/"];

/// `--api-key` (every route but [`PUBLIC_ROUTES`]) and draining (503 for new work).
async fn guard(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let path = req.uri().path();
    if let Some(key) = &st.cfg.api_key {
        if !PUBLIC_ROUTES.contains(&path) {
            let ok = req
                .headers()
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .is_some_and(|k| constant_time_eq(k.trim().as_bytes(), key.as_bytes()));
            if !ok {
                st.metrics.request_rejected(Reject::Unauthorized);
                return ApiError::unauthorized().into_response();
            }
        }
    }
    if st.draining.load(Ordering::SeqCst) && path != "/metrics" {
        st.metrics.request_rejected(Reject::Draining);
        return ApiError::draining().into_response();
    }
    next.run(req).await
}

/// Compares keys without an early exit, so timing does not reveal a matching prefix.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The body of a POST, or the JSON error for one too large or unreadable.
pub(crate) fn body(st: &AppState, b: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    st.metrics.request_received();
    b.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            st.metrics.request_rejected(Reject::TooLarge);
            ApiError::too_large(st.cfg.body_limit)
        } else {
            ApiError::bad_request(format!("cannot read the request body: {e}"))
        }
    })
}

/// Counts a refused request.
pub(crate) fn refused(st: &AppState, e: ApiError) -> ApiError {
    if e.status.is_client_error() {
        st.metrics.request_rejected(Reject::BadRequest);
    }
    e
}
