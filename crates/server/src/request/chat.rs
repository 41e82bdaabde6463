//! `POST /v1/chat/completions` bodies: messages, tools and the chat-only fields.

use super::fields::{kind, Fields};
use super::{gen_params, GenParams, Limits, MAX_TOP_LOGPROBS};
use crate::error::ApiError;
use minfer_tokenizer::template::{FunctionCall, Message, ToolCall};
use serde_json::{Map, Value};

/// How the reply may use the tools.
#[derive(Clone, Debug, PartialEq)]
pub enum ToolChoice {
    /// No tools given, or `none`: the tools are not shown to the model.
    None,
    Auto,
    Required,
    Named(String),
}

#[derive(Clone, Debug)]
pub struct ChatRequest {
    pub messages: Vec<Message>,
    /// The `tools` list as the template sees it (OpenAI's shape).
    pub tools: Option<Value>,
    pub tool_choice: ToolChoice,
    pub gen: GenParams,
}

const ROLES: [&str; 5] = ["system", "user", "assistant", "tool", "developer"];

pub fn parse(body: &Value, lim: &Limits) -> Result<ChatRequest, ApiError> {
    let f = Fields::of(body)?;
    let messages = match f.get("messages") {
        None => return Err(ApiError::bad_field("messages", "`messages` is required")),
        Some(Value::Array(list)) if list.is_empty() => {
            return Err(ApiError::bad_field("messages", "`messages` is empty"))
        }
        Some(Value::Array(list)) => list
            .iter()
            .enumerate()
            .map(|(i, m)| message(i, m))
            .collect::<Result<Vec<_>, _>>()?,
        Some(v) => {
            return Err(ApiError::bad_field(
                "messages",
                format!("`messages` must be an array, got {}", kind(v)),
            ))
        }
    };
    let logprobs = match f.bool("logprobs")? {
        Some(true) => Some(f.int("top_logprobs", 0..=MAX_TOP_LOGPROBS)?.unwrap_or(0) as usize),
        _ => {
            // OpenAI: "logprobs must be set to true if top_logprobs is used".
            if f.int("top_logprobs", 0..=MAX_TOP_LOGPROBS)?.is_some() {
                return Err(ApiError::bad_field(
                    "top_logprobs",
                    "`top_logprobs` needs `logprobs: true`",
                ));
            }
            None
        }
    };
    let gen = gen_params(&f, lim, logprobs)?;
    let tools = match f.array("tools")? {
        None => None,
        Some(list) => {
            // Counted as compact JSON: what the template renders, whatever the client's spacing.
            let bytes = serde_json::to_vec(list).map_or(usize::MAX, |v| v.len());
            if bytes > lim.max_tools_bytes {
                return Err(ApiError::bad_field(
                    "tools",
                    format!(
                        "`tools` is {bytes} bytes of JSON; at most {} (--max-tools-bytes)",
                        lim.max_tools_bytes
                    ),
                )
                .with_code("tools_too_large"));
            }
            for (i, t) in list.iter().enumerate() {
                tool(i, t)?;
            }
            (!list.is_empty()).then(|| Value::Array(list.clone()))
        }
    };
    let tool_choice = tool_choice(&f, tools.as_ref())?;
    f.bool("parallel_tool_calls")?;
    Ok(ChatRequest {
        messages,
        tools,
        tool_choice,
        gen,
    })
}

fn message(i: usize, v: &Value) -> Result<Message, ApiError> {
    let at = |field: &str| format!("messages[{i}].{field}");
    let Value::Object(o) = v else {
        return Err(ApiError::bad_field(
            &format!("messages[{i}]"),
            format!("messages[{i}] must be an object, got {}", kind(v)),
        ));
    };
    let role = match o.get("role") {
        Some(Value::String(r)) if ROLES.contains(&r.as_str()) => r.as_str(),
        Some(Value::String(r)) => {
            return Err(ApiError::bad_field(
                &at("role"),
                format!(
                    "messages[{i}].role {r:?} is not one of {}",
                    ROLES.join(", ")
                ),
            ))
        }
        Some(v) => {
            return Err(ApiError::bad_field(
                &at("role"),
                format!("messages[{i}].role must be a string, got {}", kind(v)),
            ))
        }
        None => {
            return Err(ApiError::bad_field(
                &at("role"),
                format!("messages[{i}] has no role"),
            ))
        }
    };
    let content = match o.get("content") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Array(parts)) => Some(text_parts(i, parts)?),
        Some(v) => {
            return Err(ApiError::bad_field(
                &at("content"),
                format!(
                    "messages[{i}].content must be a string or an array of text parts, got {}",
                    kind(v)
                ),
            ))
        }
    };
    let tool_calls = match o.get("tool_calls") {
        None | Some(Value::Null) => None,
        Some(Value::Array(calls)) if role == "assistant" => Some(
            calls
                .iter()
                .enumerate()
                .map(|(j, c)| tool_call(i, j, c))
                .collect::<Result<Vec<_>, _>>()?,
        ),
        Some(Value::Array(_)) => {
            return Err(ApiError::bad_field(
                &at("tool_calls"),
                format!("messages[{i}]: only assistant messages carry tool_calls"),
            ))
        }
        Some(v) => {
            return Err(ApiError::bad_field(
                &at("tool_calls"),
                format!("messages[{i}].tool_calls must be an array, got {}", kind(v)),
            ))
        }
    };
    if content.is_none() && tool_calls.is_none() {
        return Err(ApiError::bad_field(
            &at("content"),
            format!("messages[{i}] ({role}) has no content"),
        ));
    }
    let string_field = |name: &str| -> Result<Option<String>, ApiError> {
        match o.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(v) => Err(ApiError::bad_field(
                &at(name),
                format!("messages[{i}].{name} must be a string, got {}", kind(v)),
            )),
        }
    };
    Ok(Message {
        // The templates minfer knows have no developer role; OpenAI defines it as the
        // system message of newer models.
        role: if role == "developer" { "system" } else { role }.to_string(),
        content,
        tool_calls,
        tool_call_id: string_field("tool_call_id")?,
        name: string_field("name")?,
        extra: Map::new(),
    })
}

/// An array of content parts: only `text` parts, joined.
fn text_parts(i: usize, parts: &[Value]) -> Result<String, ApiError> {
    let mut text = String::new();
    for (j, p) in parts.iter().enumerate() {
        let at = format!("messages[{i}].content[{j}]");
        let o = p.as_object().ok_or_else(|| {
            ApiError::bad_field(&at, format!("{at} must be an object, got {}", kind(p)))
        })?;
        match o.get("type") {
            Some(Value::String(t)) if t == "text" => match o.get("text") {
                Some(Value::String(s)) => text.push_str(s),
                _ => {
                    return Err(ApiError::bad_field(
                        &format!("{at}.text"),
                        format!("{at} is a text part without a `text` string"),
                    ))
                }
            },
            Some(Value::String(t)) => {
                return Err(ApiError::bad_field(
                    &format!("{at}.type"),
                    format!("{at}: content parts of type `{t}` are not supported (text only)"),
                ))
            }
            _ => {
                return Err(ApiError::bad_field(
                    &format!("{at}.type"),
                    format!("{at} needs a `type` string"),
                ))
            }
        }
    }
    Ok(text)
}

fn tool_call(i: usize, j: usize, v: &Value) -> Result<ToolCall, ApiError> {
    let at = format!("messages[{i}].tool_calls[{j}]");
    let bad = |m: &str| ApiError::bad_field(&at, format!("{at}: {m}"));
    let o = v.as_object().ok_or_else(|| bad("must be an object"))?;
    let func = o
        .get("function")
        .and_then(Value::as_object)
        .ok_or_else(|| bad("needs a `function` object"))?;
    let name = func
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("needs `function.name` as a string"))?;
    // OpenAI sends arguments as JSON text; templates print them with `tojson`, so they get
    // the object when the text is one.
    let arguments = match func.get("arguments") {
        None | Some(Value::Null) => Value::Object(Map::new()),
        Some(Value::String(s)) => serde_json::from_str::<Value>(s)
            .ok()
            .filter(Value::is_object)
            .unwrap_or_else(|| Value::String(s.clone())),
        Some(v @ Value::Object(_)) => v.clone(),
        Some(_) => {
            return Err(bad(
                "`function.arguments` must be a JSON string or an object",
            ))
        }
    };
    Ok(ToolCall {
        id: o.get("id").and_then(Value::as_str).map(str::to_string),
        kind: Some("function".into()),
        function: FunctionCall {
            name: name.to_string(),
            arguments,
            extra: Map::new(),
        },
        extra: Map::new(),
    })
}

/// Checks `tools[i]` as an OpenAI function tool (also `minfer render`'s check).
pub fn tool(i: usize, v: &Value) -> Result<(), ApiError> {
    let at = format!("tools[{i}]");
    let bad = |field: &str, m: String| ApiError::bad_field(&format!("{at}{field}"), m);
    let o = v
        .as_object()
        .ok_or_else(|| bad("", format!("{at} must be an object, got {}", kind(v))))?;
    match o.get("type") {
        Some(Value::String(t)) if t == "function" => {}
        _ => return Err(bad(".type", format!("{at}.type must be \"function\""))),
    }
    let func = match o.get("function") {
        Some(Value::Object(f)) => f,
        _ => return Err(bad(".function", format!("{at}.function must be an object"))),
    };
    match func.get("name") {
        Some(Value::String(n)) if !n.is_empty() => {}
        _ => {
            return Err(bad(
                ".function.name",
                format!("{at}.function.name must be a non-empty string"),
            ))
        }
    }
    match func.get("description") {
        None | Some(Value::Null) | Some(Value::String(_)) => {}
        Some(v) => {
            return Err(bad(
                ".function.description",
                format!(
                    "{at}.function.description must be a string, got {}",
                    kind(v)
                ),
            ))
        }
    }
    match func.get("parameters") {
        None | Some(Value::Null) | Some(Value::Object(_)) => Ok(()),
        Some(v) => Err(bad(
            ".function.parameters",
            format!(
                "{at}.function.parameters must be a JSON Schema object, got {}",
                kind(v)
            ),
        )),
    }
}

fn tool_choice(f: &Fields, tools: Option<&Value>) -> Result<ToolChoice, ApiError> {
    let names: Vec<&str> = tools
        .and_then(Value::as_array)
        .map(|l| {
            l.iter()
                .filter_map(|t| t.pointer("/function/name").and_then(Value::as_str))
                .collect()
        })
        .unwrap_or_default();
    let bad = |m: String| ApiError::bad_field("tool_choice", m);
    let choice = match f.get("tool_choice") {
        None => {
            if tools.is_some() {
                ToolChoice::Auto
            } else {
                ToolChoice::None
            }
        }
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => {
                return Err(bad(format!(
                    "`tool_choice` {other:?} is not none, auto, required or a named function"
                )))
            }
        },
        Some(Value::Object(o)) => match o
            .get("function")
            .and_then(|f| f.get("name"))
            .and_then(Value::as_str)
        {
            Some(n) => ToolChoice::Named(n.to_string()),
            None => return Err(bad("`tool_choice` as an object needs function.name".into())),
        },
        Some(v) => {
            return Err(bad(format!(
                "`tool_choice` must be a string or an object, got {}",
                kind(v)
            )))
        }
    };
    match &choice {
        ToolChoice::Required | ToolChoice::Named(_) if tools.is_none() => Err(bad(
            "`tool_choice` asks for a tool call but `tools` is empty".into(),
        )),
        ToolChoice::Named(n) if !names.contains(&n.as_str()) => Err(bad(format!(
            "`tool_choice` names {n:?}, which is not in `tools`"
        ))),
        ToolChoice::Auto if tools.is_none() => Ok(ToolChoice::None),
        _ => Ok(choice),
    }
}
