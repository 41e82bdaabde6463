//! `minfer run [-m MODEL] [PROMPT]`: one reply, streamed to stdout; timings on stderr.
//! `--trace FILE` (or `MINFER_TRACE=<path>`) writes the per-node trace of the reply's
//! forwards there (`minfer_engine::trace`, docs/TRACE.md).

use super::args::{max_tokens, n_predict_value, ModelArgs, SamplingArgs};
use super::constraint_args::ConstraintArgs;
use super::interrupt::{self, Generating, CANCEL};
use super::spec_args::SpecArgs;
use super::Interrupted;
use crate::usage;
use anyhow::Context;
use clap::Args as ClapArgs;
use minfer_engine::Engine;
use minfer_generate::chat::{generate_interruptible_with_progress, Pieces};
use minfer_generate::GenerateRequest;
use minfer_tokenizer::template::{ChatTemplate, Message, RenderOptions};
use minfer_tokenizer::Tokenizer;
use serde_json::json;
use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::sync::atomic::Ordering;

#[derive(ClapArgs, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub constraint: ConstraintArgs,
    #[command(flatten)]
    pub spec: SpecArgs,
    /// The prompt (read from stdin when absent; one trailing newline is dropped, as
    /// llama.cpp's -f does). A prompt that starts with `-` goes after `--`.
    #[arg(conflicts_with_all = ["prompt_flag", "file"])]
    pub prompt: Option<String>,
    /// The prompt, as llama.cpp's -p (instead of the positional PROMPT).
    #[arg(
        short = 'p',
        long = "prompt",
        id = "prompt_flag",
        value_name = "PROMPT",
        conflicts_with = "file"
    )]
    pub prompt_flag: Option<String>,
    /// Read the prompt from FILE, as llama.cpp's -f (one trailing newline dropped).
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// System message for the chat template.
    #[arg(long)]
    pub system: Option<String>,
    /// Tokens to generate at most (-1: until end of generation or a full context).
    #[arg(short = 'n', long = "n-predict", default_value_t = 512, value_parser = n_predict_value)]
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
    /// Print one JSON object (text, token ids, finish reason, timings) instead of streaming;
    /// after Ctrl-C too, with finish_reason "interrupted".
    #[arg(long)]
    pub json: bool,
    /// Write the decode graph as Graphviz DOT, coloured by backend.
    #[arg(long = "dump-graph")]
    pub dump_graph: Option<PathBuf>,
    /// Write the decode graph as JSON.
    #[arg(long = "dump-graph-json")]
    pub dump_graph_json: Option<PathBuf>,
    /// Write the per-node trace of the reply's forwards to FILE (docs/TRACE.md): each node's
    /// output stats and 64 sampled values, the top-5 logits and the token chosen. Overrides
    /// MINFER_TRACE. A backend that cannot capture refuses (exit non-zero).
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Conversation mode: the chat REPL (`minfer chat`), PROMPT being the first message.
    #[arg(long)]
    pub cnv: bool,
}

/// The prompt as given: PROMPT, `-p PROMPT` or `-f FILE` (None: read stdin).
pub fn given_prompt(a: &Args) -> anyhow::Result<Option<String>> {
    if let Some(p) = a.prompt.clone().or_else(|| a.prompt_flag.clone()) {
        return Ok(Some(p));
    }
    let Some(f) = &a.file else { return Ok(None) };
    super::args::not_a_directory(f, "-f")?;
    let raw = std::fs::read(f).with_context(|| format!("-f {}: cannot read it", f.display()))?;
    let mut s = String::from_utf8(raw).map_err(|e| {
        anyhow::anyhow!(
            "-f {}: not UTF-8 text: invalid byte at offset {}",
            f.display(),
            e.utf8_error().valid_up_to()
        )
    })?;
    if s.ends_with('\n') {
        s.pop();
    }
    Ok(Some(s))
}

/// The prompt from stdin: UTF-8 (a bad byte is named by its offset), with one trailing
/// newline dropped as llama.cpp's `-f` does (the newline that ends a file or an `echo`).
fn prompt_from_stdin() -> anyhow::Result<String> {
    if std::io::stdin().is_terminal() {
        eprintln!("reading the prompt from stdin (end with Ctrl-D)");
    }
    let mut raw = Vec::new();
    std::io::stdin()
        .read_to_end(&mut raw)
        .context("cannot read the prompt from stdin")?;
    let mut s = String::from_utf8(raw).map_err(|e| {
        anyhow::anyhow!(
            "the prompt on stdin is not UTF-8 text: invalid byte at offset {}",
            e.utf8_error().valid_up_to()
        )
    })?;
    if s.ends_with('\n') {
        s.pop();
    }
    Ok(s)
}

/// Refuses a prompt the context cannot hold, suggesting a larger --n-ctx only when the model
/// allows one.
fn check_prompt_fits(engine: &Engine, prompt: usize) -> anyhow::Result<()> {
    let n_ctx = engine.n_ctx();
    if prompt <= n_ctx {
        return Ok(());
    }
    let max = engine.hparams().context_length;
    if n_ctx < max {
        anyhow::bail!("the prompt has {prompt} tokens but the context holds {n_ctx} (raise --n-ctx, up to the model's {max}, or shorten the prompt)");
    }
    anyhow::bail!("the prompt has {prompt} tokens but the context holds {n_ctx}, the model's maximum (shorten the prompt)")
}

/// One reply; `--cnv` is dispatched to `chat` before this (see [`super::run_or_chat`]).
pub fn run(args: Args) -> anyhow::Result<()> {
    // Flag combinations are refused before the prompt is read and the model loaded.
    if args.no_template && args.system.is_some() {
        usage!("--system needs the chat template; it cannot be used with --no-template");
    }
    if args.no_parse_special && !args.no_template {
        usage!("--no-parse-special applies to raw prompts; it needs --no-template (the chat template's prompt always parses its special tokens)");
    }
    let sampler = args.sampling.to_config()?;
    args.constraint.spec()?;
    args.spec.check()?;
    let prompt_text = match given_prompt(&args)? {
        Some(p) => p,
        None => prompt_from_stdin()?,
    };
    interrupt::install()?;
    let (mut engine, load_ms) = args.model.load()?;
    let draft = args.spec.draft_handle(&engine, &args.model, false)?;
    if let Some(note) = args.sampling.seed_note(&sampler) {
        eprintln!("{note}");
    }
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
    check_prompt_fits(&engine, prompt.len())?;
    let req = GenerateRequest {
        prompt: prompt.clone(),
        max_tokens: max_tokens(args.n_predict),
        sampler: sampler.clone(),
        stop_strings: args.stop.clone(),
        eog: tok.eog_ids().to_vec(),
        logprobs: None,
        constraint,
        lookup: args.spec.config(),
        draft,
    };
    // Off (no --trace, no MINFER_TRACE) nothing is armed: the engine then pays one Option
    // test per forward and each backend one bool per node (ADR 0006).
    let trace = args
        .trace
        .as_deref()
        .or_else(|| minfer_engine::trace::env_path());
    if trace.is_some() {
        engine.trace_begin()?;
    }
    let stream = !args.json;
    let mut prefill = PrefillLine::new(prompt.len() > engine.n_batch());
    let mut stdout = std::io::stdout().lock();
    let mut write_err: Option<std::io::Error> = None;
    let res = {
        // Ctrl-C (or a closed stdout) stops the reply between forwards; what was generated
        // is reported below.
        let _generating = Generating::start();
        generate_interruptible_with_progress(
            &mut engine,
            &Pieces(&tok),
            &req,
            &CANCEL,
            |bytes| {
                if stream && write_err.is_none() {
                    if let Err(e) = stdout.write_all(bytes).and_then(|_| stdout.flush()) {
                        write_err = Some(e);
                        CANCEL.store(true, Ordering::SeqCst);
                    }
                }
            },
            |fed, total| prefill.show(fed, total),
        )?
    };
    prefill.clear();
    if let Some(e) = write_err {
        return Err(e.into());
    }
    let interrupted = res.interrupted;
    let out = res.out;
    let finish = if interrupted {
        "interrupted".to_string()
    } else {
        serde_json::to_value(out.finish)?
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    if let Some(path) = trace {
        let mut t = engine.trace_end()?.context("the trace was not recorded")?;
        t.set_chosen(&out.tokens);
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
            "finish_reason": finish,
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
            "speculative": out.speculative,
        });
        serde_json::to_writer(&mut stdout, &v)?;
        writeln!(stdout)?;
    } else {
        writeln!(stdout)?;
    }
    eprintln!("load:      {load_ms:.1} ms");
    eprintln!(
        "prompt:    {} in {:.1} ms, {:.2} tokens/s",
        super::count(t.prompt_tokens, "token"),
        t.prompt_ms,
        t.prompt_tps()
    );
    eprintln!(
        "generated: {} in {:.1} ms, {:.2} tokens/s ({finish})",
        super::count(t.generated_tokens, "token"),
        t.generate_ms,
        t.generate_tps(),
    );
    if let Some(s) = &out.speculative {
        eprintln!(
            "{:<12}{} drafted, {} accepted ({:.1}%) in {} verifying forwards",
            format!("{}:", args.spec.drafter_name()),
            s.drafted,
            s.accepted,
            100.0 * s.acceptance(),
            s.verify_forwards
        );
    }
    if let Some(c) = &out.constraint {
        let ((m50, m99), (w50, w99)) = c.percentiles();
        eprintln!(
            "grammar:   mask p50 {m50:.0} µs, p99 {m99:.0} µs; waited p50 {w50:.0} µs, p99 {w99:.0} µs (masks run during the forward)"
        );
    }
    if interrupted {
        return Err(Interrupted.into());
    }
    Ok(())
}

/// A prompt's prefill shown on a terminal: `prompt: FED/TOTAL tokens` rewritten in place
/// after each batch-size forward, erased before the reply (issue 30: a 4,000-token prompt
/// was 42 s of silence). Only for a prompt of more than one forward, and never when stderr
/// is a file or a pipe (the timings lines say it all there).
struct PrefillLine {
    on: bool,
    drawn: bool,
}

impl PrefillLine {
    fn new(long_prompt: bool) -> PrefillLine {
        PrefillLine {
            on: long_prompt && std::io::stderr().is_terminal(),
            drawn: false,
        }
    }

    fn show(&mut self, fed: usize, total: usize) {
        if !self.on {
            return;
        }
        if fed >= total {
            self.clear();
            return;
        }
        eprint!("\r\x1b[2Kprompt: {fed}/{total} tokens");
        self.drawn = true;
    }

    fn clear(&mut self) {
        if self.drawn {
            eprint!("\r\x1b[2K");
            self.drawn = false;
        }
    }
}
