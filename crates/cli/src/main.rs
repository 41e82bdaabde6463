//! The `minfer` command line: parse, build a config, call the library crates, print.

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use std::process::ExitCode;

mod commands;

#[derive(Parser, Debug)]
#[command(
    name = "minfer",
    version,
    about = "Local LLM inference for GGUF models"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Prompt and generation throughput (llama-bench style), and memory bandwidth.
    Bench(Box<commands::bench::Args>),
    /// Generate a reply to a prompt, streamed to stdout (timings on stderr).
    Run(Box<commands::run::Args>),
    /// Chat in a REPL that keeps the conversation in the KV cache.
    Chat(Box<commands::chat::Args>),
    /// The first node where two traces (--trace FILE) differ beyond a tolerance.
    TraceDiff(commands::trace_diff::Args),
    /// Show a GGUF file's metadata, tensors and per-type totals.
    Inspect(commands::inspect::Args),
    /// Write a GGUF model of a chosen shape with seeded random weights.
    Synth(Box<commands::synth::Args>),
    /// Convert a Hugging Face Qwen2 / Qwen3 / LLaMA checkpoint to GGUF (as convert_hf_to_gguf.py).
    Convert(commands::convert::Args),
    /// Cut a model into parts as llama-gguf-split does (--split-max-size / --split-max-tensors).
    Split(commands::split::Args),
    /// Join a split model into one file (the exact bytes that were split).
    Merge(commands::merge::Args),
    /// Perplexity of a model over a text, and KL divergence against a saved base
    /// (llama-perplexity's method and file format).
    Perplexity(Box<commands::perplexity::Args>),
    /// Rewrite a model's weights in other types (llama-quantize's mixtures, same bytes).
    Quantize(Box<commands::quantize::Args>),
    /// Fetch a known model, or hf:OWNER/REPO[:QUANT|:FILE.gguf] from the hub, into the cache.
    Pull(commands::pull::Args),
    /// The models in the cache and the names to run them by.
    List(commands::list::Args),
    /// Remove a model from the cache.
    Rm(commands::rm::Args),
    /// Print the prompt a model's chat template makes of an OpenAI-style message list.
    Render(commands::render::Args),
    /// Serve the model over an OpenAI-compatible HTTP API, with a chat page at /.
    Serve(Box<commands::serve::Args>),
    /// Print the token ids (and pieces) of a text, or decode ids with --decode.
    Tokenize(commands::tokenize::Args),
    /// A page in the browser that shows the model's graph run (or replays a --trace FILE).
    Viz(Box<commands::viz::Args>),
}

/// The command tree with negative numbers allowed as values.
///
/// Mechanism (issue 18): every argument of every subcommand that takes a value gets
/// clap's `Arg::allow_negative_numbers`, here, after the derive built the tree, so flags
/// added later (in any flattened group) are covered with no attribute of their own:
/// `--temp -1`, `--seed -1` and `--repeat-last-n -1` parse as values (llama.cpp gives them
/// meanings) instead of "unexpected argument". Ranges are then checked by each flag's
/// value parser. Only negative-number-shaped values are affected: `--stop -x` still reads
/// `-x` as a flag.
fn command() -> clap::Command {
    Cli::command().mut_subcommands(|sub| {
        sub.mut_args(|a| {
            if a.get_action().takes_values() {
                a.allow_negative_numbers(true)
            } else {
                a
            }
        })
    })
}

/// A help page that only a short-flag cluster such as `-hello` asked for (clap reads it as
/// `-h -e -l -l -o`): a prompt that starts with `-`, which would otherwise print the help
/// and exit 0 silently. Returns that argument.
fn help_by_cluster(args: &[std::ffi::OsString]) -> Option<String> {
    let before_dashes = args.iter().skip(1).take_while(|a| *a != "--");
    let mut cluster = None;
    for a in before_dashes {
        let a = a.to_string_lossy();
        if a == "-h" || a == "--help" {
            return None;
        }
        if a.starts_with("-h") && !a.starts_with("--") {
            cluster.get_or_insert_with(|| a.into_owned());
        }
    }
    cluster
}

/// llama.cpp's flags that minfer spells differently or does not have, with minfer's answer.
/// Clap would read `-ngl 99` as `-n gl`, `-cnv` as `-c nv`: each is caught by its whole name
/// first and answered with minfer's equivalent (a usage error, exit 2).
const LLAMA_FLAGS: &[(&[&str], &str)] = &[
    (
        &["-dev", "--device"],
        "choose the device with --backend cpu|metal|cuda",
    ),
    (
        &[
            "-cnv",
            "--conversation",
            "-i",
            "--interactive",
            "-if",
            "--interactive-first",
        ],
        "use `minfer chat` (or `minfer run --cnv`) for a conversation",
    ),
    (
        &["-no-cnv", "--no-conversation"],
        "`minfer run` is one reply already (no conversation)",
    ),
    (&["-st"], "--single-turn (minfer chat)"),
    (&["-mli", "--multiline-input"], "--multiline (minfer chat)"),
    (&["-sys", "--system-prompt"], "--system TEXT"),
    (
        &["-ctk", "--cache-type-k", "-ctv", "--cache-type-v"],
        "--cache-type T sets the type of both K and V",
    ),
    (
        &["-fa", "--flash-attn"],
        "minfer's attention is always the fused (flash) kind: leave the flag out",
    ),
    (
        &["-np"],
        "--parallel N (minfer serve; bench: --parallel N,...)",
    ),
    (
        &["-tb", "--threads-batch"],
        "-t N sets the threads of prompt and generation alike",
    ),
    (
        &["-ub", "--ubatch-size"],
        "-b/--batch-size (bench) or --chunk (serve)",
    ),
    (
        &["-hf", "-hfr", "--hf-repo"],
        "-m hf:OWNER/REPO[:QUANT] (fetched into the cache on first use)",
    ),
    (
        &["-cb", "--cont-batching"],
        "minfer serve always batches continuously: leave the flag out",
    ),
];

/// The first llama.cpp flag of `args` that minfer answers (before `--`): (flag, answer).
fn llama_flag(args: &[std::ffi::OsString]) -> Option<(String, &'static str)> {
    let before_dashes = args.iter().skip(1).take_while(|a| *a != "--");
    for a in before_dashes {
        let a = a.to_string_lossy();
        let name = a.split('=').next().unwrap_or("");
        for (names, answer) in LLAMA_FLAGS {
            if names.contains(&name) {
                return Some((name.to_string(), answer));
            }
        }
    }
    None
}

/// llama.cpp's `-ngl N` is `--gpu-layers N` (clap would read it as `-n gl`) and `-md MODEL`
/// `--draft MODEL`: rewritten by their whole names before `--`, as `-ngl=N` / `-md=M` too;
/// after `--` they are prompt text.
fn ngl_alias(args: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    let mut before_dashes = true;
    args.into_iter()
        .map(|a| {
            if a == "--" {
                before_dashes = false;
            }
            if !before_dashes {
                return a;
            }
            match a.to_str() {
                Some("-ngl") => "--gpu-layers".into(),
                Some(s) if s.starts_with("-ngl=") => format!("--gpu-layers={}", &s[5..]).into(),
                // llama.cpp's `-md MODEL` (clap would read `-m d`): the draft model.
                Some("-md") => "--draft".into(),
                Some(s) if s.starts_with("-md=") => format!("--draft={}", &s[4..]).into(),
                _ => a,
            }
        })
        .collect()
}

fn parse() -> Cli {
    let args: Vec<std::ffi::OsString> = ngl_alias(std::env::args_os().collect());
    let mut cmd = command();
    if let Some((flag, answer)) = llama_flag(&args) {
        let sub = args.get(1).map(|s| s.to_string_lossy().into_owned());
        let c = match sub.as_deref().and_then(|s| cmd.find_subcommand_mut(s)) {
            Some(c) => c,
            None => &mut cmd,
        };
        c.error(
            clap::error::ErrorKind::UnknownArgument,
            format!("'{flag}' is llama.cpp's flag; in minfer: {answer}"),
        )
        .exit();
    }
    let matches = match cmd.try_get_matches_from_mut(&args) {
        Ok(m) => m,
        Err(e) if e.kind() == clap::error::ErrorKind::DisplayHelp => {
            if let Some(arg) = help_by_cluster(&args) {
                let flags: Vec<String> = arg[1..].chars().map(|c| format!("-{c}")).collect();
                let sub = args.get(1).map_or("run".into(), |s| s.to_string_lossy());
                // The subcommand's usage line, when the cluster came after one.
                let cmd = match cmd.find_subcommand_mut(sub.as_ref()) {
                    Some(c) => c,
                    None => &mut cmd,
                };
                cmd.error(
                    clap::error::ErrorKind::UnknownArgument,
                    format!(
                        "unexpected argument '{arg}' (read as the flags {}); a prompt that starts with '-' goes after '--': minfer {sub} -- '{arg}'",
                        flags.join(" ")
                    ),
                )
                .exit();
            }
            e.exit()
        }
        Err(e) => plain_number_error(&mut cmd, &args, e).exit(),
    };
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

/// clap's own parse of a number flag ends its message with Rust's words ("invalid digit
/// found in string", "number too large to fit in target type"): said plainly instead, the
/// flag and the value kept (issue 30: no internals in messages).
fn plain_number_error(
    cmd: &mut clap::Command,
    args: &[std::ffi::OsString],
    e: clap::Error,
) -> clap::Error {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    use std::num::IntErrorKind;
    if e.kind() != ErrorKind::ValueValidation {
        return e;
    }
    let (Some(ContextValue::String(arg)), Some(ContextValue::String(value))) = (
        e.get(ContextKind::InvalidArg),
        e.get(ContextKind::InvalidValue),
    ) else {
        return e;
    };
    let Some(source) = std::error::Error::source(&e) else {
        return e;
    };
    let why = if let Some(p) = source.downcast_ref::<std::num::ParseIntError>() {
        match p.kind() {
            IntErrorKind::PosOverflow => "the number is too large",
            IntErrorKind::NegOverflow => "the number is too small",
            _ if value.trim_start().starts_with('-') => "expected a whole number of 0 or more",
            _ => "expected a whole number",
        }
    } else if source.downcast_ref::<std::num::ParseFloatError>().is_some() {
        "expected a number"
    } else {
        return e;
    };
    let sub = args.get(1).map(|s| s.to_string_lossy().into_owned());
    let c = match sub.as_deref().and_then(|s| cmd.find_subcommand_mut(s)) {
        Some(c) => c,
        None => cmd,
    };
    c.error(
        ErrorKind::ValueValidation,
        format!("invalid value '{value}' for '{arg}': {why}"),
    )
}

/// The library crates report through `tracing`; here their events become the plain lines
/// on stderr they always were (no time, level or target; info and above).
fn install_stderr_log() {
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(tracing::Level::INFO)
        .without_time()
        .with_level(false)
        .with_target(false)
        .with_ansi(false)
        .try_init();
}

fn main() -> ExitCode {
    install_stderr_log();
    let cli = parse();
    // Read before any kernel runs: a value a knob does not name is a usage error here (the
    // kernels' lookup would panic on it).
    if let Err(e) = minfer_engine::Settings::from_env() {
        return commands::report(commands::UsageError(e.to_string()).into());
    }
    let result = match cli.command {
        Command::Bench(a) => commands::bench::run(*a),
        Command::Run(a) => commands::run_or_chat(*a),
        Command::Chat(a) => commands::chat::run(*a),
        Command::Inspect(a) => commands::inspect::run(a),
        Command::Synth(a) => commands::synth::run(*a),
        Command::Convert(a) => commands::convert::run(a),
        Command::Split(a) => commands::split::run(a),
        Command::Merge(a) => commands::merge::run(a),
        Command::Pull(a) => commands::pull::run(a),
        Command::List(a) => commands::list::run(a),
        Command::Rm(a) => commands::rm::run(a),
        Command::Perplexity(a) => commands::perplexity::run(*a),
        Command::Quantize(a) => commands::quantize::run(*a),
        Command::Render(a) => commands::render::run(a),
        Command::Serve(a) => commands::serve::run(*a),
        Command::Tokenize(a) => commands::tokenize::run(a),
        Command::TraceDiff(a) => commands::trace_diff::run(a),
        Command::Viz(a) => commands::viz::run(*a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => commands::report(e),
    }
}
