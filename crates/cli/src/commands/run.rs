//! `minfer run [-m MODEL] [PROMPT]`: one reply, streamed to stdout; timings on stderr.
//! `MINFER_TRACE=<path>` writes the per-node trace of the reply's forwards there
//! (`minfer_engine::trace`).

use super::args::{ModelArgs, SamplingArgs};
use super::constraint_args::ConstraintArgs;
use anyhow::{bail, Context};
use clap::Args as ClapArgs;
use minfer_engine::chat::Pieces;
use minfer_engine::generate::{generate, GenerateRequest};
use minfer_tokenizer::template::{ChatTemplate, Message, RenderOptions};
use minfer_tokenizer::Tokenizer;
use serde_json::json;
use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;

#[derive(ClapArgs, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub constraint: ConstraintArgs,
    /// The prompt (read from stdin when absent).
    pub prompt: Option<String>,
    /// System message for the chat template.
    #[arg(long)]
    pub system: Option<String>,
    /// Tokens to generate at most (-1: until end of generation or a full context).
    #[arg(
        short = 'n',
        long = "n-predict",
        default_value_t = 512,
        allow_negative_numbers = true
    )]
    pub n_predict: i64,
    /// Feed the prompt as raw text, without the model's chat template. Special-token text in
    /// it (`<|im_start|>`) becomes the token's id, as in llama.cpp, so a prompt rendered
    /// elsewhere gives the same ids.
    #[arg(long)]
    pub no_template: bool,
    /// With --no-template: tokenize special-token text as plain text (`<|im_start|>` becomes
    /// `<`, `|`, `im`, ...) instead of the token's id.
    #[arg(long)]
    pub no_parse_special: bool,
    /// Stop when the output contains this string (repeatable).
    #[arg(long = "stop")]
    pub stop: Vec<String>,
    /// Print one JSON object (text, token ids, finish reason, timings) instead of streaming.
    #[arg(long)]
    pub json: bool,
    /// Write the decode graph as Graphviz DOT, coloured by backend.
    #[arg(long = "dump-graph")]
    pub dump_graph: Option<PathBuf>,
    /// Write the decode graph as JSON.
    #[arg(long = "dump-graph-json")]
    pub dump_graph_json: Option<PathBuf>,
    /// Conversation mode: the chat REPL (`minfer chat`), PROMPT being the first message.
    #[arg(long)]
    pub cnv: bool,
}

/// One reply; `--cnv` is dispatched to `chat` before this (see [`super::run_or_chat`]).
pub fn run(args: Args) -> anyhow::Result<()> {
    // Flag combinations are refused before the prompt is read and the model loaded.
    if args.no_template && args.system.is_some() {
        bail!("--system needs the chat template; it cannot be used with --no-template");
    }
    if args.no_parse_special && !args.no_template {
        bail!("--no-parse-special applies to raw prompts; it needs --no-template (the chat template's prompt always parses its special tokens)");
    }
    let sampler = args.sampling.to_config()?;
    args.constraint.spec()?;
    let prompt_text = match &args.prompt {
        Some(p) => p.clone(),
        None => {
            if std::io::stdin().is_terminal() {
                eprintln!("reading the prompt from stdin (end with Ctrl-D)");
            }
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .context("cannot read the prompt from stdin")?;
            s
        }
    };
    let (mut engine, load_ms) = args.model.load()?;
    let md = engine.model().metadata();
    let tok = Tokenizer::from_metadata(md).context("cannot build the tokenizer")?;
    let constraint = args.constraint.compile(&tok)?;
    let prompt = if args.no_template {
        tok.encode_prompt(&prompt_text, true, !args.no_parse_special)
    } else {
        let loaded = ChatTemplate::from_metadata(md).context("cannot load the chat template")?;
        if let Some(n) = &loaded.notice {
            eprintln!("note: {n}");
        }
        let mut messages = Vec::new();
        if let Some(s) = &args.system {
            messages.push(Message::new("system", s.as_str()));
        }
        messages.push(Message::new("user", prompt_text.as_str()));
        let text = loaded.template.render(
            &messages,
            &RenderOptions {
                add_generation_prompt: true,
                ..RenderOptions::default()
            },
        )?;
        tok.encode(&text, true)
    };
    if let Some(p) = &args.dump_graph {
        std::fs::write(p, engine.graph_dot(1, 1)?)
            .with_context(|| format!("cannot write {}", p.display()))?;
    }
    if let Some(p) = &args.dump_graph_json {
        std::fs::write(p, engine.graph_json(1, 1)?)
            .with_context(|| format!("cannot write {}", p.display()))?;
    }
    let max_tokens = if args.n_predict < 0 {
        usize::MAX
    } else {
        args.n_predict as usize
    };
    let req = GenerateRequest {
        prompt: prompt.clone(),
        max_tokens,
        sampler: sampler.clone(),
        stop_strings: args.stop.clone(),
        eog: tok.eog_ids().to_vec(),
        logprobs: None,
        constraint,
    };
    let trace = minfer_engine::trace::env_path();
    if trace.is_some() {
        engine.trace_begin()?;
    }
    let stream = !args.json;
    let mut stdout = std::io::stdout().lock();
    let mut write_err: Option<std::io::Error> = None;
    let out = generate(&mut engine, &Pieces(&tok), &req, |bytes| {
        if stream && write_err.is_none() {
            if let Err(e) = stdout.write_all(bytes).and_then(|_| stdout.flush()) {
                write_err = Some(e);
            }
        }
    })?;
    if let Some(e) = write_err {
        return Err(e.into());
    }
    if let Some(path) = trace {
        let t = engine.trace_end()?.context("the trace was not recorded")?;
        t.write(path, &Pieces(&tok))
            .with_context(|| format!("cannot write the trace {}", path.display()))?;
        eprintln!(
            "trace:     {} forwards in {}",
            t.phases.len(),
            path.display()
        );
    }
    let t = &out.timings;
    if args.json {
        let v = json!({
            "text": String::from_utf8_lossy(&out.text),
            "prompt_ids": prompt,
            "generated_ids": out.tokens,
            "finish_reason": out.finish,
            "seed": sampler.seed,
            "timings": {
                "load_ms": load_ms,
                "prompt_tokens": t.prompt_tokens,
                "prompt_ms": t.prompt_ms,
                "prompt_tokens_per_s": t.prompt_tps(),
                "generated_tokens": t.generated_tokens,
                "generate_ms": t.generate_ms,
                "generated_tokens_per_s": t.generate_tps(),
            },
            "constraint": out.constraint,
        });
        serde_json::to_writer(&mut stdout, &v)?;
        writeln!(stdout)?;
    } else {
        writeln!(stdout)?;
    }
    eprintln!("load:      {load_ms:.1} ms");
    eprintln!(
        "prompt:    {} tokens in {:.1} ms, {:.2} tokens/s",
        t.prompt_tokens,
        t.prompt_ms,
        t.prompt_tps()
    );
    eprintln!(
        "generated: {} tokens in {:.1} ms, {:.2} tokens/s ({})",
        t.generated_tokens,
        t.generate_ms,
        t.generate_tps(),
        serde_json::to_value(out.finish)?.as_str().unwrap_or("")
    );
    if let Some(c) = &out.constraint {
        let ((m50, m99), (w50, w99)) = c.percentiles();
        eprintln!(
            "grammar:   mask p50 {m50:.0} µs, p99 {m99:.0} µs; waited p50 {w50:.0} µs, p99 {w99:.0} µs (masks run during the forward)"
        );
    }
    Ok(())
}
