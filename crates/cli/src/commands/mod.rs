//! One module per subcommand, each with `Args` and `run(args) -> anyhow::Result<()>`.

use std::process::ExitCode;

pub mod args;
pub mod bench;
pub mod chat;
pub mod inspect;
pub mod perplexity;
pub mod pull;
pub mod quantize;
pub mod render;
pub mod run;
pub mod serve;
pub mod synth;
pub mod tokenize;

/// `minfer run`, or with `--cnv` the chat REPL with `run`'s prompt as its first message.
/// The dispatch lives here so that neither subcommand depends on the other.
pub fn run_or_chat(a: run::Args) -> anyhow::Result<()> {
    if !a.cnv {
        return run::run(a);
    }
    chat::run(chat::Args {
        model: a.model,
        sampling: a.sampling,
        prompt: a.prompt,
        system: a.system,
        single_turn: false,
        multiline: false,
        n_predict: a.n_predict,
        stop: a.stop,
        session: None,
        color: "auto".into(),
    })
}

/// Prints an error chain on one line to stderr and picks the exit code. A broken pipe
/// (output piped into `head`) is not a failure.
pub fn report(e: anyhow::Error) -> ExitCode {
    if let Some(io) = e.downcast_ref::<std::io::Error>() {
        if io.kind() == std::io::ErrorKind::BrokenPipe {
            return ExitCode::SUCCESS;
        }
    }
    let chain: Vec<String> = e.chain().map(|c| c.to_string()).collect();
    eprintln!("error: {}", chain.join(": "));
    ExitCode::FAILURE
}
