//! `minfer render -m MODEL [--add-generation-prompt] [--tools FILE] MESSAGES.json`: prints the
//! prompt text the model's chat template makes of an OpenAI-style message list, byte for byte
//! (no newline is added).
//!
//! Messages are checked by name before the template sees them, as `minfer serve` checks a
//! request: the role must be one the templates know (`developer` renders as `system`, as
//! the server does, with a note), `content` a string or a list of OpenAI text parts (joined),
//! and only an assistant message that calls tools may lack it.

use anyhow::{bail, Context};
use clap::Args as ClapArgs;
use minfer_gguf::GgufModel;
use minfer_tokenizer::template::{ChatTemplate, Message, RenderOptions};
use serde_json::Value as Json;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

#[derive(ClapArgs, Debug)]
pub struct Args {
    /// The GGUF model whose `tokenizer.chat_template` renders the messages (a path, a known
    /// name or hf:OWNER/REPO[:TAG]; default: the demo model, as every command).
    #[arg(short, long, default_value = super::args::DEFAULT_MODEL)]
    pub model: PathBuf,
    /// End with the header that opens the assistant's turn.
    #[arg(long)]
    pub add_generation_prompt: bool,
    /// A JSON file with the tool schemas (a list of OpenAI-style function definitions).
    #[arg(long)]
    pub tools: Option<PathBuf>,
    /// A JSON list of messages, or an object with `messages` (and optionally `tools`), as in
    /// an OpenAI chat request; `-` reads stdin. Roles: system, user, assistant, tool
    /// (developer renders as system); content: a string or a list of text parts.
    pub messages: PathBuf,
}

fn read_json(path: &Path) -> anyhow::Result<Json> {
    super::args::not_a_directory(path, "the file")?;
    let text = if path == Path::new("-") {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s)?;
        s
    } else {
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?
    };
    serde_json::from_str(&text).with_context(|| format!("{} is not valid JSON", path.display()))
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let (messages, request_tools) = match read_json(&args.messages)? {
        Json::Array(list) => (Json::Array(list), None),
        Json::Object(mut req) => match req.remove("messages") {
            Some(m) => (m, req.remove("tools")),
            None => bail!(
                "{}: an object needs a \"messages\" list",
                args.messages.display()
            ),
        },
        other => bail!(
            "{}: expected a list of messages or an object with \"messages\", got {}",
            args.messages.display(),
            json_kind(&other)
        ),
    };
    let messages = checked_messages(messages)
        .with_context(|| format!("{}: bad message list", args.messages.display()))?;
    let tools = match &args.tools {
        Some(path) => {
            if request_tools.is_some() {
                bail!(
                    "tools are given both by --tools and in {}",
                    args.messages.display()
                );
            }
            Some(read_json(path)?)
        }
        None => request_tools,
    };
    // As `minfer serve` checks a request's tools: each an OpenAI function tool; an empty
    // list is no tools.
    let tools = match tools {
        None | Some(Json::Null) => None,
        Some(Json::Array(list)) => {
            for (i, t) in list.iter().enumerate() {
                minfer_server::request::chat::tool(i, t)
                    .map_err(|e| anyhow::anyhow!("{}", e.message))?;
            }
            (!list.is_empty()).then_some(Json::Array(list))
        }
        Some(t) => bail!("tools must be a JSON list, got {}", json_kind(&t)),
    };

    super::args::not_a_directory(&args.model, "-m")?;
    let path = super::args::model_file(&args.model)?;
    let model =
        GgufModel::open(&path).with_context(|| format!("cannot open {}", args.model.display()))?;
    let loaded = ChatTemplate::from_metadata(model.metadata())
        .with_context(|| format!("{}: chat template refused", args.model.display()))?;
    if let Some(notice) = &loaded.notice {
        eprintln!("{notice}");
    }
    if tools.is_some() && !loaded.template.source().contains("tools") {
        bail!(
            "{}: the model's chat template does not render tools (minfer serve refuses such a request with a 400)",
            args.model.display()
        );
    }
    let opts = RenderOptions {
        add_generation_prompt: args.add_generation_prompt,
        tools,
        ..RenderOptions::default()
    };
    let text = loaded.template.render(&messages, &opts)?;
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(())
}

/// The roles the chat templates know.
const ROLES: [&str; 4] = ["system", "user", "assistant", "tool"];

/// The message list, each message checked by index (see the module docs).
fn checked_messages(list: Json) -> anyhow::Result<Vec<Message>> {
    let Json::Array(list) = list else {
        bail!("\"messages\" must be a list, got {}", json_kind(&list));
    };
    if list.is_empty() {
        bail!("the message list is empty: there is nothing to render");
    }
    list.into_iter()
        .enumerate()
        .map(|(i, m)| checked_message(i, m))
        .collect()
}

fn checked_message(i: usize, m: Json) -> anyhow::Result<Message> {
    let Json::Object(mut o) = m else {
        bail!("messages[{i}] must be an object, got {}", json_kind(&m));
    };
    let role = match o.get("role") {
        Some(Json::String(r)) if ROLES.contains(&r.as_str()) => r.clone(),
        Some(Json::String(r)) if r == "developer" => {
            eprintln!("note: messages[{i}]: role developer renders as system (the templates have no developer role), as minfer serve does");
            o.insert("role".into(), Json::String("system".into()));
            "system".into()
        }
        Some(Json::String(r)) => bail!(
            "messages[{i}].role {r:?} is not one of {} (or developer)",
            ROLES.join(", ")
        ),
        Some(v) => bail!("messages[{i}].role must be a string, got {}", json_kind(v)),
        None => bail!("messages[{i}] has no role"),
    };
    let calls_tools = matches!(o.get("tool_calls"), Some(Json::Array(c)) if !c.is_empty());
    match o.get("content") {
        Some(Json::String(_)) => {}
        None | Some(Json::Null) if role == "assistant" && calls_tools => {}
        None | Some(Json::Null) => bail!("messages[{i}] ({role}) has no content"),
        Some(Json::Array(parts)) if parts.is_empty() => {
            bail!("messages[{i}] ({role}) has no content: its content is an empty list of parts")
        }
        Some(Json::Array(parts)) => {
            let text = text_parts(i, parts)?;
            o.insert("content".into(), Json::String(text));
        }
        Some(v) => bail!(
            "messages[{i}].content must be a string or a list of text parts, got {}",
            json_kind(v)
        ),
    }
    serde_json::from_value(Json::Object(o)).with_context(|| format!("messages[{i}]"))
}

/// OpenAI content parts: text parts only, their texts joined as `minfer serve` joins them.
fn text_parts(i: usize, parts: &[Json]) -> anyhow::Result<String> {
    let mut text = String::new();
    for (j, p) in parts.iter().enumerate() {
        let at = format!("messages[{i}].content[{j}]");
        match (p.get("type"), p.get("text")) {
            (Some(Json::String(t)), Some(Json::String(s))) if t == "text" => text.push_str(s),
            (Some(Json::String(t)), _) if t == "text" => {
                bail!("{at} is a text part without a \"text\" string")
            }
            (Some(Json::String(t)), _) => {
                bail!("{at}: content parts of type {t:?} are not supported (text only)")
            }
            _ => bail!("{at} needs a \"type\" string"),
        }
    }
    Ok(text)
}

fn json_kind(v: &Json) -> &'static str {
    match v {
        Json::Null => "null",
        Json::Bool(_) => "a boolean",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "a list",
        Json::Object(_) => "an object",
    }
}
