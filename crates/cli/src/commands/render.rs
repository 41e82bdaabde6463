//! `minfer render -m MODEL [--add-generation-prompt] [--tools FILE] MESSAGES.json`: prints the
//! prompt text the model's chat template makes of an OpenAI-style message list, byte for byte
//! (no newline is added).

use anyhow::{bail, Context};
use clap::Args as ClapArgs;
use minfer_gguf::GgufModel;
use minfer_tokenizer::template::{ChatTemplate, Message, RenderOptions};
use serde_json::Value as Json;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

#[derive(ClapArgs, Debug)]
pub struct Args {
    /// The GGUF model whose `tokenizer.chat_template` renders the messages.
    #[arg(short, long)]
    pub model: PathBuf,
    /// End with the header that opens the assistant's turn.
    #[arg(long)]
    pub add_generation_prompt: bool,
    /// A JSON file with the tool schemas (a list of OpenAI-style function definitions).
    #[arg(long)]
    pub tools: Option<PathBuf>,
    /// A JSON list of messages, or an object with `messages` (and optionally `tools`), as in
    /// an OpenAI chat request; `-` reads stdin.
    pub messages: PathBuf,
}

fn read_json(path: &Path) -> anyhow::Result<Json> {
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
    let messages: Vec<Message> = serde_json::from_value(messages)
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
    if let Some(t) = &tools {
        if !t.is_array() && !t.is_null() {
            bail!("tools must be a JSON list, got {}", json_kind(t));
        }
    }

    let path = super::args::model_path(&args.model)?;
    let model =
        GgufModel::open(&path).with_context(|| format!("cannot open {}", args.model.display()))?;
    let loaded = ChatTemplate::from_metadata(model.metadata())
        .with_context(|| format!("{}: chat template refused", args.model.display()))?;
    if let Some(notice) = &loaded.notice {
        eprintln!("{notice}");
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
