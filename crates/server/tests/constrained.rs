//! Constrained replies through the HTTP API (issue 16) on the demo model, at a temperature
//! where the unconstrained model wanders: `response_format` json_schema and json_object on
//! chat, llama-server's `grammar` (GBNF) and `json_schema` on completions, streamed too.

mod common;

use axum::http::StatusCode;
use common::{post, post_json, sse_json};
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_format_grammar_and_json_schema_constrain_the_reply() {
    let Some(path) = minfer_testkit::models::qwen() else {
        return;
    };
    let app = minfer_server::app(common::state(&path));
    let schema = json!({"type": "object", "properties": {
        "colour": {"enum": ["red", "green", "blue"]},
        "count": {"type": "integer", "minimum": 1, "maximum": 9}},
        "required": ["colour", "count"], "additionalProperties": false});
    let check = |text: &str| {
        let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
        assert!(
            ["red", "green", "blue"].contains(&v["colour"].as_str().unwrap()),
            "{v}"
        );
        assert!((1..=9).contains(&v["count"].as_i64().unwrap()), "{v}");
        assert_eq!(v.as_object().unwrap().len(), 2, "{v}");
    };
    for seed in [1, 2] {
        let body = json!({
            "messages": [{"role": "user", "content": "Pick a colour and a number."}],
            "response_format": {"type": "json_schema",
                "json_schema": {"name": "pick", "schema": schema, "strict": true}},
            "temperature": 1.0, "seed": seed, "max_tokens": 60,
        });
        let (s, v) = post_json(&app, "/v1/chat/completions", &body).await;
        assert_eq!(s, StatusCode::OK, "{v}");
        assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
        check(v["choices"][0]["message"]["content"].as_str().unwrap());
    }
    // Streamed: the deltas join into a valid reply.
    let body = json!({
        "messages": [{"role": "user", "content": "Pick a colour and a number."}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "pick", "schema": schema}},
        "temperature": 1.0, "seed": 3, "max_tokens": 60, "stream": true,
    });
    let r = post(&app, "/v1/chat/completions", &body).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let text: String = sse_json(&r.body)
        .iter()
        .filter_map(|e| {
            e["choices"][0]["delta"]["content"]
                .as_str()
                .map(String::from)
        })
        .collect();
    check(&text);
    // json_object: any object.
    let body = json!({
        "messages": [{"role": "user", "content": "Describe a cat."}],
        "response_format": {"type": "json_object"}, "temperature": 0, "max_tokens": 80,
    });
    let (s, v) = post_json(&app, "/v1/chat/completions", &body).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    if v["choices"][0]["finish_reason"] == "stop" {
        let c: Value =
            serde_json::from_str(v["choices"][0]["message"]["content"].as_str().unwrap()).unwrap();
        assert!(c.is_object(), "{c}");
    }
    // Completions: GBNF and llama-server's json_schema.
    for seed in [1, 2, 3] {
        let body = json!({"prompt": "Is the sky green? Answer:", "grammar": "root ::= (\" yes\" | \" no\") \".\"",
            "temperature": 1.0, "seed": seed, "max_tokens": 8});
        let (s, v) = post_json(&app, "/v1/completions", &body).await;
        assert_eq!(s, StatusCode::OK, "{v}");
        let t = v["choices"][0]["text"].as_str().unwrap();
        assert!(t == " yes." || t == " no.", "{t:?}");
    }
    let body = json!({"prompt": "A colour and a number as JSON:", "json_schema": schema,
        "temperature": 1.0, "seed": 9, "max_tokens": 60});
    let (s, v) = post_json(&app, "/v1/completions", &body).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    check(v["choices"][0]["text"].as_str().unwrap());
}
