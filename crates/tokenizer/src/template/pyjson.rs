//! Python-compatible text for template values: `json.dumps` (HF's `tojson` filter) and
//! `str()`/`repr()` (what Jinja2 prints for `{{ value }}`).
//!
//! HF transformers replaces Jinja2's `tojson` with
//! `json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`: no HTML
//! escaping, keys in the order given, separators `", "`/`": "` without indent and `","`/`": "`
//! with one. minijinja's own `tojson` is compact and HTML-escapes, so it would change the bytes
//! of every tool schema a template prints.

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, Value};
use std::fmt::Write;

/// Options of Python's `json.dumps` that templates use.
#[derive(Clone, Debug, Default)]
pub struct DumpOptions {
    pub ensure_ascii: bool,
    /// `None`: one line; `Some(s)`: newline plus `s` per nesting level.
    pub indent: Option<String>,
    /// `(item, key)` separators; `None` picks Python's defaults for the indent mode.
    pub separators: Option<(String, String)>,
    pub sort_keys: bool,
}

/// The `tojson` filter with HF's signature:
/// `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
pub fn tojson_filter(value: Value, args: minijinja::value::Rest<Value>) -> Result<Value, Error> {
    let mut positional: Vec<Value> = args.0;
    let kwargs = match positional.last() {
        Some(v) if v.is_kwargs() => Some(Kwargs::try_from(positional.pop().unwrap_or_default())?),
        _ => None,
    };
    const NAMES: [&str; 4] = ["ensure_ascii", "indent", "separators", "sort_keys"];
    if positional.len() > NAMES.len() {
        return Err(Error::new(
            ErrorKind::TooManyArguments,
            format!(
                "tojson takes at most {} arguments after the value",
                NAMES.len()
            ),
        ));
    }
    let mut slots: [Option<Value>; 4] = Default::default();
    for (slot, v) in slots.iter_mut().zip(positional) {
        *slot = Some(v);
    }
    if let Some(kw) = &kwargs {
        for (i, name) in NAMES.iter().enumerate() {
            if kw.has(name) {
                if slots[i].is_some() {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        format!("tojson got multiple values for argument {name:?}"),
                    ));
                }
                slots[i] = Some(kw.get::<Value>(name)?);
            }
        }
        kw.assert_all_used()?;
    }
    let [ensure_ascii, indent, separators, sort_keys] = slots;
    let mut opts = DumpOptions {
        ensure_ascii: ensure_ascii.is_some_and(|v| v.is_true()),
        sort_keys: sort_keys.is_some_and(|v| v.is_true()),
        ..DumpOptions::default()
    };
    if let Some(ind) = indent.filter(|v| !v.is_none() && !v.is_undefined()) {
        opts.indent = Some(if let Some(s) = ind.as_str() {
            s.to_string()
        } else if let Some(n) = ind.as_i64() {
            // Python: ' ' * n, which is empty for n <= 0.
            " ".repeat(n.max(0) as usize)
        } else {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!(
                    "tojson indent must be an integer or a string, got {}",
                    ind.kind()
                ),
            ));
        });
    }
    if let Some(sep) = separators.filter(|v| !v.is_none() && !v.is_undefined()) {
        let parts: Vec<Value> = sep.try_iter()?.collect();
        match parts.as_slice() {
            [a, b] if a.as_str().is_some() && b.as_str().is_some() => {
                opts.separators = Some((a.to_string(), b.to_string()));
            }
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson separators must be a pair of strings (item, key)",
                ))
            }
        }
    }
    let mut out = String::new();
    dumps(&mut out, &value, &opts, 0)?;
    Ok(Value::from_safe_string(out))
}

/// `json.dumps(value, ...)` into `out`.
pub fn dumps(
    out: &mut String,
    value: &Value,
    opts: &DumpOptions,
    depth: usize,
) -> Result<(), Error> {
    let (item_sep, key_sep) = match (&opts.separators, &opts.indent) {
        (Some((i, k)), _) => (i.as_str(), k.as_str()),
        (None, Some(_)) => (",", ": "),
        (None, None) => (", ", ": "),
    };
    let newline = |out: &mut String, level: usize| {
        if let Some(ind) = &opts.indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(ind);
            }
        }
    };
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => push_number(out, value, true),
        ValueKind::String => {
            push_json_string(out, value.as_str().unwrap_or_default(), opts.ensure_ascii)
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                dumps(out, item, opts, depth + 1)?;
            }
            newline(out, depth);
            out.push(']');
        }
        ValueKind::Map => {
            let mut entries = Vec::new();
            for key in value.try_iter()? {
                let v = value.get_item(&key)?;
                entries.push((json_key(&key)?, v));
            }
            if opts.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            if entries.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, (k, v)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                push_json_string(out, k, opts.ensure_ascii);
                out.push_str(key_sep);
                dumps(out, v, opts, depth + 1)?;
            }
            newline(out, depth);
            out.push('}');
        }
        other => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: a value of kind {other} is not JSON serializable"),
            ))
        }
    }
    Ok(())
}

/// Python's `json.dumps` turns scalar keys into strings; other keys are a TypeError.
fn json_key(key: &Value) -> Result<String, Error> {
    Ok(match key.kind() {
        ValueKind::String => key.as_str().unwrap_or_default().to_string(),
        ValueKind::None => "null".into(),
        ValueKind::Bool => (if key.is_true() { "true" } else { "false" }).into(),
        ValueKind::Number => {
            let mut s = String::new();
            push_number(&mut s, key, true);
            s
        }
        other => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: keys must be str, int, float, bool or None, not {other}"),
            ))
        }
    })
}

/// An integer as is; a float as Python's `repr` (`json` spells non-finite values
/// `NaN`/`Infinity`, `repr` spells them `nan`/`inf`).
fn push_number(out: &mut String, value: &Value, json: bool) {
    if value.is_integer() {
        let _ = write!(out, "{value}");
        return;
    }
    let f = f64::try_from(value.clone()).unwrap_or(f64::NAN);
    if f.is_nan() {
        out.push_str(if json { "NaN" } else { "nan" });
    } else if f.is_infinite() {
        let sign = if f < 0.0 { "-" } else { "" };
        let _ = write!(out, "{sign}{}", if json { "Infinity" } else { "inf" });
    } else {
        out.push_str(&float_repr(f));
    }
}

/// Python's `repr(float)`: the shortest round-trip digits, positional notation when the
/// decimal exponent is in [-4, 16), else `d.ddde+XX`; integral values keep a `.0`.
pub fn float_repr(f: f64) -> String {
    // `{:e}` gives the shortest round-trip digits as `-d.ddde-7`.
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let n = digits.len() as i32;
    if (-4..16).contains(&exp) {
        let point = exp + 1; // digits before the decimal point
        if point <= 0 {
            format!("{sign}0.{}{digits}", "0".repeat((-point) as usize))
        } else if point >= n {
            format!("{sign}{digits}{}.0", "0".repeat((point - n) as usize))
        } else {
            let (a, b) = digits.split_at(point as usize);
            format!("{sign}{a}.{b}")
        }
    } else {
        let (first, rest) = digits.split_at(1);
        let frac = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{first}{frac}e{esign}{:02}", exp.abs())
    }
}

/// A JSON string literal as Python's encoder writes it.
fn push_json_string(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if ensure_ascii && (c as u32) > 0x7e => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{u:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// What Jinja2 prints for `{{ value }}`: Python's `str()`. Strings print raw, `None`
/// prints `None`, booleans `True`/`False`, containers their `repr`. Returns `None` for kinds
/// with no Python analogue (the caller falls back to minijinja's own formatting).
pub fn py_str(value: &Value) -> Option<String> {
    match value.kind() {
        ValueKind::String => Some(value.as_str().unwrap_or_default().to_string()),
        ValueKind::Undefined => Some(String::new()),
        _ => py_repr(value),
    }
}

/// Python's `repr()` of a template value.
fn py_repr(value: &Value) -> Option<String> {
    let mut out = String::new();
    match value.kind() {
        ValueKind::Undefined => out.push_str("Undefined"),
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number => push_number(&mut out, value, false),
        ValueKind::String => push_str_repr(&mut out, value.as_str().unwrap_or_default()),
        ValueKind::Seq => {
            out.push('[');
            for (i, item) in value.try_iter().ok()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                out.push_str(&py_repr(&item)?);
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            for (i, key) in value.try_iter().ok()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                let v = value.get_item(&key).ok()?;
                let _ = write!(out, "{}: {}", py_repr(&key)?, py_repr(&v)?);
            }
            out.push('}');
        }
        _ => return None,
    }
    Some(out)
}

/// Python's `repr(str)`: single quotes unless the text has `'` and no `"`.
fn push_str_repr(out: &mut String, s: &str) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if !py_printable(c) => {
                let u = c as u32;
                let _ = match u {
                    0..=0xff => write!(out, "\\x{u:02x}"),
                    0x100..=0xffff => write!(out, "\\u{u:04x}"),
                    _ => write!(out, "\\U{u:08x}"),
                };
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// Python's `str.isprintable()` for the characters chat text meets: controls (Cc), separators
/// other than the space (Zs, Zl, Zp) and the common format characters (Cf) are escaped by
/// `repr` (the list is CPython 3.11's non-printable assigned code points). Unassigned and
/// private-use code points, also escaped by Python, are not tracked.
fn py_printable(c: char) -> bool {
    !matches!(c as u32,
        0x00..=0x1f | 0x7f..=0xa0 | 0xad | 0x600..=0x605 | 0x61c | 0x6dd | 0x70f | 0x890..=0x891 | 0x8e2 | 0x1680
        | 0x180e | 0x2000..=0x200f | 0x2028..=0x202f | 0x205f..=0x2064 | 0x2066..=0x206f
        | 0x3000 | 0xfeff | 0xfff9..=0xfffb | 0x110bd | 0x110cd | 0x13430..=0x13438 | 0x1bca0..=0x1bca3 | 0x1d173..=0x1d17a
        | 0xe0001 | 0xe0020..=0xe007f)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Expected strings are CPython 3.11 `repr()` outputs.
    #[test]
    fn float_repr_matches_python() {
        let cases = [
            (1.0, "1.0"),
            (0.5, "0.5"),
            (-0.0, "-0.0"),
            (0.1, "0.1"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (123456789.125, "123456789.125"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (2.5e300, "2.5e+300"),
            (1.2345678901234568e17, "1.2345678901234568e+17"),
        ];
        for (f, want) in cases {
            assert_eq!(float_repr(f), want, "{f:e}");
        }
    }

    /// Expected strings are CPython `json.dumps` outputs for the same data.
    #[test]
    fn dumps_matches_python() {
        let v: Value =
            serde_json::from_str(r#"{"b": [1, 2.0, "é\n<>&'"], "a": {}, "c": []}"#).unwrap();
        let mut s = String::new();
        dumps(&mut s, &v, &DumpOptions::default(), 0).unwrap();
        assert_eq!(s, r#"{"b": [1, 2.0, "é\n<>&'"], "a": {}, "c": []}"#);
        let opts = DumpOptions {
            indent: Some("  ".into()),
            ensure_ascii: true,
            ..Default::default()
        };
        let mut s = String::new();
        dumps(&mut s, &v, &opts, 0).unwrap();
        assert_eq!(s, "{\n  \"b\": [\n    1,\n    2.0,\n    \"\\u00e9\\n<>&'\"\n  ],\n  \"a\": {},\n  \"c\": []\n}");
        let opts = DumpOptions {
            sort_keys: true,
            ..Default::default()
        };
        let mut s = String::new();
        dumps(&mut s, &v, &opts, 0).unwrap();
        assert!(s.starts_with(r#"{"a": {}, "b""#), "{s}");
    }

    #[test]
    fn str_repr_matches_python() {
        let v: Value =
            serde_json::from_str(r#"[null, true, "it's", "a\"b'c", 3, 1.5, {"k": false}]"#)
                .unwrap();
        assert_eq!(
            py_str(&v).unwrap(),
            r#"[None, True, "it's", 'a"b\'c', 3, 1.5, {'k': False}]"#
        );
    }
}
