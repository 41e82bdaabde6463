//! Every chat and completion body the server tests produce, held to OpenAI's shapes
//! (issue 37): the schema in `tests/fixtures/openai-shapes.json` (written from OpenAI's
//! OpenAPI document; its `$comment` says what it encodes) and the stream rules no schema can
//! state, checked here:
//!
//! 1. every chunk of a stream has the same `object`, `id`, `created`, `model` and
//!    `system_fingerprint`;
//! 2. the choice indices are 0..n, each seen; a chunk's choices are not empty unless it is
//!    the usage chunk;
//! 3. chat: a choice's first delta has `role: "assistant"`, no later one has a role;
//! 4. a choice's `finish_reason` is non-null in exactly one chunk, its last;
//! 5. the usage chunk (`choices: []`, `usage` an object, total = prompt + completion) comes
//!    at most once, last; every other chunk's `usage` is absent or null;
//! 6. chat tool calls: a choice's calls have indices 0, 1, 2… in the order they start; the
//!    first delta of a call has its `id`, `type: "function"` and `function.name`, later
//!    deltas of the call none of them; call ids are unique; `finish_reason` is
//!    `tool_calls` exactly when the choice made a call (whole replies too);
//! 7. whole replies: choice indices 0..n in order, usage totals add up.
//!
//! `check_body` / `check_stream` panic with the rule broken; the `*_violation` forms return
//! it (the control test feeds them broken bodies).
#![allow(dead_code)]

use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::sync::OnceLock;

fn shapes() -> &'static Value {
    static S: OnceLock<Value> = OnceLock::new();
    S.get_or_init(|| {
        let text = include_str!("../fixtures/openai-shapes.json");
        serde_json::from_str(text).expect("openai-shapes.json is JSON")
    })
}

fn type_ok(name: &str, v: &Value) -> bool {
    match name {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "integer" => v.is_i64() || v.is_u64(),
        "number" => v.is_number(),
        "boolean" => v.is_boolean(),
        "null" => v.is_null(),
        other => panic!("openai-shapes.json: unknown type {other:?}"),
    }
}

/// `v` against `schema` (the subset the fixture uses); the first mismatch, at its path.
pub fn validate(schema: &Value, v: &Value, path: &str) -> Result<(), String> {
    if let Some(r) = schema.get("$ref").and_then(Value::as_str) {
        let name = r.strip_prefix("#/$defs/").expect("refs into $defs");
        let def = &shapes()["$defs"][name];
        assert!(!def.is_null(), "openai-shapes.json: no $defs/{name}");
        return validate(def, v, path);
    }
    if let Some(any) = schema.get("anyOf").and_then(Value::as_array) {
        let errs: Vec<String> = any
            .iter()
            .filter_map(|s| validate(s, v, path).err())
            .collect();
        if errs.len() == any.len() {
            return Err(format!(
                "{path}: matches no alternative ({})",
                errs.join("; ")
            ));
        }
        return Ok(());
    }
    if let Some(t) = schema.get("type") {
        let ok = match t {
            Value::String(n) => type_ok(n, v),
            Value::Array(ns) => ns.iter().any(|n| type_ok(n.as_str().unwrap(), v)),
            _ => panic!("openai-shapes.json: bad type {t}"),
        };
        if !ok {
            return Err(format!("{path}: {v} is not of type {t}"));
        }
    }
    if let Some(e) = schema.get("enum").and_then(Value::as_array) {
        if !e.contains(v) {
            return Err(format!(
                "{path}: {v} is not one of {}",
                Value::from(e.clone())
            ));
        }
    }
    if let Some(o) = v.as_object() {
        if let Some(req) = schema.get("required").and_then(Value::as_array) {
            for k in req {
                let k = k.as_str().unwrap();
                if !o.contains_key(k) {
                    return Err(format!("{path}: required `{k}` is missing"));
                }
            }
        }
        let props = schema.get("properties").and_then(Value::as_object);
        for (k, x) in o {
            let sub = format!("{path}.{k}");
            match props.and_then(|p| p.get(k)) {
                Some(s) => validate(s, x, &sub)?,
                None => match schema.get("additionalProperties") {
                    Some(Value::Bool(false)) => {
                        return Err(format!("{path}: `{k}` is not a property of this object"))
                    }
                    Some(s @ Value::Object(_)) => validate(s, x, &sub)?,
                    _ => {}
                },
            }
        }
    }
    if let (Some(items), Some(a)) = (schema.get("items"), v.as_array()) {
        for (i, x) in a.iter().enumerate() {
            validate(items, x, &format!("{path}[{i}]"))?;
        }
    }
    Ok(())
}

fn def(name: &str) -> Value {
    serde_json::json!({ "$ref": format!("#/$defs/{name}") })
}

fn usage_adds_up(u: &Value, path: &str) -> Result<(), String> {
    let n = |k: &str| u[k].as_u64().unwrap_or(0);
    if n("prompt_tokens") + n("completion_tokens") != n("total_tokens") {
        return Err(format!(
            "{path}: total_tokens is not prompt + completion: {u}"
        ));
    }
    Ok(())
}

/// A whole reply's first violation (None for bodies that are not chat or completion
/// replies: errors, model lists).
pub fn body_violation(v: &Value) -> Option<String> {
    let kind = match v.get("object").and_then(Value::as_str) {
        Some("chat.completion") => "ChatCompletion",
        Some("text_completion") => "Completion",
        _ => return None,
    };
    let r = (|| {
        validate(&def(kind), v, "$")?;
        let choices = v["choices"].as_array().unwrap();
        let mut ids = HashSet::new();
        for (i, c) in choices.iter().enumerate() {
            if c["index"].as_u64() != Some(i as u64) {
                return Err(format!("choices[{i}] has index {}", c["index"]));
            }
            if kind == "ChatCompletion" {
                let calls = c["message"]["tool_calls"].as_array().map_or(0, Vec::len);
                for tc in c["message"]["tool_calls"].as_array().into_iter().flatten() {
                    if !ids.insert(tc["id"].to_string()) {
                        return Err(format!("choices[{i}]: tool call id {} repeats", tc["id"]));
                    }
                }
                let tools_finish = c["finish_reason"] == "tool_calls";
                if tools_finish != (calls > 0) {
                    return Err(format!(
                        "choices[{i}]: finish_reason {} with {calls} tool calls",
                        c["finish_reason"]
                    ));
                }
            }
        }
        if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
            usage_adds_up(u, "$.usage")?;
        }
        Ok(())
    })();
    r.err().map(|e| format!("{e}\nbody: {v}"))
}

/// A stream's first violation; `events` are its JSON payloads without `[DONE]`. A stream
/// that reports an error (an OpenAI error event, then `[DONE]`) is checked up to the error,
/// without the rules about how choices end.
pub fn stream_violation(events: &[Value]) -> Option<String> {
    let end = events
        .iter()
        .position(|e| e.get("error").is_some())
        .unwrap_or(events.len());
    let errored = end < events.len();
    let events = &events[..end];
    let first = events.first()?;
    let (kind, chat) = match first.get("object").and_then(Value::as_str) {
        Some("chat.completion.chunk") => ("ChatCompletionChunk", true),
        Some("text_completion") => ("Completion", false),
        other => return Some(format!("chunk 0: object {other:?} is not a chunk's")),
    };
    let r = (|| {
        let mut role_seen: HashMap<u64, usize> = HashMap::new();
        let mut finished: HashMap<u64, String> = HashMap::new();
        let mut calls: HashMap<u64, usize> = HashMap::new();
        let mut call_ids = HashSet::new();
        let mut indices = HashSet::new();
        let mut usage_at = None;
        for (k, e) in events.iter().enumerate() {
            let at = format!("chunk {k}");
            validate(&def(kind), e, &at)?;
            for key in ["object", "id", "created", "model", "system_fingerprint"] {
                if e.get(key) != first.get(key)
                    && !(key == "system_fingerprint" && e.get(key).is_none())
                {
                    return Err(format!(
                        "{at}: `{key}` {:?} differs from chunk 0's {:?}",
                        e.get(key),
                        first.get(key)
                    ));
                }
            }
            if let Some(u) = usage_at {
                return Err(format!("{at}: comes after the usage chunk {u}"));
            }
            let choices = e["choices"].as_array().unwrap();
            let usage = e.get("usage").filter(|u| !u.is_null());
            if choices.is_empty() {
                let u = usage.ok_or_else(|| format!("{at}: no choices and no usage"))?;
                usage_adds_up(u, &at)?;
                usage_at = Some(k);
                continue;
            }
            if usage.is_some() {
                return Err(format!("{at}: usage on a chunk with choices"));
            }
            for c in choices {
                let i = c["index"].as_u64().unwrap();
                indices.insert(i);
                if let Some(f) = finished.get(&i) {
                    return Err(format!(
                        "{at}: choice {i} continues after its finish_reason {f}"
                    ));
                }
                if !c["finish_reason"].is_null() {
                    finished.insert(i, c["finish_reason"].to_string());
                }
                if !chat {
                    continue;
                }
                let d = &c["delta"];
                let n_seen = role_seen.entry(i).or_insert(0);
                match (*n_seen, d.get("role")) {
                    (0, Some(r)) if r == "assistant" => {}
                    (0, r) => return Err(format!("{at}: choice {i}'s first delta has role {r:?}")),
                    (_, Some(r)) => {
                        return Err(format!(
                            "{at}: choice {i} repeats role {r} after its first delta"
                        ))
                    }
                    _ => {}
                }
                *n_seen += 1;
                for tc in d["tool_calls"].as_array().into_iter().flatten() {
                    let n = calls.entry(i).or_insert(0);
                    let ti = tc["index"].as_u64().unwrap() as usize;
                    let head = ["id", "type"]
                        .iter()
                        .filter(|f| tc.get(**f).is_some())
                        .count()
                        + usize::from(tc["function"].get("name").is_some());
                    if ti == *n {
                        // A call's first delta.
                        *n += 1;
                        if head != 3
                            || tc["id"].as_str().is_none_or(str::is_empty)
                            || tc["function"]["name"].as_str().is_none_or(str::is_empty)
                        {
                            return Err(format!("{at}: choice {i}: call {ti}'s first delta lacks id, type or name: {tc}"));
                        }
                        if !call_ids.insert(tc["id"].to_string()) {
                            return Err(format!("{at}: tool call id {} repeats", tc["id"]));
                        }
                    } else if ti + 1 == *n {
                        if head != 0 {
                            return Err(format!("{at}: choice {i}: call {ti}'s later delta repeats id, type or name: {tc}"));
                        }
                    } else {
                        return Err(format!("{at}: choice {i}: tool call index {ti} where {} (a new call) or {} (the current one) was due", *n, n.wrapping_sub(1) as isize));
                    }
                }
            }
        }
        let n = indices.len() as u64;
        if indices.iter().any(|&i| i >= n) {
            return Err(format!("choice indices {indices:?} are not 0..{n}"));
        }
        for i in (0..n).filter(|_| !errored) {
            let f = finished
                .get(&i)
                .ok_or_else(|| format!("choice {i} never gets a finish_reason"))?;
            if chat && (f == "\"tool_calls\"") != calls.get(&i).is_some_and(|&c| c > 0) {
                return Err(format!(
                    "choice {i}: finish_reason {f} with {} tool calls",
                    calls.get(&i).copied().unwrap_or(0)
                ));
            }
        }
        Ok(())
    })();
    r.err().map(|e| {
        let all: Vec<String> = events.iter().map(Value::to_string).collect();
        format!("{e}\nstream:\n{}", all.join("\n"))
    })
}

/// Panics on a whole reply that breaks the shapes (see the module doc).
pub fn check_body(v: &Value) {
    if let Some(e) = body_violation(v) {
        panic!("not an OpenAI reply: {e}");
    }
}

/// Panics on a stream that breaks the shapes or the stream rules (see the module doc).
pub fn check_stream(events: &[Value]) {
    if let Some(e) = stream_violation(events) {
        panic!("not an OpenAI stream: {e}");
    }
}
