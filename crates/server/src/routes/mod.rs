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
use axum::http::{header, HeaderValue, Method, StatusCode};
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

/// `--cors-origin` (preflights answered, the origin echoed), `--api-key` (every route but
/// [`PUBLIC_ROUTES`]) and draining (503 for new work).
async fn guard(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let cors = cors_origin(&st, &req);
    if cors.is_some() && req.method() == Method::OPTIONS {
        // A preflight carries no credentials by design; it only asks what may be sent.
        return with_cors(preflight(), cors);
    }
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
                return with_cors(ApiError::unauthorized().into_response(), cors);
            }
        }
    }
    if st.draining.load(Ordering::SeqCst) && path != "/metrics" {
        st.metrics.request_rejected(Reject::Draining);
        return with_cors(ApiError::draining().into_response(), cors);
    }
    with_cors(next.run(req).await, cors)
}

/// The request's `Origin` when it is the one `--cors-origin` allows (exact match; without
/// the flag none is, and no CORS header is ever sent: browsers then refuse the call).
fn cors_origin(st: &AppState, req: &Request) -> Option<HeaderValue> {
    let allowed = st.cfg.cors_origin.as_deref()?;
    let origin = req.headers().get(header::ORIGIN)?;
    (origin.as_bytes() == allowed.as_bytes()).then(|| origin.clone())
}

fn preflight() -> Response {
    let mut r = StatusCode::NO_CONTENT.into_response();
    let h = r.headers_mut();
    h.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("GET, POST, OPTIONS"),
    );
    h.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static("authorization, content-type"),
    );
    h.insert(
        header::ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from_static("600"),
    );
    r
}

fn with_cors(mut r: Response, origin: Option<HeaderValue>) -> Response {
    if let Some(o) = origin {
        let h = r.headers_mut();
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, o);
        h.insert(header::VARY, HeaderValue::from_static("Origin"));
    }
    r
}

/// Compares the key a client sent with the server's without an early exit: the time
/// depends on the server key's length only, never on how much of it `given` matches (a
/// byte-by-byte `==` would let a client find the key one byte at a time).
pub fn constant_time_eq(given: &[u8], key: &[u8]) -> bool {
    let mut diff = u8::from(given.len() != key.len());
    for (i, k) in key.iter().enumerate() {
        // Past the end of `given` the key byte is still read, against 0.
        diff |= k ^ given.get(i).copied().unwrap_or(0);
    }
    std::hint::black_box(diff) == 0
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

#[cfg(test)]
mod tests {
    use super::constant_time_eq;

    #[test]
    fn the_key_comparison_accepts_only_the_key() {
        assert!(constant_time_eq(b"sk-secret", b"sk-secret"));
        for wrong in [
            &b""[..],
            b"sk-secre",
            b"sk-secret!",
            b"sk-secreT",
            b"\0sk-secret",
        ] {
            assert!(!constant_time_eq(wrong, b"sk-secret"), "{wrong:?}");
        }
        // A prefix padded with NULs must not pass as the key's remaining bytes compared to 0.
        assert!(!constant_time_eq(b"ab", b"ab\0"));
    }
}
