//! The small routes: the chat page, health, metrics, models, tokenize and detokenize.

use super::{body, refused};
use crate::error::ApiError;
use crate::request::fields::Fields;
use crate::request::parse_json;
use crate::AppState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use std::sync::Arc;

pub async fn health() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

pub async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        st.metrics.render(),
    )
        .into_response()
}

pub async fn models(State(st): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({
        "object": "list",
        "data": [{
            "id": st.cfg.model_id,
            "object": "model",
            "created": st.created,
            "owned_by": "minfer",
            "meta": {
                "n_ctx": st.limits.n_ctx,
                "n_vocab": st.limits.vocab,
                "parallel": st.cfg.parallel,
            },
        }],
    }))
}

/// `{"content": TEXT, "add_special"?: bool, "parse_special"?: bool, "with_pieces"?: bool}`
/// → `{"tokens": [...]}` (llama-server's shape; pieces as `{"id", "piece"}`).
pub async fn tokenize(
    State(st): State<Arc<AppState>>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let run = || -> Result<Json<Value>, ApiError> {
        let v = parse_json(&body(&st, b)?)?;
        let f = Fields::of(&v)?;
        let content = f
            .str("content")?
            .ok_or_else(|| ApiError::bad_field("content", "`content` is required"))?;
        let add_special = f.bool("add_special")?.unwrap_or(false);
        let parse_special = f.bool("parse_special")?.unwrap_or(st.cfg.parse_special);
        let ids = st.tok.encode_prompt(content, add_special, parse_special);
        if f.bool("with_pieces")?.unwrap_or(false) {
            let pieces: Vec<Value> = ids
                .iter()
                .map(|&id| {
                    let p = st.tok.piece(id).unwrap_or_default();
                    json!({"id": id, "piece": String::from_utf8_lossy(p)})
                })
                .collect();
            Ok(Json(json!({ "tokens": pieces })))
        } else {
            Ok(Json(json!({ "tokens": ids })))
        }
    };
    run().map_err(|e| refused(&st, e))
}

/// `{"tokens": [ids]}` → `{"content": TEXT}`.
pub async fn detokenize(
    State(st): State<Arc<AppState>>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let run = || -> Result<Json<Value>, ApiError> {
        let v = parse_json(&body(&st, b)?)?;
        let f = Fields::of(&v)?;
        let list = f
            .array("tokens")?
            .ok_or_else(|| ApiError::bad_field("tokens", "`tokens` is required"))?;
        let vocab = st.limits.vocab;
        let ids = list
            .iter()
            .map(|t| match t.as_u64() {
                Some(id) if (id as usize) < vocab => Ok(id as u32),
                _ => Err(ApiError::bad_field(
                    "tokens",
                    format!("`tokens` must hold ids below the vocabulary size {vocab}, got {t}"),
                )),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let bytes = st
            .tok
            .decode(&ids)
            .map_err(|e| ApiError::bad_field("tokens", e.to_string()))?;
        Ok(Json(json!({ "content": String::from_utf8_lossy(&bytes) })))
    };
    run().map_err(|e| refused(&st, e))
}
