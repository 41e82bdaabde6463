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

/// Issue 16: a forced call is constrained to the tool's parameter schema, at a temperature
/// where the unconstrained model wanders: the arguments validate (a required enum and an
/// integer with bounds), over several seeds; and a response_format cannot be combined.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forced_calls_follow_the_parameter_schema() {
    let Some(path) = minfer_testkit::models::qwen() else {
        return;
    };
    let app = minfer_server::app(common::state(&path));
    let tools = json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20},
                           "unit": {"enum": ["celsius", "fahrenheit"]},
                           "days": {"type": "integer", "minimum": 1, "maximum": 7}},
            "required": ["city", "unit", "days"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "get_time", "parameters": {
            "type": "object", "properties": {"zone": {"type": "string", "maxLength": 10}},
            "required": ["zone"], "additionalProperties": false}}}
    ]);
    for (choice, seed) in [
        (json!("required"), 1),
        (json!("required"), 2),
        (
            json!({"type": "function", "function": {"name": "get_weather"}}),
            3,
        ),
    ] {
        let body = json!({
            "messages": [{"role": "user", "content": "Weather in Paris for three days, please."}],
            "tools": tools, "tool_choice": choice, "max_tokens": 80,
            "temperature": 1.0, "seed": seed,
        });
        let (s, v) = post_json(&app, "/v1/chat/completions", &body).await;
        assert_eq!(s, StatusCode::OK, "{v}");
        let call = &v["choices"][0]["message"]["tool_calls"][0]["function"];
        let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
        match call["name"].as_str().unwrap() {
            "get_weather" => {
                assert!(
                    args["city"].as_str().unwrap().chars().count() <= 20,
                    "{args}"
                );
                assert!(
                    ["celsius", "fahrenheit"].contains(&args["unit"].as_str().unwrap()),
                    "{args}"
                );
                assert!((1..=7).contains(&args["days"].as_i64().unwrap()), "{args}");
                assert_eq!(args.as_object().unwrap().len(), 3, "{args}");
            }
            "get_time" => assert!(args["zone"].is_string(), "{args}"),
            other => panic!("unknown tool {other}"),
        }
    }
    let body = json!({
        "messages": [{"role": "user", "content": "hi"}], "tools": tools,
        "tool_choice": "required", "response_format": {"type": "json_object"},
    });
    let (s, v) = post_json(&app, "/v1/chat/completions", &body).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["error"]["param"], "response_format", "{v}");
}
