//! API errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}` with the
//! HTTP status that goes with them.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    /// OpenAI's `type`: `invalid_request_error`, `authentication_error`, `server_error`, …
    pub kind: &'static str,
    pub message: String,
    /// The request field at fault, when there is one.
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// Seconds for a `Retry-After` header (503s).
    pub retry_after: Option<u64>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            kind,
            message: message.into(),
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// 400: the request as a whole is wrong (bad JSON, …).
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// 400 naming the field at fault.
    pub fn bad_field(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            param: Some(param.to_string()),
            ..ApiError::bad_request(message)
        }
    }

    pub fn with_code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }

    pub fn unauthorized() -> ApiError {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "missing or wrong API key: send `Authorization: Bearer KEY`",
        )
        .with_code("invalid_api_key")
    }

    pub fn not_found(what: &str) -> ApiError {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("{what}: no such route"),
        )
        .with_code("not_found")
    }

    pub fn method_not_allowed() -> ApiError {
        ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            "this route does not take that method",
        )
    }

    pub fn too_large(limit: usize) -> ApiError {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("the request body is larger than the server's limit of {limit} bytes"),
        )
        .with_code("body_too_large")
    }

    /// 503 with `Retry-After`: the queue is full.
    pub fn queue_full(queue: usize) -> ApiError {
        ApiError {
            retry_after: Some(1),
            ..ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable_error",
                format!("the server is busy: {queue} requests are queued already (--queue)"),
            )
            .with_code("queue_full")
        }
    }

    /// 503: the server is shutting down.
    /// A request the server had queued when its drain timeout ran out (or a second signal
    /// came): never started, 503.
    pub fn shut_down() -> ApiError {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable_error",
            crate::engine_loop::SHUTDOWN_MESSAGE,
        )
        .with_code("shutdown")
    }

    pub fn draining() -> ApiError {
        ApiError {
            retry_after: Some(5),
            ..ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable_error",
                "the server is shutting down and takes no new requests",
            )
            .with_code("draining")
        }
    }

    /// 409: the request cannot run now (`/viz/run` while a run is in progress).
    pub fn conflict(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::CONFLICT, "conflict_error", message)
    }

    /// 500: the engine failed while serving the request.
    /// The error of a choice whose generation failed (`why`, the loop's message): 503 for
    /// the shutdown and for a KV cache that ran out of cells under load (retry: the cells
    /// free as other replies end), 500 otherwise.
    pub fn generation_failed(why: &str) -> ApiError {
        if why == crate::engine_loop::SHUTDOWN_MESSAGE {
            return ApiError::shut_down();
        }
        if why.starts_with(crate::engine_loop::KV_FULL) {
            return ApiError {
                retry_after: Some(1),
                ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable_error", why)
                    .with_code("kv_cache_full")
            };
        }
        ApiError::server(format!("generation failed: {why}"))
    }

    pub fn server(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    pub fn body(&self) -> serde_json::Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status.as_u16(), self.message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }
}
