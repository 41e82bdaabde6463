//! `tool_choice` that forces a call, on the Qwen demo model (whose template has tools and
//! `<tool_call>` syntax): the reply is a parsed call with JSON arguments, never a 500.

mod common;

use axum::http::StatusCode;
use common::{post, post_json, sse_json};
use serde_json::{json, Value};

fn request(choice: Value, stream: bool) -> Value {
    json!({
        "messages": [{"role": "user", "content": "What is the weather in Paris right now? Use the tool."}],
        "tools": [{"type": "function", "function": {
            "name": "get_weather", "description": "Get the current weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        }}],
        "tool_choice": choice, "max_tokens": 64, "temperature": 0, "stream": stream,
    })
}

fn assert_call(name: &Value, arguments: &Value) {
    assert_eq!(name, "get_weather");
    let args: Value = serde_json::from_str(arguments.as_str().expect("arguments as text"))
        .unwrap_or_else(|e| panic!("arguments {arguments} are not JSON: {e}"));
    assert!(args["city"].is_string(), "{args}");
}

/// Before the forced opening reached the name, Qwen2.5-Coder 0.5B ended its reply right
/// after `<tool_call>` and the request failed with a 500 "malformed tool call".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_and_named_choices_yield_a_parsed_call() {
    let Some(path) = minfer_testkit::models::qwen() else {
        return;
    };
    let app = minfer_server::app(common::state(&path));
    let named = json!({"type": "function", "function": {"name": "get_weather"}});
    for choice in [json!("required"), named] {
        let (s, v) = post_json(
            &app,
            "/v1/chat/completions",
            &request(choice.clone(), false),
        )
        .await;
        assert_eq!(s, StatusCode::OK, "{choice}: {v}");
        let c = &v["choices"][0];
        assert_eq!(c["finish_reason"], "tool_calls", "{choice}: {v}");
        let calls = c["message"]["tool_calls"].as_array().expect("tool_calls");
        assert_eq!(calls.len(), 1, "{v}");
        assert!(
            calls[0]["id"].is_string() && calls[0]["type"] == "function",
            "{v}"
        );
        assert_call(
            &calls[0]["function"]["name"],
            &calls[0]["function"]["arguments"],
        );

        let r = post(&app, "/v1/chat/completions", &request(choice.clone(), true)).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        let ev = sse_json(&r.body);
        let deltas: Vec<&Value> = ev
            .iter()
            .filter_map(|e| e["choices"][0]["delta"]["tool_calls"].as_array())
            .flatten()
            .collect();
        assert_eq!(deltas.len(), 1, "{choice}: {ev:?}");
        assert_call(
            &deltas[0]["function"]["name"],
            &deltas[0]["function"]["arguments"],
        );
        let finish: Vec<&Value> = ev
            .iter()
            .map(|e| &e["choices"][0]["finish_reason"])
            .filter(|f| !f.is_null())
            .collect();
        assert_eq!(finish, [&json!("tool_calls")], "{ev:?}");
    }
}
