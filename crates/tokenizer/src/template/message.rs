//! OpenAI-style chat messages as templates see them. Fields that a template may read but minfer
//! does not interpret are kept in `extra` and passed through unchanged.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value as Json};

/// One chat message: `role`, `content` (text or null), and for tool use `tool_calls`,
/// `tool_call_id` and `name`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    /// Text, or `None` (JSON null; an assistant turn that only calls tools). A missing
    /// `content` reads as null.
    #[serde(default)]
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Any other field (e.g. `reasoning_content`), in the order given.
    #[serde(flatten)]
    pub extra: Map<String, Json>,
}

impl Message {
    /// A plain text message.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Message {
        Message {
            role: role.into(),
            content: Some(content.into()),
            tool_calls: None,
            tool_call_id: None,
            name: None,
            extra: Map::new(),
        }
    }
    pub fn system(content: impl Into<String>) -> Message {
        Message::new("system", content)
    }
    pub fn user(content: impl Into<String>) -> Message {
        Message::new("user", content)
    }
    pub fn assistant(content: impl Into<String>) -> Message {
        Message::new("assistant", content)
    }
}

/// One call in an assistant message's `tool_calls`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `"function"` in OpenAI's format.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    pub function: FunctionCall,
    #[serde(flatten)]
    pub extra: Map<String, Json>,
}

/// The function a tool call names. HF templates expect `arguments` as a JSON object (they
/// print it with `tojson`); OpenAI clients send a JSON-encoded string. Either is passed on as
/// given.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    pub arguments: Json,
    #[serde(flatten)]
    pub extra: Map<String, Json>,
}
