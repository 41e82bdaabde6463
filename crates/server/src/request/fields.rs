//! Typed reads of a JSON request object. Unknown fields are ignored; a known field with the
//! wrong type or an out-of-range value is a 400 naming it. JSON `null` reads as absent, as
//! OpenAI's clients send it for unset optionals.

use crate::error::ApiError;
use serde_json::{Map, Value};

pub struct Fields<'a> {
    obj: &'a Map<String, Value>,
}

/// What a JSON value is, for messages.
pub fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn wrong(name: &str, want: &str, got: &Value) -> ApiError {
    ApiError::bad_field(name, format!("`{name}` must be {want}, got {}", kind(got)))
}

fn out_of_range<T: std::fmt::Display>(
    name: &str,
    x: T,
    range: &std::ops::RangeInclusive<T>,
) -> ApiError {
    ApiError::bad_field(
        name,
        format!(
            "`{name}` = {x} is out of range ({} to {})",
            range.start(),
            range.end()
        ),
    )
}

impl<'a> Fields<'a> {
    /// The body must be a JSON object.
    pub fn of(body: &'a Value) -> Result<Fields<'a>, ApiError> {
        match body {
            Value::Object(obj) => Ok(Fields { obj }),
            other => Err(ApiError::bad_request(format!(
                "the request body must be a JSON object, got {}",
                kind(other)
            ))),
        }
    }

    pub fn get(&self, name: &str) -> Option<&'a Value> {
        self.obj.get(name).filter(|v| !v.is_null())
    }

    pub fn bool(&self, name: &str) -> Result<Option<bool>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(wrong(name, "a boolean", v)),
        }
    }

    pub fn str(&self, name: &str) -> Result<Option<&'a str>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(wrong(name, "a string", v)),
        }
    }

    /// A finite number within `range` (inclusive).
    pub fn number(
        &self,
        name: &str,
        range: std::ops::RangeInclusive<f64>,
    ) -> Result<Option<f64>, ApiError> {
        let v = match self.get(name) {
            None => return Ok(None),
            Some(v) => v,
        };
        let x = v.as_f64().ok_or_else(|| wrong(name, "a number", v))?;
        if !x.is_finite() || !range.contains(&x) {
            return Err(out_of_range(name, x, &range));
        }
        Ok(Some(x))
    }

    /// An integer within `range` (inclusive). `3.0` counts as an integer, `3.5` does not.
    pub fn int(
        &self,
        name: &str,
        range: std::ops::RangeInclusive<i64>,
    ) -> Result<Option<i64>, ApiError> {
        let v = match self.get(name) {
            None => return Ok(None),
            Some(v) => v,
        };
        let x = match v {
            Value::Number(n) => n
                .as_i64()
                .or_else(|| {
                    n.as_f64()
                        .filter(|f| f.fract() == 0.0 && f.abs() < 9.0e15)
                        .map(|f| f as i64)
                })
                .or_else(|| n.as_u64().map(|_| i64::MAX)),
            _ => None,
        }
        .ok_or_else(|| wrong(name, "an integer", v))?;
        if !range.contains(&x) {
            return Err(out_of_range(name, x, &range));
        }
        Ok(Some(x))
    }

    pub fn array(&self, name: &str) -> Result<Option<&'a Vec<Value>>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Array(a)) => Ok(Some(a)),
            Some(v) => Err(wrong(name, "an array", v)),
        }
    }

    pub fn object(&self, name: &str) -> Result<Option<&'a Map<String, Value>>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Object(o)) => Ok(Some(o)),
            Some(v) => Err(wrong(name, "an object", v)),
        }
    }

    /// A string or an array of strings (`stop`).
    pub fn strings(&self, name: &str, max: usize) -> Result<Vec<String>, ApiError> {
        let list = match self.get(name) {
            None => return Ok(Vec::new()),
            Some(Value::String(s)) => vec![s.clone()],
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| match v {
                    Value::String(s) => Ok(s.clone()),
                    other => Err(ApiError::bad_field(
                        name,
                        format!("`{name}` must hold strings, got {}", kind(other)),
                    )),
                })
                .collect::<Result<_, _>>()?,
            Some(v) => return Err(wrong(name, "a string or an array of strings", v)),
        };
        if list.len() > max {
            return Err(ApiError::bad_field(
                name,
                format!("`{name}` holds {} strings; at most {max}", list.len()),
            ));
        }
        Ok(list.into_iter().filter(|s| !s.is_empty()).collect())
    }
}
