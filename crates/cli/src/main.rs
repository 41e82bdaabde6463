//! The `minfer` command line: parse, build a config, call the library crates, print.

use clap::{Parser, Subcommand};
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
    /// Fetch a known model, or hf:OWNER/REPO[:QUANT|:FILE] from the hub, into the user cache.
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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
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
        Command::Render(a) => commands::render::run(a),
        Command::Serve(a) => commands::serve::run(*a),
        Command::Tokenize(a) => commands::tokenize::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => commands::report(e),
    }
}
