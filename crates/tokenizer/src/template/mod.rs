//! Chat templates: the GGUF's `tokenizer.chat_template` (Jinja) rendered with minijinja the way
//! HF transformers renders it, so the prompt text is byte-identical to HF's.
//!
//! HF compatibility, beyond minijinja's defaults:
//! - `trim_blocks` and `lstrip_blocks` on (HF's environment sets both), one trailing newline of
//!   the source dropped (Jinja2's `keep_trailing_newline=False`);
//! - Python string/dict/list methods (`.strip()`, `.items()`, ...) via minijinja-contrib's
//!   pycompat; `{% break %}`/`{% continue %}` (HF loads `loopcontrols`);
//! - `tojson` is Python's `json.dumps` with HF's defaults ([`pyjson`]);
//! - `{{ value }}` prints what Python's `str()` prints (`None`, `True`, `['a']`);
//! - globals `raise_exception(msg)` and `strftime_now(fmt)`; variables `messages`, `tools`,
//!   `documents` (None when not given, as HF passes them), `add_generation_prompt`,
//!   `bos_token`/`eos_token` (vocabulary text of the GGUF's ids), plus caller extras.
//!
//! A model without a template gets ChatML, and the loader returns a notice saying so.

pub mod blocks;
pub mod deadline;
pub mod error;
pub mod message;
pub mod pyjson;
pub mod strftime;

pub use deadline::RENDER_DEADLINE;
pub use error::{Error, Result, SourceLine};
pub use message::{FunctionCall, Message, ToolCall};

use minfer_gguf::{Metadata, Value as GgufValue};
use minijinja::{Environment, ErrorKind, State, Value};
use serde_json::{Map, Value as Json};
use std::collections::BTreeMap;
use strftime::CivilTime;

pub const KEY_CHAT_TEMPLATE: &str = "tokenizer.chat_template";
pub const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
pub const KEY_BOS_ID: &str = "tokenizer.ggml.bos_token_id";
pub const KEY_EOS_ID: &str = "tokenizer.ggml.eos_token_id";

/// ChatML, what llama.cpp applies to models without a template.
pub const CHATML_TEMPLATE: &str = "{%- for message in messages %}\
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}\
{%- endfor %}\
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

const NAME: &str = "chat_template";

/// Special-token texts the template may print.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
}

impl SpecialTokens {
    /// The vocabulary texts of the GGUF's BOS/EOS ids; absent ids stay `None` (the template
    /// then sees them undefined).
    pub fn from_metadata(md: &Metadata) -> Result<SpecialTokens> {
        let tokens = match md.get_array(KEY_TOKENS) {
            Some(minfer_gguf::Array::String(t)) => Some(t),
            _ => None,
        };
        let lookup = |key: &str| -> Result<Option<String>> {
            let (Some(id), Some(tokens)) = (md.get_u64(key), tokens) else {
                return Ok(None);
            };
            match tokens.get(id as usize) {
                Some(t) => Ok(Some(t.to_string())),
                None => Err(Error::BadTokenId {
                    key: key.into(),
                    id,
                    n_vocab: tokens.len(),
                }),
            }
        };
        Ok(SpecialTokens {
            bos_token: lookup(KEY_BOS_ID)?,
            eos_token: lookup(KEY_EOS_ID)?,
        })
    }
}

/// What a render call passes besides the messages.
#[derive(Clone, Debug, Default)]
pub struct RenderOptions {
    /// End with the header that opens the assistant's turn.
    pub add_generation_prompt: bool,
    /// Tool schemas (a JSON list of OpenAI-style function definitions), or None.
    pub tools: Option<Json>,
    /// Retrieval documents (a JSON list), or None.
    pub documents: Option<Json>,
    /// More template variables (e.g. `enable_thinking`); they override `bos_token`/`eos_token`
    /// as HF's kwargs do.
    pub extra: Map<String, Json>,
    /// The time `strftime_now` formats, as Unix seconds; None reads the clock.
    pub now_unix: Option<i64>,
}

/// The text a new turn adds to a conversation already in the context.
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub enum Delta {
    /// Append this text: the old rendering is a prefix of the new one.
    Append(String),
    /// The template rewrote earlier text (e.g. it drops old reasoning), so no suffix
    /// continues the old rendering; the caller must re-render and re-process the prompt.
    /// `common_prefix` is how many bytes the two renderings share.
    NotAppendOnly { common_prefix: usize },
}

/// A loaded template and, when it is the ChatML fallback, a one-line notice for the user.
#[derive(Debug)]
pub struct Loaded {
    pub template: ChatTemplate,
    pub notice: Option<String>,
}

/// A compiled chat template.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    special: SpecialTokens,
}

/// The error `raise_exception` raises, found again in the error chain.
#[derive(Debug)]
struct Raised(String);

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

fn raise_exception(message: Value) -> Result<Value, minijinja::Error> {
    let text = pyjson::py_str(&message).unwrap_or_else(|| message.to_string());
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, text.clone()).with_source(Raised(text)))
}

fn strftime_value(now: Option<i64>) -> Value {
    Value::from_function(move |fmt: &str| -> Result<String, minijinja::Error> {
        let t = match now {
            Some(secs) => CivilTime::from_unix(secs, 0),
            None => CivilTime::now(),
        };
        t.format(fmt)
            .map_err(|e| minijinja::Error::new(ErrorKind::InvalidOperation, e))
    })
}

/// The most minijinja instructions one render may run. A template comes from a model file,
/// untrusted input: two nested `range(100000)` loops would otherwise run for hours (a
/// model load trial-renders its template, so the load would hang). Every template of the
/// test corpus renders its conversations (tools included) within 2·10⁴ (tried: the
/// chat_templates tests pass at that fuel); the cost grows with the conversation, and 10⁷
/// leaves room for tens of thousands of messages while a runaway loop stops in ~0.2 s.
pub const RENDER_FUEL: u64 = 10_000_000;

/// The most bytes a rendered prompt may have: far beyond any context (a 128k-token prompt
/// is well under 1 MB of text), and what a hostile template's output may cost in memory
/// (minijinja caps one string at 100 MB, not a render that writes many).
pub const RENDER_OUTPUT_LIMIT: usize = 64 << 20;

/// The render's output, refused past [`RENDER_OUTPUT_LIMIT`]: a write error stops minijinja.
struct CappedOutput {
    bytes: Vec<u8>,
    over: bool,
}

impl std::io::Write for CappedOutput {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len() + buf.len() > RENDER_OUTPUT_LIMIT {
            self.over = true;
            return Err(std::io::Error::other("the rendered prompt is too long"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The Jinja2-compatible environment HF renders with (see the module docs).
fn environment(trim_blocks: bool, lstrip_blocks: bool) -> Environment<'static> {
    let mut env = Environment::new();
    env.set_fuel(Some(RENDER_FUEL));
    env.set_trim_blocks(trim_blocks);
    env.set_lstrip_blocks(lstrip_blocks);
    env.set_keep_trailing_newline(false);
    // The deadline checks ride on the callbacks ([`deadline`]).
    env.set_unknown_method_callback(|state, value, method, args| {
        deadline::check()?;
        minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
    });
    env.set_formatter(|out, state: &State, value| {
        deadline::check()?;
        match pyjson::py_str(value) {
            Some(s) => Ok(std::fmt::Write::write_str(out, &s)?),
            None => minijinja::escape_formatter(out, state, value),
        }
    });
    env.add_filter(
        "tojson",
        |value: Value, args: minijinja::value::Rest<Value>| {
            deadline::check()?;
            pyjson::tojson_filter(value, args)
        },
    );
    env.add_function("range", deadline::range);
    env.add_function("raise_exception", raise_exception);
    env.add_global("strftime_now", strftime_value(None));
    env
}

/// A typed error from a minijinja one: the line and its source text, the construct named by
/// minijinja's message, and the template's own message for `raise_exception`.
fn convert(e: &minijinja::Error, source: &str, parse: bool) -> Error {
    let mut line = None;
    let mut details = Vec::new();
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    let mut raised = None;
    while let Some(err) = cur {
        if let Some(r) = err.downcast_ref::<Raised>() {
            raised = Some(r.0.clone());
        } else if let Some(m) = err.downcast_ref::<minijinja::Error>() {
            line = line.or(m.line());
            let d = match m.detail() {
                Some(d) => format!("{}: {d}", m.kind()),
                None => m.kind().to_string(),
            };
            if !details.contains(&d) {
                details.push(d);
            }
        } else {
            details.push(err.to_string());
        }
        cur = err.source();
    }
    let at = line.and_then(|l| {
        source.lines().nth(l.checked_sub(1)?).map(|t| SourceLine {
            line: l,
            text: t.trim().to_string(),
        })
    });
    let mut detail = details.join(": ");
    if parse {
        // A closing tag that does not match or a missing one: name the block left open.
        let upto = e.range().map_or(source.len(), |r| r.start);
        let unclosed = detail.contains("end of input") || detail.contains("unknown statement end");
        if let (true, Some((word, l, tag))) = (unclosed, blocks::innermost_open(source, upto)) {
            detail.push_str(&format!(
                " (the `{word}` block opened at line {l} by `{tag}` is not closed)"
            ));
        }
    }
    match raised {
        Some(message) => Error::Raised { message, at },
        None if parse => Error::Parse { detail, at },
        None => Error::Render { detail, at },
    }
}

impl ChatTemplate {
    /// Compiles `source` and trial-renders it, so that a template that cannot render refuses
    /// the model load instead of failing a later request. minijinja finds unknown filters and
    /// methods only when it executes them, so the trials cover the common branches: one user
    /// message (must render), and a multi-turn conversation with a system message, tools and a
    /// tool call (a `raise_exception` there is the template refusing that conversation shape,
    /// which is allowed; any other error refuses the template).
    pub fn new(source: &str, special: SpecialTokens) -> Result<ChatTemplate> {
        let t = Self::compile_with(source, special, true, true)?;
        let opts = RenderOptions {
            add_generation_prompt: true,
            now_unix: Some(0),
            ..RenderOptions::default()
        };
        t.render(&[Message::user("Hello")], &opts)?;
        for (messages, tools) in trial_conversations() {
            let o = RenderOptions {
                tools,
                ..opts.clone()
            };
            match t.render(&messages, &o) {
                Ok(_) | Err(Error::Raised { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(t)
    }

    /// Compiles without the trial render, with explicit whitespace control (HF: both true;
    /// tests flip them as a control).
    pub fn compile_with(
        source: &str,
        special: SpecialTokens,
        trim_blocks: bool,
        lstrip_blocks: bool,
    ) -> Result<ChatTemplate> {
        let mut env = environment(trim_blocks, lstrip_blocks);
        env.add_template_owned(NAME, source.to_string())
            .map_err(|e| convert(&e, source, true))?;
        Ok(ChatTemplate {
            env,
            source: source.to_string(),
            special,
        })
    }

    /// The GGUF's template, or ChatML with a notice when it has none.
    pub fn from_metadata(md: &Metadata) -> Result<Loaded> {
        let special = SpecialTokens::from_metadata(md)?;
        match md.get(KEY_CHAT_TEMPLATE) {
            Some(GgufValue::String(s)) => Ok(Loaded {
                template: ChatTemplate::new(s, special)?,
                notice: None,
            }),
            Some(other) => Err(Error::NotAString {
                key: KEY_CHAT_TEMPLATE.into(),
                found: other.value_type().name(),
            }),
            None => Ok(Loaded {
                template: ChatTemplate::new(CHATML_TEMPLATE, special)?,
                notice: Some(format!(
                    "notice: the model has no {KEY_CHAT_TEMPLATE}; using ChatML (<|im_start|>role ... <|im_end|>)"
                )),
            }),
        }
    }

    pub fn source(&self) -> &str {
        &self.source
    }
    pub fn special_tokens(&self) -> &SpecialTokens {
        &self.special
    }

    /// The prompt text for `messages`.
    pub fn render(&self, messages: &[Message], opts: &RenderOptions) -> Result<String> {
        let json_or_none = |j: &Option<Json>| {
            j.as_ref()
                .map(Value::from_serialize)
                .unwrap_or(Value::from(()))
        };
        let mut ctx: BTreeMap<String, Value> = BTreeMap::new();
        if let Some(b) = &self.special.bos_token {
            ctx.insert("bos_token".into(), Value::from(b.as_str()));
        }
        if let Some(e) = &self.special.eos_token {
            ctx.insert("eos_token".into(), Value::from(e.as_str()));
        }
        for (k, v) in &opts.extra {
            ctx.insert(k.clone(), Value::from_serialize(v));
        }
        if let Some(now) = opts.now_unix {
            ctx.insert("strftime_now".into(), strftime_value(Some(now)));
        }
        let messages = messages
            .iter()
            .map(alias_reasoning)
            .collect::<Result<Vec<Json>>>()?;
        ctx.insert("messages".into(), Value::from_serialize(&messages));
        ctx.insert("tools".into(), json_or_none(&opts.tools));
        ctx.insert("documents".into(), json_or_none(&opts.documents));
        ctx.insert(
            "add_generation_prompt".into(),
            Value::from(opts.add_generation_prompt),
        );
        let tmpl = self
            .env
            .get_template(NAME)
            .map_err(|e| convert(&e, &self.source, false))?;
        let mut out = CappedOutput {
            bytes: Vec::new(),
            over: false,
        };
        // minijinja can panic on template input (2.24: `''[::-1]`, a reversed slice of an
        // empty string, indexes out of bounds; found by tests/template_fuzz.rs). A template
        // is untrusted input, so a panic is this render's error, never the process's. The
        // render's state is all local and dropped with its output: nothing is left torn.
        let armed = deadline::arm();
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            tmpl.render_captured_to(Value::from(ctx), &mut out)
                .map(|_| ())
        }));
        let r = match run {
            Ok(r) => r,
            Err(panic) => {
                let why = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                return Err(Error::Render {
                    detail: format!("the template engine failed on this template ({why})"),
                    at: None,
                });
            }
        };
        if armed.passed() {
            // Also when the render "succeeded": a `range` cut short by the deadline ended
            // its loop early, so the output is not the template's.
            return Err(Error::Render {
                detail: deadline::message(),
                at: None,
            });
        }
        drop(armed);
        if out.over {
            return Err(Error::Render {
                detail: format!(
                    "the rendered prompt passed {RENDER_OUTPUT_LIMIT} bytes (a template loop \
                     that does not end where it should)"
                ),
                at: None,
            });
        }
        r.map_err(|e| convert(&e, &self.source, false))?;
        // minijinja writes only `str` pieces, so the bytes are UTF-8; checked, not assumed.
        String::from_utf8(out.bytes).map_err(|e| Error::Render {
            detail: format!(
                "the rendered prompt is not UTF-8 at byte {}",
                e.utf8_error().valid_up_to()
            ),
            at: None,
        })
    }

    /// The text that `new` adds after `prev`, for a context that already holds `prev`
    /// rendered without a generation prompt (complete turns). It is the full rendering of
    /// `prev + new` (with `opts`) minus that old rendering; when the old rendering is not a
    /// prefix of the new one the template rewrites history and the result is
    /// [`Delta::NotAppendOnly`].
    pub fn render_delta(
        &self,
        prev: &[Message],
        new: &[Message],
        opts: &RenderOptions,
    ) -> Result<Delta> {
        let old = if prev.is_empty() {
            String::new()
        } else {
            let past = RenderOptions {
                add_generation_prompt: false,
                ..opts.clone()
            };
            self.render(prev, &past)?
        };
        let all: Vec<Message> = prev.iter().chain(new).cloned().collect();
        let full = self.render(&all, opts)?;
        Ok(match full.strip_prefix(old.as_str()) {
            Some(suffix) => Delta::Append(suffix.to_string()),
            None => Delta::NotAppendOnly {
                common_prefix: common_prefix_len(&old, &full),
            },
        })
    }
}

/// Conversations a template is tried on at load (besides one user message).
fn trial_conversations() -> Vec<(Vec<Message>, Option<Json>)> {
    let chat = vec![
        Message::system("You are helpful."),
        Message::user("Hello"),
        Message::assistant("Hi."),
        Message::user("Bye"),
    ];
    let tools = serde_json::json!([{"type": "function", "function": {
        "name": "get_time", "description": "Current time.",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}}}]);
    let mut call = Message::assistant("");
    call.tool_calls = Some(vec![ToolCall {
        id: Some("call_0".into()),
        kind: Some("function".into()),
        function: FunctionCall {
            name: "get_time".into(),
            arguments: serde_json::json!({"tz": "UTC"}),
            extra: Map::new(),
        },
        extra: Map::new(),
    }]);
    let mut result = Message::new("tool", "12:00");
    result.tool_call_id = Some("call_0".into());
    result.name = Some("get_time".into());
    let tool_chat = vec![
        Message::user("Time?"),
        call,
        result,
        Message::user("Thanks"),
    ];
    vec![(chat, None), (tool_chat, Some(tools))]
}

/// Names a message's reasoning goes by; HF (transformers 5.x) copies the first non-null one
/// to `thinking` (first key) and `reasoning_content` (last key) so any template finds it.
const REASONING_FIELDS: [&str; 3] = ["reasoning_content", "thinking", "reasoning"];

fn alias_reasoning(m: &Message) -> Result<Json> {
    let fields = match serde_json::to_value(m) {
        Ok(Json::Object(fields)) => fields,
        other => {
            return Err(Error::Message {
                role: m.role.clone(),
                detail: format!("does not serialize to a JSON object: {other:?}"),
            })
        }
    };
    let reasoning = REASONING_FIELDS
        .iter()
        .find_map(|k| fields.get(*k).filter(|v| !v.is_null()))
        .cloned();
    let Some(r) = reasoning else {
        return Ok(Json::Object(fields));
    };
    let mut out = Map::new();
    out.insert("thinking".into(), r.clone());
    out.extend(fields);
    out.insert("reasoning_content".into(), r);
    Ok(Json::Object(out))
}

/// Bytes shared at the start of `a` and `b`, on a char boundary.
fn common_prefix_len(a: &str, b: &str) -> usize {
    a.char_indices()
        .zip(b.chars())
        .find(|((_, x), y)| x != y)
        .map(|((i, _), _)| i)
        .unwrap_or_else(|| a.len().min(b.len()))
}
