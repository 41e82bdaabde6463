//! Malformed requests: each gets a 4xx with an OpenAI-shaped JSON error naming the field at
//! fault, and the server keeps serving (a small good request succeeds after every one).
//! Also: unknown fields and `null`s are ignored.

mod common;

use axum::http::{Method, StatusCode};
use common::{assert_error_shape, post, post_json, send, small_chat, sse_json, N_CTX};
use serde_json::{json, Value};
use std::collections::HashSet;
use std::time::Duration;

const CHAT: &str = "/v1/chat/completions";
const CMPL: &str = "/v1/completions";

/// SmolLM2's vocabulary (checked against `/v1/models` before the cases run).
const VOCAB: usize = 49152;

/// No request may take longer than this (a hang is a failure, not a stuck test run).
const LIMIT: Duration = Duration::from_secs(120);

struct Case {
    name: &'static str,
    method: Method,
    path: &'static str,
    headers: Vec<(&'static str, &'static str)>,
    body: Vec<u8>,
    status: u16,
    /// The `param` the error must name; `None`: it must be null.
    param: Option<&'static str>,
    /// Text the message must contain.
    says: Vec<String>,
    /// The message must name the context and a longer prompt length.
    past_context: bool,
}

impl Case {
    fn says(mut self, s: impl Into<String>) -> Case {
        self.says.push(s.into());
        self
    }
}

fn raw(
    name: &'static str,
    method: Method,
    path: &'static str,
    body: impl Into<Vec<u8>>,
    status: u16,
    param: Option<&'static str>,
) -> Case {
    Case {
        name,
        method,
        path,
        headers: vec![("content-type", "application/json")],
        body: body.into(),
        status,
        param,
        says: Vec::new(),
        past_context: false,
    }
}

/// A 400 for the whole JSON `body` sent to `path`.
fn whole(name: &'static str, path: &'static str, body: Value, param: Option<&'static str>) -> Case {
    raw(name, Method::POST, path, body.to_string(), 400, param)
}

/// `base` with the fields of `extra` put over it.
fn merged(mut base: Value, extra: Value) -> Value {
    for (k, v) in extra.as_object().expect("an object of fields") {
        base[k] = v.clone();
    }
    base
}

fn good_chat() -> Value {
    json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "temperature": 0})
}

fn good_cmpl() -> Value {
    json!({"prompt": "Hello", "max_tokens": 2, "temperature": 0})
}

/// A good chat request with `extra` fields that make it a 400 naming `param`.
fn chat(name: &'static str, extra: Value, param: &'static str) -> Case {
    whole(name, CHAT, merged(good_chat(), extra), Some(param))
}

/// A chat request whose only message is `m`.
fn chat_msg(name: &'static str, m: Value, param: &'static str) -> Case {
    chat(name, json!({"messages": [m]}), param)
}

/// A good completion request with `extra` fields that make it a 400 naming `param`.
fn cmpl(name: &'static str, extra: Value, param: &'static str) -> Case {
    whole(name, CMPL, merged(good_cmpl(), extra), Some(param))
}

/// A prompt too long for the context: the error (no `param`: the prompt as a whole) says how
/// long the prompt is and how long the context.
fn past_context(c: Case) -> Case {
    Case {
        param: None,
        past_context: true,
        ..c
    }
    .says(N_CTX.to_string())
}

/// JSON nested `depth` arrays deep.
fn nested(depth: usize) -> String {
    format!("{}{}", "[".repeat(depth), "]".repeat(depth))
}

/// A text of well over `N_CTX` tokens.
fn long_text() -> String {
    "the quick brown fox jumps over the lazy dog. ".repeat(N_CTX / 3)
}

fn function_tool(name: &str) -> Value {
    json!({"type": "function", "function": {"name": name, "description": "d",
        "parameters": {"type": "object", "properties": {"x": {"type": "string"}}}}})
}

/// Every case, one line each (a table: rustfmt would spread it over a thousand lines).
#[rustfmt::skip]
fn cases() -> Vec<Case> {
    let good = good_chat().to_string();
    let ten_mb = format!(
        r#"{{"messages": [{{"role": "user", "content": "{}"}}]}}"#,
        "a".repeat(10 << 20)
    );
    let mut invalid_utf8 = br#"{"messages": [{"role": "user", "content": "hi "#.to_vec();
    invalid_utf8.extend_from_slice(&[0xff, 0xfe, 0xc3]);
    invalid_utf8.extend_from_slice(br#""}], "max_tokens": 2}"#);
    let mut utf8_key = b"{\"mess\xc0\xafages\": []}".to_vec();
    utf8_key.push(b'\n');
    let utf16: Vec<u8> = good.encode_utf16().flat_map(u16::to_le_bytes).collect();
    let too_many_stops: Vec<String> = (0..17).map(|i| format!("s{i}")).collect();
    let too_many_prompts: Vec<String> = (0..65).map(|i| format!("p{i}")).collect();
    let long = long_text();
    let ban_all: serde_json::Map<String, Value> =
        (0..VOCAB).map(|i| (i.to_string(), json!(-100))).collect();
    let ban_all_pairs: Vec<Value> = (0..VOCAB).map(|i| json!([i, false])).collect();
    let mut bom = b"\xEF\xBB\xBF".to_vec();
    bom.extend_from_slice(good.as_bytes());
    let user = |c: Value| json!({"role": "user", "content": c});
    let mut v = vec![
        // The body as a whole.
        raw("truncated JSON", Method::POST, CHAT, &good[..good.len() - 7], 400, None),
        raw("trailing garbage", Method::POST, CHAT, format!("{good} xyz"), 400, None),
        raw("two objects", Method::POST, CHAT, format!("{good}{good}"), 400, None),
        raw("empty body", Method::POST, CHAT, "", 400, None),
        raw("byte order mark", Method::POST, CHAT, bom, 400, None),
        raw("whitespace body", Method::POST, CHAT, " \n\t ", 400, None),
        raw("array body", Method::POST, CHAT, "[1, 2]", 400, None),
        raw("string body", Method::POST, CHAT, r#""hello""#, 400, None),
        raw("number body", Method::POST, CHAT, "42", 400, None),
        raw("null body", Method::POST, CHAT, "null", 400, None),
        raw("single quotes", Method::POST, CHAT, "{'messages': []}", 400, None),
        raw("NaN literal", Method::POST, CHAT, r#"{"messages": [], "temperature": NaN}"#, 400, None),
        raw("number overflows f64", Method::POST, CHAT, r#"{"messages": [{"role": "user", "content": "hi"}], "temperature": 1e400}"#, 400, None),
        raw("lone surrogate escape", Method::POST, CHAT, r#"{"messages": [{"role": "user", "content": "\ud800"}]}"#, 400, None),
        raw("invalid UTF-8 in a string", Method::POST, CHAT, invalid_utf8, 400, None),
        raw("invalid UTF-8 in a key", Method::POST, CHAT, utf8_key, 400, None),
        raw("nested 100000 deep", Method::POST, CHAT, format!(r#"{{"messages": {}}}"#, nested(100_000)), 400, None),
        raw("10 MB body", Method::POST, CHAT, ten_mb.clone(), 413, None),
        raw("10 MB body to /tokenize", Method::POST, "/tokenize", ten_mb, 413, None),
        Case {
            headers: vec![("content-type", "application/x-www-form-urlencoded")],
            ..raw("form-encoded body", Method::POST, CHAT, "messages=hi&max_tokens=2", 400, None)
        },
        Case {
            headers: vec![("content-type", "application/json; charset=utf-16")],
            ..raw("UTF-16 body", Method::POST, CHAT, utf16, 400, None)
        },
        // messages
        whole("messages missing", CHAT, json!({"max_tokens": 2}), Some("messages")),
        chat("messages a string", json!({"messages": "hi"}), "messages"),
        chat("messages an object", json!({"messages": {"role": "user", "content": "hi"}}), "messages"),
        chat("messages empty", json!({"messages": []}), "messages"),
        chat("message a string", json!({"messages": ["hi"]}), "messages[0]"),
        chat("second message null", json!({"messages": [user(json!("hi")), null]}), "messages[1]"),
        chat_msg("role a number", json!({"role": 1, "content": "hi"}), "messages[0].role"),
        chat_msg("role missing", json!({"content": "hi"}), "messages[0].role"),
        chat_msg("unknown role", json!({"role": "wizard", "content": "hi"}), "messages[0].role").says("wizard"),
        chat_msg("role in capitals", json!({"role": "USER", "content": "hi"}), "messages[0].role"),
        chat_msg("content missing", json!({"role": "user"}), "messages[0].content"),
        chat_msg("content null", json!({"role": "user", "content": null}), "messages[0].content"),
        chat_msg("content a number", json!({"role": "user", "content": 7}), "messages[0].content"),
        chat_msg("content an object", json!({"role": "user", "content": {"text": "hi"}}), "messages[0].content"),
        chat_msg("image_url part", user(json!([{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "http://example.invalid/a.png"}}])), "messages[0].content[1].type").says("image_url"),
        chat_msg("input_audio part", user(json!([{"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}])), "messages[0].content[0].type").says("input_audio"),
        chat_msg("content part a string", user(json!(["hi"])), "messages[0].content[0]"),
        chat_msg("content part without type", user(json!([{"text": "hi"}])), "messages[0].content[0].type"),
        chat_msg("text part without text", user(json!([{"type": "text"}])), "messages[0].content[0].text"),
        chat_msg("text part with numeric text", user(json!([{"type": "text", "text": 5}])), "messages[0].content[0].text"),
        chat_msg("name a number", json!({"role": "user", "content": "hi", "name": 5}), "messages[0].name"),
        chat_msg("tool_calls on a user message", json!({"role": "user", "content": "hi", "tool_calls": []}), "messages[0].tool_calls"),
        chat_msg("tool_calls a string", json!({"role": "assistant", "content": "hi", "tool_calls": "f()"}), "messages[0].tool_calls"),
        chat_msg("tool call without function", json!({"role": "assistant", "tool_calls": [{"id": "c", "type": "function"}]}), "messages[0].tool_calls[0]"),
        chat_msg("tool call arguments a number", json!({"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": 3}}]}), "messages[0].tool_calls[0]"),
        chat_msg("tool_call_id a number", json!({"role": "tool", "content": "42", "tool_call_id": 9}), "messages[0].tool_call_id"),
        // Lengths
        chat("max_tokens a string", json!({"max_tokens": "2"}), "max_tokens"),
        chat("max_tokens -5", json!({"max_tokens": -5}), "max_tokens"),
        chat("max_tokens 10^12", json!({"max_tokens": 1_000_000_000_000u64}), "max_tokens").says(N_CTX.to_string()),
        raw("max_tokens 2^70", Method::POST, CHAT, r#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1180591620717411303424}"#, 400, Some("max_tokens")),
        chat("max_tokens 2.5", json!({"max_tokens": 2.5}), "max_tokens"),
        chat("max_completion_tokens a boolean", json!({"max_tokens": null, "max_completion_tokens": true}), "max_completion_tokens"),
        chat("n_predict past the context", json!({"max_tokens": null, "n_predict": N_CTX + 1}), "n_predict"),
        // Sampling
        chat("temperature a string", json!({"temperature": "hot"}), "temperature"),
        chat("temperature -1", json!({"temperature": -1}), "temperature"),
        chat("temperature 3", json!({"temperature": 3}), "temperature"),
        chat("top_p 7", json!({"top_p": 7}), "top_p"),
        chat("top_p a string", json!({"top_p": "0.9"}), "top_p"),
        chat("top_p -0.1", json!({"top_p": -0.1}), "top_p"),
        chat("top_k 1.5", json!({"top_k": 1.5}), "top_k"),
        chat("top_k a string", json!({"top_k": "40"}), "top_k"),
        chat("top_k -2", json!({"top_k": -2}), "top_k"),
        chat("min_p a boolean", json!({"min_p": true}), "min_p"),
        chat("min_p 2", json!({"min_p": 2}), "min_p"),
        chat("presence_penalty a string", json!({"presence_penalty": "x"}), "presence_penalty"),
        chat("presence_penalty 5", json!({"presence_penalty": 5}), "presence_penalty"),
        chat("frequency_penalty an array", json!({"frequency_penalty": []}), "frequency_penalty"),
        chat("frequency_penalty -3", json!({"frequency_penalty": -3}), "frequency_penalty"),
        chat("repetition_penalty a string", json!({"repetition_penalty": "1.1"}), "repetition_penalty"),
        chat("repetition_penalty 0", json!({"repetition_penalty": 0}), "repetition_penalty"),
        chat("repeat_penalty -1", json!({"repeat_penalty": -1}), "repeat_penalty"),
        chat("repeat_last_n a string", json!({"repeat_last_n": "64"}), "repeat_last_n"),
        chat("stop a number", json!({"stop": 5}), "stop"),
        chat("stop of numbers", json!({"stop": [1, 2]}), "stop"),
        chat("stop an object", json!({"stop": {"s": 1}}), "stop"),
        chat("17 stop strings", json!({"stop": too_many_stops}), "stop"),
        chat("seed a string", json!({"seed": "abc"}), "seed"),
        chat("seed 1.5", json!({"seed": 1.5}), "seed"),
        chat("n 0", json!({"n": 0}), "n"),
        chat("n 10^6", json!({"n": 1_000_000}), "n"),
        chat("n a string", json!({"n": "2"}), "n"),
        chat("logprobs a string", json!({"logprobs": "yes"}), "logprobs"),
        chat("top_logprobs 21", json!({"logprobs": true, "top_logprobs": 21}), "top_logprobs"),
        chat("top_logprobs without logprobs", json!({"top_logprobs": 3}), "top_logprobs"),
        chat("top_logprobs -1", json!({"logprobs": true, "top_logprobs": -1}), "top_logprobs"),
        chat("top_logprobs a string", json!({"logprobs": true, "top_logprobs": "3"}), "top_logprobs"),
        chat("stream a string", json!({"stream": "true"}), "stream"),
        chat("stream 1", json!({"stream": 1}), "stream"),
        chat("stream_options a boolean", json!({"stream": true, "stream_options": true}), "stream_options"),
        chat("include_usage a string", json!({"stream": true, "stream_options": {"include_usage": "yes"}}), "stream_options.include_usage"),
        chat("stream with top_p 7 (JSON error, not SSE)", json!({"stream": true, "top_p": 7}), "top_p"),
        chat("logit_bias a string", json!({"logit_bias": "none"}), "logit_bias"),
        chat("logit_bias key not a number", json!({"logit_bias": {"abc": 1}}), "logit_bias"),
        chat("logit_bias value a string", json!({"logit_bias": {"5": "ban"}}), "logit_bias"),
        chat("logit_bias value 150", json!({"logit_bias": {"5": 150}}), "logit_bias"),
        chat("logit_bias id past the vocabulary", json!({"logit_bias": {"4000000000": 1}}), "logit_bias").says("4000000000"),
        chat("logit_bias id just past the vocabulary", json!({"logit_bias": {VOCAB.to_string(): 1}}), "logit_bias"),
        chat("logit_bias bans every token", json!({"logit_bias": ban_all}), "logit_bias"),
        chat("logit_bias bans every token as pairs", json!({"stream": true, "logit_bias": ban_all_pairs}), "logit_bias"),
        chat("logit_bias negative id", json!({"logit_bias": {"-3": 1}}), "logit_bias"),
        chat("logit_bias pair list malformed", json!({"logit_bias": [[5]]}), "logit_bias"),
        chat("logit_bias pair with a float id", json!({"logit_bias": [[5.5, 1]]}), "logit_bias"),
        chat("user a number", json!({"user": 42}), "user"),
        chat("model a number", json!({"model": 42}), "model"),
        chat("model an object", json!({"model": {"id": "x"}}), "model"),
        // Tools and formats
        chat("tools a string", json!({"tools": "search"}), "tools"),
        chat("tool a number", json!({"tools": [42]}), "tools[0]"),
        chat("tool of another type", json!({"tools": [{"type": "retrieval"}]}), "tools[0].type"),
        chat("tool without function", json!({"tools": [{"type": "function"}]}), "tools[0].function"),
        chat("tool without a name", json!({"tools": [{"type": "function", "function": {"parameters": {}}}]}), "tools[0].function.name"),
        chat("tool parameters a string", json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": "{}"}}]}), "tools[0].function.parameters"),
        chat("tool parameters an array", json!({"tools": [function_tool("g"), {"type": "function", "function": {"name": "f", "parameters": []}}]}), "tools[1].function.parameters"),
        chat("tool description a number", json!({"tools": [{"type": "function", "function": {"name": "f", "description": 1}}]}), "tools[0].function.description"),
        chat("tool_choice a number", json!({"tools": [function_tool("f")], "tool_choice": 5}), "tool_choice"),
        chat("tool_choice unknown word", json!({"tools": [function_tool("f")], "tool_choice": "sometimes"}), "tool_choice"),
        chat("tool_choice names a function not in tools", json!({"tools": [function_tool("f")], "tool_choice": {"type": "function", "function": {"name": "g"}}}), "tool_choice").says("\"g\""),
        chat("tool_choice object without a name", json!({"tools": [function_tool("f")], "tool_choice": {"type": "function"}}), "tool_choice"),
        chat("tool_choice required without tools", json!({"tool_choice": "required"}), "tool_choice"),
        chat("tool_choice required with empty tools", json!({"tools": [], "tool_choice": "required"}), "tool_choice"),
        chat("parallel_tool_calls a string", json!({"parallel_tool_calls": "yes"}), "parallel_tool_calls"),
        chat("response_format json_schema without its object", json!({"response_format": {"type": "json_schema"}}), "response_format.json_schema"),
        chat("response_format json_schema with a refused keyword", json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "if": {"type": "object"}, "then": {"required": ["a"]}}}}}), "response_format").says("if"),
        chat("json_schema a string", json!({"json_schema": "object"}), "json_schema"),
        chat("grammar and json_schema together", json!({"grammar": "root ::= \"a\"", "json_schema": {}}), "grammar"),
        chat("response_format unknown type", json!({"response_format": {"type": "xml"}}), "response_format"),
        chat("response_format a string", json!({"response_format": "json"}), "response_format"),
        chat("response_format without type", json!({"response_format": {}}), "response_format.type"),
        chat("response_format type a number", json!({"response_format": {"type": 1}}), "response_format.type"),
        chat("grammar malformed", json!({"grammar": "root ::= [a-"}), "grammar").says("unterminated character class"),
        chat("grammar without root", json!({"grammar": "main ::= \"a\""}), "grammar").says("root"),
        cmpl("grammar a number", json!({"grammar": 5}), "grammar"),
        // Completions
        whole("prompt missing", CMPL, json!({"max_tokens": 2}), Some("prompt")),
        cmpl("prompt an empty list", json!({"prompt": []}), "prompt"),
        cmpl("prompt list with empty ids", json!({"prompt": [[1, 2], []]}), "prompt"),
        cmpl("prompt a number", json!({"prompt": 42}), "prompt"),
        cmpl("prompt an object", json!({"prompt": {"text": "hi"}}), "prompt"),
        cmpl("prompt list of booleans", json!({"prompt": [true]}), "prompt"),
        cmpl("prompt token id past the vocabulary", json!({"prompt": [1, 99_999_999]}), "prompt").says("99999999"),
        cmpl("prompt negative token id", json!({"prompt": [1, -1]}), "prompt"),
        cmpl("prompt fractional token id", json!({"prompt": [1.5]}), "prompt"),
        cmpl("prompt nested ids past the vocabulary", json!({"prompt": [[1], [4_000_000_000u64]]}), "prompt"),
        cmpl("65 prompts", json!({"prompt": too_many_prompts}), "prompt"),
        cmpl("prompts × n past --parallel", json!({"prompt": ["a", "b", "c"], "n": 2}), "prompt"),
        cmpl("echo with logprobs", json!({"echo": true, "logprobs": 1}), "echo"),
        cmpl("echo a string", json!({"echo": "yes"}), "echo"),
        cmpl("suffix", json!({"suffix": " world"}), "suffix"),
        cmpl("suffix a number", json!({"suffix": 3}), "suffix"),
        cmpl("best_of other than n", json!({"best_of": 3}), "best_of"),
        cmpl("best_of 0", json!({"best_of": 0}), "best_of"),
        cmpl("logprobs 21", json!({"logprobs": 21}), "logprobs"),
        cmpl("logprobs a boolean", json!({"logprobs": true}), "logprobs"),
        cmpl("completion top_p 7", json!({"top_p": 7}), "top_p"),
        cmpl("completion n 0", json!({"n": 0}), "n"),
        cmpl("parse_special a string", json!({"parse_special": "no"}), "parse_special"),
        raw("completion truncated JSON", Method::POST, CMPL, r#"{"prompt": "hi", "#, 400, None),
        // Context
        past_context(chat_msg("chat prompt past the context", user(json!(long.clone())), "")),
        past_context(cmpl("text prompt past the context", json!({"prompt": long}), "")),
        past_context(cmpl("token prompt past the context", json!({"prompt": vec![1; N_CTX + 100]}), "")).says((N_CTX + 100).to_string()),
        Case { param: None, ..cmpl("token prompt as long as the context", json!({"prompt": vec![1; N_CTX]}), "") },
        // tokenize / detokenize
        whole("tokenize without content", "/tokenize", json!({}), Some("content")),
        whole("tokenize content a number", "/tokenize", json!({"content": 5}), Some("content")),
        whole("tokenize add_special a string", "/tokenize", json!({"content": "a", "add_special": "yes"}), Some("add_special")),
        whole("tokenize with_pieces a number", "/tokenize", json!({"content": "a", "with_pieces": 1}), Some("with_pieces")),
        raw("tokenize array body", Method::POST, "/tokenize", "[]", 400, None),
        whole("detokenize without tokens", "/detokenize", json!({}), Some("tokens")),
        whole("detokenize tokens a string", "/detokenize", json!({"tokens": "1 2"}), Some("tokens")),
        whole("detokenize id past the vocabulary", "/detokenize", json!({"tokens": [1, VOCAB]}), Some("tokens")),
        whole("detokenize negative id", "/detokenize", json!({"tokens": [-1]}), Some("tokens")),
        whole("detokenize id 2^40", "/detokenize", json!({"tokens": [1u64 << 40]}), Some("tokens")),
        raw("detokenize empty body", Method::POST, "/detokenize", "", 400, None),
        // Routes and methods
        raw("unknown route", Method::GET, "/v1/nope", "", 404, None),
        raw("unknown route POST", Method::POST, "/v1/chat/completion", good.clone(), 404, None),
        raw("unknown API version", Method::POST, "/v2/chat/completions", good.clone(), 404, None),
        raw("route with a trailing slash", Method::POST, "/v1/chat/completions/", good.clone(), 404, None),
        raw("GET chat", Method::GET, CHAT, "", 405, None),
        raw("PUT completions", Method::PUT, CMPL, good_cmpl().to_string(), 405, None),
        raw("DELETE tokenize", Method::DELETE, "/tokenize", "", 405, None),
        raw("GET detokenize", Method::GET, "/detokenize", "", 405, None),
        raw("POST health", Method::POST, "/health", "{}", 405, None),
        raw("POST models", Method::POST, "/v1/models", "{}", 405, None),
    ];
    // The tools SmolLM2's template cannot render.
    v.push(chat(
        "tools on a template without tools",
        json!({"tools": [function_tool("f")]}),
        "tools",
    ));
    v
}

/// A good request succeeds: the server still serves.
async fn still_serving(app: &axum::Router, after: &str) {
    let r = tokio::time::timeout(LIMIT, post(app, CHAT, &small_chat("Hi", 2)))
        .await
        .unwrap_or_else(|_| panic!("after {after:?}: the good request hung"));
    assert_eq!(
        r.status,
        StatusCode::OK,
        "after {after:?}: the good request failed: {}",
        r.text()
    );
    let v = r.json();
    assert!(
        v["choices"][0]["message"]["content"].is_string(),
        "after {after:?}: {v}"
    );
    let n = v["usage"]["completion_tokens"].as_u64().unwrap_or(99);
    assert!(n <= 2, "after {after:?}: {v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_get_json_4xx_and_the_server_keeps_serving() {
    let Some(path) = minfer_testkit::models::smol() else {
        return;
    };
    let app = minfer_server::app(common::state(&path));
    let r = send(&app, Method::GET, "/v1/models", &[], "").await;
    assert_eq!(
        r.json()["data"][0]["meta"]["n_vocab"],
        VOCAB,
        "{}",
        r.text()
    );
    let cases = cases();
    assert!(cases.len() >= 60, "{} cases", cases.len());
    let mut names = HashSet::new();
    let mut requests = HashSet::new();
    for c in &cases {
        assert!(names.insert(c.name), "two cases named {:?}", c.name);
        let key = (c.method.clone(), c.path, c.headers.clone(), c.body.clone());
        assert!(requests.insert(key), "case {:?} repeats another", c.name);
    }
    let mut failures = Vec::new();
    for c in &cases {
        let r = tokio::time::timeout(
            LIMIT,
            send(&app, c.method.clone(), c.path, &c.headers, c.body.clone()),
        )
        .await
        .unwrap_or_else(|_| panic!("{}: hung", c.name));
        let problem = check(c, &r);
        if let Some(p) = &problem {
            eprintln!("FAIL {}: {p}", c.name);
            failures.push(format!("{}: {p}", c.name));
        } else {
            let param = r.json()["error"]["param"].clone();
            eprintln!("ok   {} → {} param={param}", c.name, r.status.as_u16());
        }
        still_serving(&app, c.name).await;
    }
    println!("{} malformed cases", cases.len());
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// What is wrong with the reply to `c`, if anything.
fn check(c: &Case, r: &common::Reply) -> Option<String> {
    let short = || {
        let t = r.text();
        t.chars().take(300).collect::<String>()
    };
    if r.status.as_u16() != c.status {
        return Some(format!(
            "status {} (want {}): {}",
            r.status,
            c.status,
            short()
        ));
    }
    if !r.content_type().starts_with("application/json") {
        return Some(format!("content-type {:?}: {}", r.content_type(), short()));
    }
    let Ok(v) = serde_json::from_slice::<Value>(&r.body) else {
        return Some(format!("not JSON: {}", short()));
    };
    let param = match std::panic::catch_unwind(|| assert_error_shape(&v)) {
        Ok(p) => p,
        Err(_) => return Some(format!("not an OpenAI error: {v}")),
    };
    if param.as_deref() != c.param {
        return Some(format!("param {param:?} (want {:?}): {v}", c.param));
    }
    let msg = v["error"]["message"].as_str().unwrap_or("");
    for s in &c.says {
        if !msg.contains(s.as_str()) {
            return Some(format!("message does not say {s:?}: {msg}"));
        }
    }
    if c.past_context {
        let numbers: Vec<usize> = msg
            .split(|ch: char| !ch.is_ascii_digit())
            .filter_map(|w| w.parse().ok())
            .collect();
        if !numbers.iter().any(|&n| n > N_CTX) {
            return Some(format!(
                "message names no prompt length past {N_CTX}: {msg}"
            ));
        }
    }
    None
}

/// Fields the server does not know are ignored, and `null` reads as absent (OpenAI's
/// clients send it for unset optionals).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_fields_and_nulls_are_ignored() {
    let Some(path) = minfer_testkit::models::smol() else {
        return;
    };
    let app = minfer_server::app(common::state(&path));
    let extra = json!({
        "metadata": {"k": "v"}, "store": true, "service_tier": "auto", "frobnicate": [1, {"x": null}],
        "temperature": null, "top_p": null, "stop": null, "seed": null, "n": null,
        "tools": null, "tool_choice": null, "stream_options": null, "logit_bias": null,
        "response_format": {"type": "text"},
    });
    let mut chat = merged(good_chat(), extra.clone());
    chat["messages"] = json!([
        {"role": "developer", "content": "Be brief.", "unknown": 1},
        {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there \u{0} 🦀"}]},
    ]);
    let (s, v) = post_json(&app, CHAT, &chat).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert!(v["choices"][0]["message"]["content"].is_string(), "{v}");

    let (s, v) = post_json(&app, CMPL, &merged(good_cmpl(), extra)).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert!(v["choices"][0]["text"].is_string(), "{v}");

    let (s, v) = post_json(&app, "/tokenize", &json!({"content": "Hi", "foo": 1})).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let ids = v["tokens"].as_array().expect("tokens").clone();
    assert!(!ids.is_empty(), "{v}");
    let (s, v) = post_json(&app, "/detokenize", &json!({"tokens": ids, "bar": [2]})).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["content"], "Hi");

    // Banning all but one token is fine: that token is all the reply can be.
    let (_, v) = post_json(&app, "/tokenize", &json!({"content": " Hello"})).await;
    let keep = v["tokens"][0].as_u64().expect("a token") as usize;
    let bias: serde_json::Map<String, Value> = (0..VOCAB)
        .filter(|&i| i != keep)
        .map(|i| (i.to_string(), json!(-100)))
        .collect();
    let body = merged(good_cmpl(), json!({"logit_bias": bias}));
    let (s, v) = post_json(&app, CMPL, &body).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (_, want) = post_json(&app, "/detokenize", &json!({"tokens": [keep, keep]})).await;
    assert_eq!(v["choices"][0]["text"], want["content"], "{v}");

    // Keys the server reads are case-sensitive: `Temperature` is just another unknown field.
    let (s, v) = post_json(
        &app,
        CHAT,
        &merged(good_chat(), json!({"Temperature": "hot"})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
}

/// The SSE helpers on a real stream: role first, text deltas, a finish, usage, `[DONE]`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_after_errors_is_well_formed() {
    let Some(path) = minfer_testkit::models::smol() else {
        return;
    };
    let app = minfer_server::app(common::state(&path));
    let (s, _) = post_json(
        &app,
        CHAT,
        &merged(good_chat(), json!({"stream": true, "n": 0})),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    let body = merged(
        small_chat("Hi", 4),
        json!({"stream": true, "stream_options": {"include_usage": true}}),
    );
    let r = post(&app, CHAT, &body).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert!(
        r.content_type().starts_with("text/event-stream"),
        "{}",
        r.content_type()
    );
    let ev = sse_json(&r.body);
    assert_eq!(
        ev[0]["choices"][0]["delta"]["role"], "assistant",
        "{}",
        ev[0]
    );
    let finishes: Vec<&Value> = ev
        .iter()
        .filter_map(|e| e["choices"].get(0).map(|c| &c["finish_reason"]))
        .filter(|f| !f.is_null())
        .collect();
    assert_eq!(finishes.len(), 1, "{ev:?}");
    let last = ev.last().expect("events");
    assert_eq!(last["choices"], json!([]));
    let u = &last["usage"];
    assert_eq!(
        u["total_tokens"].as_u64(),
        Some(u["prompt_tokens"].as_u64().unwrap() + u["completion_tokens"].as_u64().unwrap())
    );
}
