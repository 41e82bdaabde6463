//! Tool calls in model output, in the Qwen (Hermes) style:
//!
//! ```text
//! Let me look that up.
//! <tool_call>
//! {"name": "get_weather", "arguments": {"city": "Paris"}}
//! </tool_call>
//! ```
//!
//! A reply may hold several blocks and text around them. [`parse_tool_calls`] splits a
//! whole reply; [`ToolStream`] does the same incrementally for streamed replies. They are
//! written independently and share only the parse of one block's JSON, so the tests can
//! hold each one to the other.
//!
//! Models also write a call as bare JSON, without the tags (qwen2.5-coder does at
//! temperature 0): a reply that is, whole, one or more `{"name": ..., "arguments": ...}`
//! objects (or an array of them, or either in a ```json fence), each naming one of the
//! request's tools and holding no other key (`parameters` is taken for `arguments`, as
//! Llama 3 writes it). [`parse_reply`] and [`ToolStream::with_bare_json`] read those as
//! calls too; anything else is content, so a JSON reply that is not a call stays one.

use serde_json::Value;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";
/// How much of the offending text an error message quotes.
const SNIPPET_CHARS: usize = 200;

/// One tool call the model asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedCall {
    pub name: String,
    /// The arguments object as compact JSON text (what OpenAI's `function.arguments` holds).
    pub arguments: String,
}

/// What a [`ToolStream`] releases: content text that is final, or a whole call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolDelta {
    Content(String),
    Call(ParsedCall),
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ToolParseError {
    #[error("tool call is not valid JSON ({reason}): {snippet}")]
    BadJson { reason: String, snippet: String },
    #[error("tool call JSON is not an object: {snippet}")]
    NotAnObject { snippet: String },
    #[error("tool call has no \"name\" string: {snippet}")]
    MissingName { snippet: String },
    #[error(
        "tool call {name:?}: \"arguments\" is neither an object nor a string holding one: {snippet}"
    )]
    BadArguments { name: String, snippet: String },
    #[error("tool call block is not closed and its JSON is incomplete: {snippet}")]
    Unclosed { snippet: String },
}

/// At most [`SNIPPET_CHARS`] characters of `text`, marked when cut.
fn snippet(text: &str) -> String {
    match text.char_indices().nth(SNIPPET_CHARS) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}

/// Parses the text between `<tool_call>` and `</tool_call>`.
fn parse_block(inner: &str) -> Result<ParsedCall, ToolParseError> {
    let json = inner.trim();
    let value: Value = serde_json::from_str(json).map_err(|err| ToolParseError::BadJson {
        reason: err.to_string(),
        snippet: snippet(json),
    })?;
    call_from_value(value, json)
}

/// Parses a block the reply ended inside of. Models often stop at EOS right after the
/// JSON, or partway through the closing tag, so a complete call is still accepted; only
/// JSON that is itself incomplete (or not JSON) makes this an error.
fn parse_unclosed(inner: &str) -> Result<ParsedCall, ToolParseError> {
    let mut json = inner.trim_end();
    let partial_close = partial_tag_len(json, CLOSE);
    json = json[..json.len() - partial_close].trim();
    match serde_json::from_str::<Value>(json) {
        Ok(value) => call_from_value(value, json),
        Err(_) => Err(ToolParseError::Unclosed {
            snippet: snippet(inner.trim()),
        }),
    }
}

fn call_from_value(value: Value, json: &str) -> Result<ParsedCall, ToolParseError> {
    let Value::Object(mut fields) = value else {
        return Err(ToolParseError::NotAnObject {
            snippet: snippet(json),
        });
    };
    let name = match fields.remove("name") {
        Some(Value::String(name)) if !name.trim().is_empty() => name,
        _ => {
            return Err(ToolParseError::MissingName {
                snippet: snippet(json),
            })
        }
    };
    let bad_arguments = |name: &str| ToolParseError::BadArguments {
        name: name.to_string(),
        snippet: snippet(json),
    };
    let arguments = match fields.remove("arguments") {
        // A function without parameters: models write nothing, null or "".
        None | Some(Value::Null) => "{}".to_string(),
        Some(Value::String(text)) if text.trim().is_empty() => "{}".to_string(),
        Some(object @ Value::Object(_)) => compact(&object),
        // Some models double-encode the arguments, as OpenAI's own wire format does.
        Some(Value::String(text)) => match serde_json::from_str::<Value>(&text) {
            Ok(object @ Value::Object(_)) => compact(&object),
            _ => return Err(bad_arguments(&name)),
        },
        Some(_) => return Err(bad_arguments(&name)),
    };
    Ok(ParsedCall { name, arguments })
}

fn compact(value: &Value) -> String {
    // serde_json's `preserve_order` feature (enabled in Cargo.toml) keeps the model's key
    // order, so the arguments read as the model wrote them.
    serde_json::to_string(value).expect("a serde_json::Value always serializes")
}

/// Length of the longest proper prefix of `tag` that `text` ends with (0 if none).
fn partial_tag_len(text: &str, tag: &str) -> usize {
    (1..tag.len())
        .rev()
        .find(|&len| text.ends_with(&tag[..len]))
        .unwrap_or(0)
}

/// Splits a whole reply into its content (the text outside the blocks, trimmed; `None`
/// when only whitespace) and its calls, in order. The first bad block is an error.
pub fn parse_tool_calls(text: &str) -> Result<(Option<String>, Vec<ParsedCall>), ToolParseError> {
    let mut content = String::new();
    let mut calls = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(OPEN) {
        content.push_str(&rest[..start]);
        let body = &rest[start + OPEN.len()..];
        match body.find(CLOSE) {
            Some(end) => {
                calls.push(parse_block(&body[..end])?);
                rest = &body[end + CLOSE.len()..];
            }
            None => {
                calls.push(parse_unclosed(body)?);
                rest = "";
            }
        }
    }
    content.push_str(rest);
    let content = content.trim();
    Ok(((!content.is_empty()).then(|| content.to_string()), calls))
}

/// A whole reply with the request's tool names: bare JSON calls (module docs) when the
/// reply is nothing else, else what [`parse_tool_calls`] finds.
pub fn parse_reply(
    text: &str,
    tool_names: &[String],
) -> Result<(Option<String>, Vec<ParsedCall>), ToolParseError> {
    match bare_calls(text, tool_names) {
        Some(calls) => Ok((None, calls)),
        None => parse_tool_calls(text),
    }
}

/// Whether a reply starting with `text` (leading whitespace dropped) could be bare JSON
/// calls: Some(true) yes, Some(false) no, None not known yet (a part of a fence's ```).
fn may_be_bare(text: &str) -> Option<bool> {
    let t = text.trim_start();
    if t.starts_with('{') || t.starts_with('[') || t.starts_with(FENCE) {
        Some(true)
    } else if t.is_empty() || FENCE.starts_with(t) {
        None
    } else {
        Some(false)
    }
}

const FENCE: &str = "```";

/// The calls of a reply that is only bare JSON calls (module docs), else None.
fn bare_calls(text: &str, tool_names: &[String]) -> Option<Vec<ParsedCall>> {
    if tool_names.is_empty() {
        return None;
    }
    let mut body = text.trim();
    if let Some(rest) = body.strip_prefix(FENCE) {
        let rest = rest.strip_suffix(FENCE)?;
        // The fence's language word, if any, ends at the first newline.
        let (lang, inner) = rest.split_once('\n')?;
        if !matches!(lang.trim(), "" | "json") {
            return None;
        }
        body = inner.trim();
    }
    let mut values = Vec::new();
    for v in serde_json::Deserializer::from_str(body).into_iter::<Value>() {
        match v.ok()? {
            Value::Array(items) => values.extend(items),
            other => values.push(other),
        }
    }
    if values.is_empty() {
        return None;
    }
    values
        .into_iter()
        .map(|v| {
            let Value::Object(mut fields) = v else {
                return None;
            };
            if !fields.contains_key("arguments") {
                if let Some(p) = fields.remove("parameters") {
                    fields.insert("arguments".into(), p);
                }
            }
            let named = fields
                .get("name")
                .and_then(Value::as_str)
                .is_some_and(|n| tool_names.iter().any(|t| t == n));
            if !named || fields.keys().any(|k| k != "name" && k != "arguments") {
                return None;
            }
            call_from_value(Value::Object(fields), body).ok()
        })
        .collect()
}

/// Incremental tool-call parser for a streamed reply.
///
/// Feed each decoded piece to [`push`](Self::push); call [`finish`](Self::finish) at the
/// end. Content is released as soon as it is final: text that might still become
/// `<tool_call>` is held back, so the tag never leaks into content. The released content,
/// concatenated, equals what [`parse_tool_calls`] reports for the whole reply, so leading
/// and trailing whitespace is dropped too: whitespace is held until more content follows
/// it (possibly after a call). Each call is released when its closing tag arrives.
///
/// When `push` or `finish` returns an error, the bad block is discarded and the deltas
/// completed before it in the same call are kept and returned by the next call.
#[derive(Debug, Default)]
pub struct ToolStream {
    /// Text not yet released: in content, a tail that may be the start of `<tool_call>`;
    /// inside a block, the block's text so far.
    pending: String,
    in_block: bool,
    /// Inside a block, where in `pending` the search for `</tool_call>` resumes; earlier
    /// bytes were already searched and cannot start the tag.
    close_scan: usize,
    /// Whitespace after the last released content, released only if more content follows.
    held_space: String,
    /// Whether any non-whitespace content has been released; before that, whitespace is
    /// leading and dropped.
    released_any: bool,
    saw_call: bool,
    /// Deltas completed before an error, for the next call to return.
    carried: Vec<ToolDelta>,
    /// The request's tool names when bare JSON calls are read ([`Self::with_bare_json`]).
    bare_names: Vec<String>,
    bare: Bare,
}

/// Where a stream stands on bare JSON calls.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Bare {
    /// Nothing but whitespace (or part of a fence) seen yet.
    Undecided,
    /// The reply began like JSON: everything is held until the end decides.
    Holding,
    /// The reply is not bare JSON (or bare JSON is not read).
    #[default]
    Off,
}

impl ToolStream {
    pub fn new() -> Self {
        Self::default()
    }

    /// Also reads bare JSON calls to these tools (module docs), as [`parse_reply`] does. A
    /// reply that begins like JSON is then held whole until [`finish`](Self::finish): only
    /// the end says whether it was a call.
    pub fn with_bare_json(tool_names: Vec<String>) -> Self {
        Self {
            bare: if tool_names.is_empty() {
                Bare::Off
            } else {
                Bare::Undecided
            },
            bare_names: tool_names,
            ..Self::default()
        }
    }

    /// Whether any call has been released so far (the reply's finish reason is then
    /// `tool_calls`).
    pub fn saw_call(&self) -> bool {
        self.saw_call
    }

    pub fn push(&mut self, piece: &str) -> Result<Vec<ToolDelta>, ToolParseError> {
        self.pending.push_str(piece);
        let mut out = std::mem::take(&mut self.carried);
        if self.bare == Bare::Undecided {
            self.bare = match may_be_bare(&self.pending) {
                Some(true) => Bare::Holding,
                Some(false) => Bare::Off,
                None => Bare::Undecided,
            };
        }
        if self.bare != Bare::Off {
            return Ok(out);
        }
        match self.advance(&mut out) {
            Ok(()) => Ok(out),
            Err(err) => {
                self.carried = out;
                Err(err)
            }
        }
    }

    /// Ends the reply: held-back text is content after all (trailing whitespace is
    /// dropped), and a block left open counts as a call if its JSON is complete. The
    /// stream is then ready for a new reply; `saw_call` keeps its value.
    pub fn finish(&mut self) -> Result<Vec<ToolDelta>, ToolParseError> {
        let mut out = std::mem::take(&mut self.carried);
        let held = std::mem::replace(
            &mut self.bare,
            if self.bare_names.is_empty() {
                Bare::Off
            } else {
                Bare::Undecided
            },
        );
        if held != Bare::Off {
            if let Some(calls) = bare_calls(&self.pending, &self.bare_names) {
                self.pending.clear();
                for call in calls {
                    self.release_call(call, &mut out);
                }
                return Ok(out);
            }
            // Not calls after all: the held text is read as any other reply.
            if let Err(err) = self.advance(&mut out) {
                self.reset();
                self.carried = out;
                return Err(err);
            }
        }
        let pending = std::mem::take(&mut self.pending);
        let result = if self.in_block {
            parse_unclosed(&pending).map(|call| self.release_call(call, &mut out))
        } else {
            self.release_content(&pending, &mut out);
            Ok(())
        };
        self.reset();
        match result {
            Ok(()) => Ok(out),
            Err(err) => {
                self.carried = out;
                Err(err)
            }
        }
    }

    /// Ready for a new reply (`saw_call` and the bare-JSON setting are kept).
    fn reset(&mut self) {
        self.pending.clear();
        self.in_block = false;
        self.close_scan = 0;
        self.held_space.clear();
        self.released_any = false;
    }

    /// Consumes as much of `pending` as is decided.
    fn advance(&mut self, out: &mut Vec<ToolDelta>) -> Result<(), ToolParseError> {
        loop {
            if self.in_block {
                let Some(found) = self.pending[self.close_scan..].find(CLOSE) else {
                    let mut resume = self.pending.len().saturating_sub(CLOSE.len() - 1);
                    while !self.pending.is_char_boundary(resume) {
                        resume -= 1;
                    }
                    self.close_scan = resume;
                    return Ok(());
                };
                let end = self.close_scan + found;
                let call = parse_block(&self.pending[..end]);
                self.pending.drain(..end + CLOSE.len());
                self.in_block = false;
                self.close_scan = 0;
                self.release_call(call?, out);
            } else if let Some(start) = self.pending.find(OPEN) {
                let before: String = self.pending.drain(..start + OPEN.len()).collect();
                self.release_content(&before[..start], out);
                self.in_block = true;
                self.close_scan = 0;
            } else {
                let cut = self.pending.len() - partial_tag_len(&self.pending, OPEN);
                let text: String = self.pending.drain(..cut).collect();
                self.release_content(&text, out);
                return Ok(());
            }
        }
    }

    fn release_call(&mut self, call: ParsedCall, out: &mut Vec<ToolDelta>) {
        self.saw_call = true;
        out.push(ToolDelta::Call(call));
    }

    /// Releases content text, holding back its trailing whitespace.
    fn release_content(&mut self, text: &str, out: &mut Vec<ToolDelta>) {
        let body_end = text.trim_end().len();
        if body_end == 0 {
            if self.released_any {
                self.held_space.push_str(text);
            }
            return;
        }
        let body = &text[..body_end];
        let mut piece = std::mem::take(&mut self.held_space);
        piece.push_str(if self.released_any {
            body
        } else {
            body.trim_start()
        });
        self.held_space.push_str(&text[body_end..]);
        self.released_any = true;
        // Pieces released in one call merge, so a caller sends one content chunk per push.
        match out.last_mut() {
            Some(ToolDelta::Content(last)) => last.push_str(&piece),
            _ => out.push(ToolDelta::Content(piece)),
        }
    }
}

/// A tool call id as OpenAI formats them: `call_` and 24 alphanumeric characters.
pub fn new_call_id() -> String {
    random_id("call_")
}

const ID_ALPHABET: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// One splitmix64 step: a bijection of u64 that scrambles its input thoroughly.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(GOLDEN_GAMMA);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn clock_nanos() -> u64 {
    // Only entropy, so a clock before the epoch is as good as any other value.
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_nanos() as u64)
}

fn push_base62(out: &mut String, mut value: u64, digits: usize) {
    for _ in 0..digits {
        out.push(ID_ALPHABET[(value % 62) as usize] as char);
        value /= 62;
    }
}

/// `prefix` followed by 24 random-looking alphanumeric characters (e.g. `chatcmpl-…`).
///
/// The first 11 characters encode, in full, a bijective scramble of a process-wide
/// counter under a per-process seed, so ids never repeat within a process; the other 13
/// mix in the clock at the time of the call so ids from different processes differ too.
pub fn random_id(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    static SEED: OnceLock<u64> = OnceLock::new();
    let seed = *SEED.get_or_init(|| splitmix64(clock_nanos() ^ u64::from(std::process::id())));
    let n = COUNTER.fetch_add(1, Relaxed);
    let head = splitmix64(seed.wrapping_add(n.wrapping_mul(GOLDEN_GAMMA)));
    let tail = splitmix64(head ^ clock_nanos());
    let mut id = String::with_capacity(prefix.len() + 24);
    id.push_str(prefix);
    // 62^11 > 2^64, so 11 digits hold `head` without loss.
    push_base62(&mut id, head, 11);
    push_base62(&mut id, tail, 11);
    push_base62(&mut id, splitmix64(tail), 2);
    id
}

#[cfg(test)]
#[path = "tools_tests.rs"]
mod tests;
