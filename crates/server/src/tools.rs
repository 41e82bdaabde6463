//! Tool calls in model output (placeholder until the streaming parser lands).
#![allow(dead_code)]

#[derive(Clone, Debug, PartialEq)]
pub struct ParsedCall {
    pub name: String,
    pub arguments: String,
}
#[derive(Debug, thiserror::Error)]
pub enum ToolParseError {
    #[error("bad tool call: {0}")]
    Bad(String),
}
pub enum ToolDelta {
    Content(String),
    Call(ParsedCall),
}
#[derive(Default)]
pub struct ToolStream {
    text: String,
}
impl ToolStream {
    pub fn new() -> Self {
        ToolStream::default()
    }
    pub fn push(&mut self, piece: &str) -> Result<Vec<ToolDelta>, ToolParseError> {
        self.text.push_str(piece);
        Ok(Vec::new())
    }
    pub fn finish(&mut self) -> Result<Vec<ToolDelta>, ToolParseError> {
        let (c, calls) = parse_tool_calls(&self.text)?;
        let mut v: Vec<ToolDelta> = c.into_iter().map(ToolDelta::Content).collect();
        v.extend(calls.into_iter().map(ToolDelta::Call));
        Ok(v)
    }
    pub fn saw_call(&self) -> bool {
        self.text.contains("<tool_call>")
    }
}
pub fn parse_tool_calls(text: &str) -> Result<(Option<String>, Vec<ParsedCall>), ToolParseError> {
    let mut calls = Vec::new();
    let mut content = String::new();
    let mut rest = text;
    while let Some(i) = rest.find("<tool_call>") {
        content.push_str(&rest[..i]);
        let after = &rest[i + 11..];
        let (body, next) = match after.find("</tool_call>") {
            Some(j) => (&after[..j], &after[j + 12..]),
            None => (after, ""),
        };
        let v: serde_json::Value =
            serde_json::from_str(body.trim()).map_err(|e| ToolParseError::Bad(e.to_string()))?;
        let name = v["name"]
            .as_str()
            .ok_or_else(|| ToolParseError::Bad("no name".into()))?;
        let arguments = match &v["arguments"] {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Null => "{}".into(),
            a => a.to_string(),
        };
        calls.push(ParsedCall {
            name: name.into(),
            arguments,
        });
        rest = next;
    }
    content.push_str(rest);
    let c = content.trim();
    Ok(((!c.is_empty()).then(|| c.to_string()), calls))
}
pub fn random_id(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(1);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos() as u64;
    format!(
        "{prefix}{:016x}{:08x}",
        t,
        N.fetch_add(1, Ordering::Relaxed)
    )
}
pub fn new_call_id() -> String {
    random_id("call_")
}
