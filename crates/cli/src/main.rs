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
    /// Perplexity of a model over a text, and KL divergence against a saved base
    /// (llama-perplexity's method and file format).
    Perplexity(Box<commands::perplexity::Args>),
    /// Rewrite a model's weights in other types (llama-quantize's mixtures, same bytes).
    Quantize(Box<commands::quantize::Args>),
    /// Fetch a known model into the user cache.
    Pull(commands::pull::Args),
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
        Command::Pull(a) => commands::pull::run(a),
        Command::Perplexity(a) => commands::perplexity::run(*a),
        Command::Quantize(a) => commands::quantize::run(*a),
        Command::Render(a) => commands::render::run(a),
        Command::Serve(a) => commands::serve::run(*a),
        Command::Tokenize(a) => commands::tokenize::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => commands::report(e),
    }
}
