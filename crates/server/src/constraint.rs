//! Constrained replies: a request's constraint compiled against the model's vocabulary
//! (the token trie is built once, on the first constrained request), and the tool-call
//! grammar used when `tool_choice` forces a call.
//!
//! A forced call's prompt already ends with the opening the template writes
//! (`prompt::chat_prompt`): `<tool_call>\n{"name": "` for `required`, or up to
//! `"arguments": ` for a named function. The grammar covers the rest: the name (one of the
//! tools), the arguments under that tool's `parameters` schema, `}`, and the closing
//! `</tool_call>`, after which only end of generation is allowed.
//!
//! The arguments hold only the keys their schema names: an object schema that does not
//! say `additionalProperties` is closed (`false`), as OpenAI's strict mode does; JSON
//! Schema's own default (`true`) would let the model invent keys the tool never declared.

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
        close_objects(&mut s, false);
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

/// Gives every object schema in `schema` that does not say `additionalProperties` the value
/// `false` (module docs), nested ones included. The branches of an `allOf` stay open
/// (their objects are checked together: closing each would refuse the others' keys), but
/// what they nest is closed.
fn close_objects(schema: &mut Value, in_all_of: bool) {
    let Value::Object(s) = schema else { return };
    let is_object = s.contains_key("properties")
        || match s.get("type") {
            Some(Value::String(t)) => t == "object",
            Some(Value::Array(ts)) => ts.iter().any(|t| t == "object"),
            _ => false,
        };
    if is_object && !in_all_of && !s.contains_key("additionalProperties") {
        s.insert("additionalProperties".into(), Value::Bool(false));
    }
    for (key, sub) in s.iter_mut() {
        match key.as_str() {
            "properties" | "patternProperties" | "$defs" | "definitions" => {
                if let Value::Object(m) = sub {
                    m.values_mut().for_each(|v| close_objects(v, false));
                }
            }
            "items" | "additionalProperties" | "not" => close_objects(sub, false),
            "prefixItems" | "anyOf" | "oneOf" | "allOf" => {
                if let Value::Array(l) = sub {
                    let all_of = key == "allOf";
                    l.iter_mut().for_each(|v| close_objects(v, all_of));
                }
            }
            _ => {}
        }
    }
}

/// A Lark string literal (JSON's escaping is Lark's).
fn lark_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use minfer_generate::constrain::SPECIAL_TOKEN_MARKER;
    use serde_json::json;

    /// Every byte a token, then an end-of-generation token.
    fn grammars() -> Grammars {
        let mut words: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        words.push([&[SPECIAL_TOKEN_MARKER][..], b"<eos>"].concat());
        Grammars::from_words(words, &[256]).unwrap()
    }

    fn bytes(s: &str) -> Vec<u32> {
        s.bytes().map(u32::from).collect()
    }

    /// Issue 30: a forced call's arguments hold only the keys the tool's schema names when
    /// the schema leaves `additionalProperties` unset (OpenAI's strict mode), nested objects
    /// and arrays of objects too; a schema that allows more keys keeps them allowed.
    /// Control: the same arguments with an invented key are accepted by the schema as
    /// written (`close_objects` skipped), which is what the grammar did before.
    #[test]
    fn forced_arguments_hold_only_the_schemas_keys() {
        let params = json!({"type": "object", "properties": {
            "city": {"type": "string"},
            "when": {"type": "object", "properties": {"day": {"type": "integer"}}},
            "stops": {"type": "array", "items": {"type": "object",
                "properties": {"at": {"type": "string"}}}},
        }, "required": ["city"]});
        let tools = json!([{"type": "function",
            "function": {"name": "trip", "parameters": params}}]);
        let g = grammars();
        let compile = |tools: &Value| {
            let lark = tool_call_lark(Some(tools), &ToolChoice::Required, &[]).unwrap();
            g.compile(&ConstraintSpec::Lark(lark)).unwrap()
        };
        let call = |args: &str| bytes(&format!("trip\", \"arguments\": {args}}}\n</tool_call>"));
        let grammar = compile(&tools);
        let good = r#"{"city": "Oslo", "when": {"day": 3}, "stops": [{"at": "Bergen"}]}"#;
        assert!(grammar.accepts_tokens(&call(good)), "{good}");
        let invented = [
            r#"{"city": "Oslo", "country": "NO"}"#,
            r#"{"city": "Oslo", "when": {"day": 3, "hour": 4}}"#,
            r#"{"city": "Oslo", "stops": [{"at": "Bergen", "for": 2}]}"#,
        ];
        for args in invented {
            assert!(
                !grammar.accepts_tokens(&call(args)),
                "invented key allowed: {args}"
            );
        }
        // Control: the schema as written (no close_objects) allows the invented keys.
        let open = format!(
            "start: %json {} \"}}\" \"\\n\" \"</tool_call>\"\n",
            json!({"type": "object", "properties": {"city": {"type": "string"}}})
        );
        let open = g.compile(&ConstraintSpec::Lark(open)).unwrap();
        assert!(open.accepts_tokens(&bytes(&format!("{}}}\n</tool_call>", invented[0]))));
        // A schema that says additionalProperties keeps its word.
        let mut loose = tools.clone();
        loose[0]["function"]["parameters"]["additionalProperties"] = json!(true);
        assert!(compile(&loose).accepts_tokens(&call(invented[0])));
    }

    #[test]
    fn close_objects_leaves_all_of_branches_open_and_closes_what_they_nest() {
        let mut s = json!({"allOf": [
            {"type": "object", "properties": {"a": {"type": "object"}}},
            {"properties": {"b": {"type": "string"}}},
        ]});
        close_objects(&mut s, false);
        assert_eq!(s["allOf"][0].get("additionalProperties"), None);
        assert_eq!(s["allOf"][1].get("additionalProperties"), None);
        assert_eq!(
            s["allOf"][0]["properties"]["a"]["additionalProperties"],
            false
        );
        let mut s = json!({"type": ["object", "null"], "$defs": {"p": {"type": "object"}}});
        close_objects(&mut s, false);
        assert_eq!(s["additionalProperties"], false);
        assert_eq!(s["$defs"]["p"]["additionalProperties"], false);
    }
}
