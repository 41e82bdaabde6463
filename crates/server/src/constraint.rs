//! Constrained replies: a request's constraint compiled against the model's vocabulary
//! (the token trie is built once, on the first constrained request), and the tool-call
//! grammar used when `tool_choice` forces a call.
//!
//! A forced call's prompt already ends with the opening the template writes
//! (`prompt::chat_prompt`): `<tool_call>\n{"name": "` for `required`, or up to
//! `"arguments": ` for a named function. The grammar covers the rest: the name (one of the
//! tools), the arguments under that tool's `parameters` schema, `}`, and the closing
//! `</tool_call>`, after which only end of generation is allowed.

use crate::error::ApiError;
use crate::request::chat::{ChatRequest, ToolChoice};
use crate::request::GenParams;
use crate::AppState;
use minfer_generate::constrain::{ConstraintSpec, Grammar, Grammars};
use serde_json::Value;
use std::sync::Arc;

/// The vocabulary's grammar factory, built on first use.
fn grammars(state: &AppState) -> Result<Arc<Grammars>, ApiError> {
    state
        .grammars
        .get_or_init(|| {
            Grammars::new(&state.tok)
                .map(Arc::new)
                .map_err(|e| e.to_string())
        })
        .clone()
        .map_err(|e| ApiError::server(format!("constrained decoding is unavailable: {e}")))
}

fn compile(state: &AppState, spec: &ConstraintSpec, field: &str) -> Result<Grammar, ApiError> {
    grammars(state)?
        .compile(spec)
        .map_err(|e| ApiError::bad_field(field, e.to_string()))
}

/// A text completion's grammar (None: unconstrained).
pub fn text_grammar(state: &AppState, gen: &GenParams) -> Result<Option<Grammar>, ApiError> {
    gen.constraint
        .as_ref()
        .map(|(spec, field)| compile(state, spec, field))
        .transpose()
}

/// A chat reply's grammar: the request's constraint, or the tool call `tool_choice` forces.
pub fn chat_grammar(state: &AppState, req: &ChatRequest) -> Result<Option<Grammar>, ApiError> {
    let forced = matches!(req.tool_choice, ToolChoice::Required | ToolChoice::Named(_));
    match (&req.gen.constraint, forced) {
        (Some((_, field)), true) => Err(ApiError::bad_field(
            field,
            format!("`{field}` cannot be combined with a `tool_choice` that forces a call (the call's arguments follow the tool's parameters)"),
        )),
        (Some((spec, field)), false) => compile(state, spec, field).map(Some),
        (None, true) => {
            let close = state.tok.encode("</tool_call>", true);
            let lark = tool_call_lark(req.tools.as_ref(), &req.tool_choice, &close)?;
            compile(state, &ConstraintSpec::Lark(lark), "tool_choice").map(Some)
        }
        (None, false) => Ok(None),
    }
}

/// The Lark grammar of what follows the forced opening. `close` is how the tokenizer reads
/// `</tool_call>`: one added token (referenced by id, since no text can produce it) or text.
pub fn tool_call_lark(
    tools: Option<&Value>,
    choice: &ToolChoice,
    close: &[u32],
) -> Result<String, ApiError> {
    let list = tools.and_then(Value::as_array).cloned().unwrap_or_default();
    let schema_of = |t: &Value| -> Value {
        let mut s = t
            .pointer("/function/parameters")
            .cloned()
            .unwrap_or_else(|| serde_json::json!({"type": "object"}));
        minfer_generate::constrain::compact_json(&mut s);
        s
    };
    let name_of = |t: &Value| {
        t.pointer("/function/name")
            .and_then(Value::as_str)
            .map(String::from)
    };
    let close = match close {
        [id] => format!("<[{id}]>"),
        _ => lark_str("</tool_call>"),
    };
    let tail = format!("\"}}\" \"\\n\" {close}");
    let mut out = String::new();
    match choice {
        ToolChoice::Named(name) => {
            let t = list
                .iter()
                .find(|t| name_of(t).as_deref() == Some(name))
                .ok_or_else(|| {
                    ApiError::bad_field(
                        "tool_choice",
                        format!("`tool_choice` names {name:?}, which is not in `tools`"),
                    )
                })?;
            out.push_str(&format!("start: %json {} {tail}\n", schema_of(t)));
        }
        _ => {
            let mut alts = Vec::new();
            for (i, t) in list.iter().enumerate() {
                let Some(name) = name_of(t) else { continue };
                // The name's JSON text without its opening quote (the prompt has it).
                let quoted = serde_json::to_string(&name).unwrap_or_default();
                let head = format!("{}, \"arguments\": ", &quoted[1..]);
                out.push_str(&format!(
                    "call{i}: {} %json {} {tail}\n",
                    lark_str(&head),
                    schema_of(t)
                ));
                alts.push(format!("call{i}"));
            }
            if alts.is_empty() {
                return Err(ApiError::bad_field("tools", "no tool has a name to call"));
            }
            out = format!("start: {}\n{out}", alts.join(" | "));
        }
    }
    Ok(out)
}

/// A Lark string literal (JSON's escaping is Lark's).
fn lark_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}
