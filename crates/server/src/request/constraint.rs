//! The fields that constrain a reply: OpenAI's `response_format` (`json_object`,
//! `json_schema` with `name`, `schema`, `strict`) and llama-server's `json_schema` (a
//! schema) and `grammar` (GBNF, or llguidance Lark after `%llguidance`). One at most.

use super::fields::{kind, Fields};
use crate::error::ApiError;
use minfer_generate::constrain::ConstraintSpec;
use serde_json::Value;

/// The constraint a body asks for, and the field that asked (for error messages).
pub fn read(f: &Fields) -> Result<Option<(ConstraintSpec, &'static str)>, ApiError> {
    let mut found: Vec<(ConstraintSpec, &'static str)> = Vec::new();
    if let Some(spec) = response_format(f)? {
        found.push((spec, "response_format"));
    }
    if let Some(v) = f.get("json_schema") {
        if !v.is_object() && !v.is_boolean() {
            return Err(ApiError::bad_field(
                "json_schema",
                format!(
                    "`json_schema` must be a JSON Schema object, got {}",
                    kind(v)
                ),
            ));
        }
        found.push((ConstraintSpec::JsonSchema(v.clone()), "json_schema"));
    }
    if let Some(g) = f.str("grammar")? {
        let spec = if g.trim_start().starts_with("%llguidance") {
            ConstraintSpec::Lark(g.to_string())
        } else {
            ConstraintSpec::Gbnf(g.to_string())
        };
        found.push((spec, "grammar"));
    }
    if found.len() > 1 {
        let names: Vec<&str> = found.iter().map(|(_, n)| *n).collect();
        return Err(ApiError::bad_field(
            names[1],
            format!(
                "`{}` each constrain the reply; give one",
                names.join("` and `")
            ),
        ));
    }
    Ok(found.pop())
}

fn response_format(f: &Fields) -> Result<Option<ConstraintSpec>, ApiError> {
    let Some(o) = f.object("response_format")? else {
        return Ok(None);
    };
    let bad = |field: &str, m: String| ApiError::bad_field(field, m);
    match o.get("type") {
        Some(Value::String(t)) if t == "text" => Ok(None),
        Some(Value::String(t)) if t == "json_object" => Ok(Some(match o.get("schema") {
            // llama-server also takes a schema here.
            Some(s) if s.is_object() => ConstraintSpec::JsonSchema(s.clone()),
            _ => ConstraintSpec::JsonObject,
        })),
        Some(Value::String(t)) if t == "json_schema" => {
            let Some(Value::Object(js)) = o.get("json_schema") else {
                return Err(bad(
                    "response_format.json_schema",
                    "`response_format` type `json_schema` needs a `json_schema` object".into(),
                ));
            };
            match js.get("name") {
                None | Some(Value::String(_)) => {}
                Some(v) => {
                    return Err(bad(
                        "response_format.json_schema.name",
                        format!("`json_schema.name` must be a string, got {}", kind(v)),
                    ))
                }
            }
            match js.get("strict") {
                None | Some(Value::Bool(_)) | Some(Value::Null) => {}
                Some(v) => {
                    return Err(bad(
                        "response_format.json_schema.strict",
                        format!("`json_schema.strict` must be a boolean, got {}", kind(v)),
                    ))
                }
            }
            match js.get("schema") {
                Some(s) if s.is_object() || s.is_boolean() => {
                    Ok(Some(ConstraintSpec::JsonSchema(s.clone())))
                }
                // OpenAI: no schema means any JSON.
                None => Ok(Some(ConstraintSpec::JsonSchema(Value::Bool(true)))),
                Some(v) => Err(bad(
                    "response_format.json_schema.schema",
                    format!(
                        "`json_schema.schema` must be a JSON Schema object, got {}",
                        kind(v)
                    ),
                )),
            }
        }
        Some(Value::String(t)) => Err(bad(
            "response_format",
            format!("`response_format` type `{t}` is unknown (text, json_object, json_schema)"),
        )),
        Some(v) => Err(bad(
            "response_format.type",
            format!("`response_format.type` must be a string, got {}", kind(v)),
        )),
        None => Err(bad(
            "response_format.type",
            "`response_format` needs a `type`".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(body: Value) -> Result<Option<ConstraintSpec>, ApiError> {
        Ok(read(&Fields::of(&body)?)?.map(|(s, _)| s))
    }

    #[test]
    fn each_field_gives_its_constraint() {
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        assert_eq!(spec(json!({})).unwrap(), None);
        assert_eq!(
            spec(json!({"response_format": {"type": "text"}})).unwrap(),
            None
        );
        assert_eq!(
            spec(json!({"response_format": {"type": "json_object"}})).unwrap(),
            Some(ConstraintSpec::JsonObject)
        );
        assert_eq!(
            spec(json!({"response_format": {"type": "json_schema",
                "json_schema": {"name": "x", "schema": schema, "strict": true}}}))
            .unwrap(),
            Some(ConstraintSpec::JsonSchema(schema.clone()))
        );
        assert_eq!(
            spec(json!({"json_schema": schema})).unwrap(),
            Some(ConstraintSpec::JsonSchema(schema.clone()))
        );
        assert_eq!(
            spec(json!({"grammar": "root ::= \"a\""})).unwrap(),
            Some(ConstraintSpec::Gbnf("root ::= \"a\"".into()))
        );
    }

    #[test]
    fn conflicts_and_bad_shapes_are_refused_by_field() {
        let e = spec(json!({"grammar": "root ::= \"a\"", "json_schema": {}})).unwrap_err();
        assert!(format!("{e:?}").contains("each constrain"), "{e:?}");
        let e = spec(json!({"response_format": {"type": "json_schema"}})).unwrap_err();
        assert!(
            format!("{e:?}").contains("response_format.json_schema"),
            "{e:?}"
        );
        let e = spec(json!({"response_format": {"type": "yaml"}})).unwrap_err();
        assert!(format!("{e:?}").contains("yaml"), "{e:?}");
        let e = spec(json!({"json_schema": "x"})).unwrap_err();
        assert!(format!("{e:?}").contains("json_schema"), "{e:?}");
    }
}
