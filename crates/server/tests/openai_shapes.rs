//! Issue 37 (2): the server's chat and completion bodies, whole and streamed, against
//! OpenAI's shapes (`common/openai_spec.rs`, `fixtures/openai-shapes.json`), on a synthetic
//! model so the gate runs everywhere (the real-model tests run the same checks through their
//! shared helpers when the models are cached): n > 1, logprobs, usage chunks, echo, several
//! prompts, stop strings, and forced tool calls streamed and whole.
//!
//! Control: `broken_bodies_are_refused` takes the real bodies of this run, breaks one rule at
//! a time (a tool call's index, a role in a later delta, a finish_reason moved, an id
//! changed, the usage chunk misplaced, a call's id repeated or its type dropped, a choice
//! index swapped, an `index` leaked into a whole reply's call, a usage total) and requires
//! the checker to name each; the untouched bodies pass. In `scripts/mutants`: the streamed
//! tool call's index off by one.
//!
//! A second reading: when a Python with the official `openai` package is at hand
//! (`$MINFER_PYTHON`, else the venv of scripts/venv; SKIP otherwise), the same bodies go
//! through its response types (`scripts/openai-shapes.py`), and one with a `finish_reason`
//! outside the API's list must fail there (its control).

mod common;

use common::openai_spec::{body_violation, stream_violation};
use common::{post, post_json, sse_json};
use minfer_models::synth::{tokenizer_from, write_synth, SynthSpec};
use minfer_models::Arch;
use minfer_server::ServeConfig;
use serde_json::{json, Value};
use std::path::PathBuf;

/// ChatML with a tools section naming `<tool_call>` (what the server needs to force a call).
const TEMPLATE: &str = "{%- if tools %}{{- '<|im_start|>system\\nCall a tool as <tool_call>{\"name\": N, \"arguments\": A}</tool_call>. Tools:' }}\
{%- for t in tools %}{{ ' ' + t.function.name }}{%- endfor %}{{- '<|im_end|>\\n' }}{%- endif %}\
{%- for message in messages %}\
{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') + '<|im_end|>' + '\\n' }}\
{%- endfor %}\
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

/// A tiny Qwen2 with the built-in byte-level tokenizer and [`TEMPLATE`], in a folder of its
/// own per test (`tag`), which the test removes.
fn model(tag: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("minfer-openai-shapes-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let plain = dir.join("plain.gguf");
    let spec = SynthSpec::new(Arch::Qwen2, 2, 64, 4, 2, 128);
    write_synth(&spec, &plain, &mut |_, _| {}).unwrap();
    let mut tok = tokenizer_from(&plain).unwrap();
    tok.set(
        "tokenizer.chat_template",
        minfer_gguf::Value::String(TEMPLATE.into()),
    );
    let path = dir.join("tools.gguf");
    let spec = SynthSpec {
        tokenizer: Some(tok),
        ..spec
    };
    write_synth(&spec, &path, &mut |_, _| {}).unwrap();
    path
}

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Weather.",
            "parameters": {"type": "object", "properties": {"unit": {"enum": ["c", "f"]}},
                "required": ["unit"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "get_time", "description": "Time.",
            "parameters": {"type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}},
                "required": ["zone"], "additionalProperties": false}}},
    ])
}

/// `$MINFER_PYTHON`, else scripts/venv's python, when it imports `openai`.
fn python_with_openai() -> Option<PathBuf> {
    let nonempty = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    let py = nonempty("MINFER_PYTHON").map(PathBuf::from).or_else(|| {
        let venv = nonempty("MINFER_VENV")
            .map(PathBuf::from)
            .or_else(|| nonempty("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("minfer/venv")))
            .or_else(|| nonempty("HOME").map(|h| PathBuf::from(h).join(".cache/minfer/venv")))?;
        Some(venv.join("bin/python"))
    });
    let ok = py.as_ref().is_some_and(|p| {
        std::process::Command::new(p)
            .args(["-c", "import openai"])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if !ok {
        println!("SKIP: the openai package's types (no Python importing openai: set MINFER_PYTHON or run scripts/venv)");
        return None;
    }
    py
}

/// The bodies as scripts/openai-shapes.py reads them.
fn script_input(whole: &[Value], streams: &[Vec<Value>]) -> String {
    let mut lines = Vec::new();
    for v in whole {
        let kind = if v["object"] == "chat.completion" {
            "chat"
        } else {
            "completion"
        };
        lines.push(json!({"kind": kind, "body": v}).to_string());
    }
    for e in streams.iter().flatten() {
        if e["object"] == "chat.completion.chunk" {
            lines.push(json!({"kind": "chat.chunk", "body": e}).to_string());
        }
    }
    lines.join("\n")
}

const CHAT: &str = "/v1/chat/completions";
const CMPL: &str = "/v1/completions";

/// The bodies of one run: (whole replies, streams), every one already checked by the
/// shared helpers (`post_json` and `sse_json` validate what they read).
async fn bodies() -> (Vec<Value>, Vec<Vec<Value>>) {
    let path = model("bodies");
    let app = minfer_server::app(common::state_with(
        &path,
        ServeConfig {
            parallel: 4,
            ..Default::default()
        },
    ));
    let msgs = json!([{"role": "user", "content": "Hello there"}]);
    let chat_bodies = [
        json!({"messages": msgs, "max_tokens": 8, "temperature": 0}),
        json!({"messages": msgs, "max_tokens": 6, "temperature": 0.9, "seed": 3, "n": 3,
            "logprobs": true, "top_logprobs": 2, "stream_options": {"include_usage": true}}),
        json!({"messages": msgs, "max_tokens": 16, "temperature": 0, "stop": ["e"]}),
        json!({"messages": msgs, "tools": tools(), "tool_choice": "required", "max_tokens": 48,
            "temperature": 0}),
        json!({"messages": msgs, "tools": tools(), "max_tokens": 48, "temperature": 0,
            "tool_choice": {"type": "function", "function": {"name": "get_time"}},
            "n": 2, "stream_options": {"include_usage": true}}),
    ];
    let cmpl_bodies = [
        json!({"prompt": "Hello", "max_tokens": 6, "temperature": 0}),
        json!({"prompt": ["Hello", " the"], "max_tokens": 5, "temperature": 0.8, "seed": 1,
            "n": 2, "logprobs": 2, "stream_options": {"include_usage": true}}),
        json!({"prompt": "Hello", "max_tokens": 3, "temperature": 0, "echo": true}),
        json!({"prompt": "in the", "max_tokens": 12, "temperature": 0, "stop": ["t"]}),
    ];
    let (mut whole, mut streams) = (Vec::new(), Vec::new());
    for (route, list) in [(CHAT, &chat_bodies[..]), (CMPL, &cmpl_bodies[..])] {
        for b in list {
            let mut plain = b.clone();
            plain.as_object_mut().unwrap().remove("stream_options");
            let (status, v) = post_json(&app, route, &plain).await;
            assert!(status.is_success(), "{route} {plain}: {status} {v}");
            whole.push(v);
            let mut s = b.clone();
            s["stream"] = json!(true);
            let r = post(&app, route, &s).await;
            assert!(r.status.is_success(), "{route} {s}: {}", r.text());
            streams.push(sse_json(&r.body));
        }
    }
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
    (whole, streams)
}

/// Streamed tool-call deltas in a stream.
fn stream_calls(s: &[Value]) -> usize {
    s.iter()
        .flat_map(|e| e["choices"].as_array().cloned().unwrap_or_default())
        .flat_map(|c| {
            c["delta"]["tool_calls"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_body_has_openai_shapes_and_broken_ones_are_refused() {
    let (whole, streams) = bodies().await;
    // What the run covered: the checks above saw tool calls (streamed and whole), usage
    // chunks and several choices.
    let calls_whole: usize = whole
        .iter()
        .flat_map(|v| v["choices"].as_array().cloned().unwrap_or_default())
        .map(|c| c["message"]["tool_calls"].as_array().map_or(0, Vec::len))
        .sum();
    let calls_streamed: usize = streams.iter().map(|s| stream_calls(s)).sum();
    let usage_chunks = streams
        .iter()
        .filter(|s| s.last().is_some_and(|e| e["choices"] == json!([])))
        .count();
    println!(
        "openai shapes: {} whole replies, {} streams ({} chunks), {calls_whole} whole and {calls_streamed} streamed tool calls, {usage_chunks} usage chunks",
        whole.len(),
        streams.len(),
        streams.iter().map(Vec::len).sum::<usize>()
    );
    assert!(
        calls_whole >= 3 && calls_streamed >= 3,
        "the forced calls were made"
    );
    assert_eq!(usage_chunks, 3);

    // Control: each broken copy is refused, naming the rule.
    let tool_stream = streams
        .iter()
        .find(|s| stream_calls(s) > 0)
        .expect("a streamed call")
        .clone();
    let n3_stream = streams[1].clone();
    let mut broken: Vec<(&str, Vec<Value>)> = Vec::new();
    let find = |s: &[Value], pred: &dyn Fn(&Value) -> bool| s.iter().position(pred).unwrap();
    let has_call = |e: &Value| e["choices"][0]["delta"]["tool_calls"].is_array();
    {
        let mut s = tool_stream.clone();
        let k = find(&s, &has_call);
        s[k]["choices"][0]["delta"]["tool_calls"][0]["index"] = json!(1);
        broken.push(("a call's index off by one", s));
        let mut s = tool_stream.clone();
        s[k]["choices"][0]["delta"]["tool_calls"][0]
            .as_object_mut()
            .unwrap()
            .remove("type");
        broken.push(("a call's first delta without type", s));
        let mut s = tool_stream.clone();
        let mut again = s[k].clone();
        again["choices"][0]["delta"]["tool_calls"][0]["function"] = json!({"arguments": ""});
        s.insert(k + 1, again);
        broken.push(("a later delta of the call repeats its id", s));
    }
    {
        let mut s = n3_stream.clone();
        let k = find(&s, &|e| {
            e["choices"][0]["delta"].get("content").is_some()
                && e["choices"][0]["delta"].get("role").is_none()
        });
        s[k]["choices"][0]["delta"]["role"] = json!("assistant");
        broken.push(("role in a later delta", s));
        let mut s = n3_stream.clone();
        s[0]["choices"][0]["delta"]
            .as_object_mut()
            .unwrap()
            .remove("role");
        broken.push(("no role in the first delta", s));
        let mut s = n3_stream.clone();
        s[k]["choices"][0]["finish_reason"] = json!("length");
        broken.push(("finish_reason before the choice's last chunk", s));
        let mut s = n3_stream.clone();
        let last = s.len() - 2;
        s[last]["id"] = json!("chatcmpl-other");
        broken.push(("an id that changes", s));
        let mut s = n3_stream.clone();
        let usage = s.pop().unwrap();
        s.insert(s.len() - 1, usage);
        broken.push(("the usage chunk before the end", s));
        let mut s = n3_stream.clone();
        s[k]["usage"] = json!({"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2});
        broken.push(("usage on a content chunk", s));
        let mut s = n3_stream.clone();
        for e in s.iter_mut() {
            if e["choices"][0]["index"] == 2 {
                e["choices"][0]["index"] = json!(3);
            }
        }
        broken.push(("choice indices with a gap", s));
    }
    for (name, s) in &broken {
        let e = stream_violation(s);
        assert!(e.is_some(), "broken stream passed: {name}");
        println!(
            "control (stream) {name}: {}",
            e.unwrap().lines().next().unwrap()
        );
    }
    let call_reply = whole
        .iter()
        .find(|v| v["choices"][0]["message"]["tool_calls"].is_array())
        .unwrap()
        .clone();
    let n_reply = whole[1].clone();
    let mut bad: Vec<(&str, Value)> = Vec::new();
    let mut v = call_reply.clone();
    v["choices"][0]["message"]["tool_calls"][0]["index"] = json!(0);
    bad.push(("an index inside a whole reply's call", v));
    let mut v = call_reply.clone();
    v["choices"][0]["finish_reason"] = json!("stop");
    bad.push(("a call with finish_reason stop", v));
    let mut v = n_reply.clone();
    v["choices"][1]["index"] = json!(0);
    bad.push(("a repeated choice index", v));
    let mut v = n_reply.clone();
    v["usage"]["total_tokens"] = json!(0);
    bad.push(("usage that does not add up", v));
    let mut v = n_reply.clone();
    v["choices"][0]["message"]["role"] = json!("user");
    bad.push(("a reply from the user", v));
    for (name, v) in &bad {
        let e = body_violation(v);
        assert!(e.is_some(), "broken reply passed: {name}");
        println!(
            "control (whole) {name}: {}",
            e.unwrap().lines().next().unwrap()
        );
    }
    // And the untouched ones pass (they did inside the helpers too).
    for s in &streams {
        assert_eq!(stream_violation(s), None);
    }
    for v in &whole {
        assert_eq!(body_violation(v), None);
    }

    // The openai package's types, and their control.
    if let Some(py) = python_with_openai() {
        let input = script_input(&whole, &streams);
        let (ok, out) = minfer_testkit::script::pipe(&py, "openai-shapes.py", &input);
        assert!(ok, "the openai package's types refuse a body:\n{out}");
        println!("openai package: {}", out.trim());
        let mut v = whole[0].clone();
        v["choices"][0]["finish_reason"] = json!("done");
        let (ok, out) =
            minfer_testkit::script::pipe(&py, "openai-shapes.py", &script_input(&[v], &[]));
        assert!(
            !ok,
            "a finish_reason outside the API's list passed the package: {out}"
        );
    }
}

/// Issue 30: a reply that is bare JSON naming one of the request's tools (no `<tool_call>`
/// tags, as qwen2.5-coder writes at temperature 0) is a tool call, whole and streamed, in
/// OpenAI's shapes. The synthetic model is made to write exactly that JSON by a
/// `response_format` schema (tools stay `auto`). Control: the same request without `tools`
/// gets the JSON back as content, which is what a request with tools got before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bare_json_call_to_a_requested_tool_is_a_tool_call() {
    let path = model("bare");
    let app = minfer_server::app(common::state_with(&path, ServeConfig::default()));
    let call_schema = json!({"type": "json_schema", "json_schema": {"name": "call", "schema": {
        "type": "object", "additionalProperties": false, "required": ["name", "arguments"],
        "properties": {"name": {"const": "get_time"}, "arguments": {"type": "object",
            "additionalProperties": false, "required": ["zone"],
            "properties": {"zone": {"const": "utc"}}}}}}});
    let body = json!({"messages": [{"role": "user", "content": "Time?"}], "tools": tools(),
        "response_format": call_schema, "max_tokens": 64, "temperature": 0});
    let (status, v) = post_json(&app, CHAT, &body).await;
    assert!(status.is_success(), "{v}");
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    assert_eq!(choice["message"]["content"], Value::Null, "{v}");
    let call = &choice["message"]["tool_calls"][0]["function"];
    assert_eq!(call["name"], "get_time", "{v}");
    assert_eq!(call["arguments"], r#"{"zone":"utc"}"#, "{v}");

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let events = sse_json(&post(&app, CHAT, &streamed).await.body);
    assert_eq!(stream_calls(&events), 1, "{events:?}");
    let content: String = events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(content, "", "no content beside the call: {events:?}");
    let last = &events[events.len() - 1]["choices"][0];
    assert_eq!(last["finish_reason"], "tool_calls", "{events:?}");

    // Control: no tools, the same JSON is the reply's content.
    let mut plain = body.clone();
    plain.as_object_mut().unwrap().remove("tools");
    let (status, v) = post_json(&app, CHAT, &plain).await;
    assert!(status.is_success(), "{v}");
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    let parsed: Value = serde_json::from_str(text).unwrap();
    assert_eq!(parsed["name"], "get_time", "{v}");
    assert_ne!(v["choices"][0]["finish_reason"], "tool_calls", "{v}");
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}
