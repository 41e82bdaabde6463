//! One module per subcommand, each with `Args` and `run(args) -> anyhow::Result<()>`.

use std::process::ExitCode;

pub mod args;
pub mod bench;
pub mod chat;
pub mod constraint_args;
pub mod convert;
pub mod inspect;
pub mod interrupt;
pub mod list;
pub mod merge;
pub mod offload_args;
pub mod output;
pub mod perplexity;
pub mod pull;
pub mod quantize;
pub mod render;
pub mod rm;
pub mod run;
pub mod sampling_extra;
pub mod serve;
pub mod spec_args;
pub mod split;
pub mod synth;
pub mod tokenize;
pub mod trace_diff;
pub mod viz;

/// `minfer run`, or with `--cnv` the chat REPL with `run`'s prompt as its first message.
/// The dispatch lives here so that neither subcommand depends on the other.
pub fn run_or_chat(a: run::Args) -> anyhow::Result<()> {
    if !a.cnv {
        return run::run(a);
    }
    let prompt = run::given_prompt(&a)?;
    chat::run(chat::Args {
        model: a.model,
        sampling: a.sampling,
        constraint: a.constraint,
        spec: a.spec,
        prompt,
        system: a.system,
        single_turn: false,
        multiline: false,
        n_predict: a.n_predict,
        stop: a.stop,
        session: None,
        color: "auto".into(),
        trace: a.trace,
    })
}

/// A count with its noun in the right number: `1 token`, `2 tokens`.
pub fn count(n: usize, noun: &str) -> String {
    format!("{n} {noun}{}", if n == 1 { "" } else { "s" })
}

/// A flag value or a combination of flags that cannot work, found after clap's parsing:
/// reported like clap's own errors, with clap's usage exit code (2), so every flag-value
/// error exits 2 whether clap or a command found it.
#[derive(Debug)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// `bail!` for a [`UsageError`].
#[macro_export]
macro_rules! usage {
    ($($t:tt)*) => {
        return Err($crate::commands::UsageError(format!($($t)*)).into())
    };
}

/// The user stopped a command with Ctrl-C after what it had done was reported: exit 130
/// (128 + SIGINT, what a shell shows for an interrupted program) with no error line.
#[derive(Debug)]
pub struct Interrupted;

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("interrupted")
    }
}

impl std::error::Error for Interrupted {}

/// The command printed its result and exits with this code, with no error line (`minfer
/// trace-diff`: 1 when the traces differ).
#[derive(Debug)]
pub struct Quiet(pub u8);

impl std::fmt::Display for Quiet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "exit {}", self.0)
    }
}

impl std::error::Error for Quiet {}

/// The exit code of usage errors, as clap's.
pub const USAGE_EXIT: u8 = 2;
/// The exit code after Ctrl-C.
pub const INTERRUPTED_EXIT: u8 = 130;

/// Whether an error chain is a write into a closed pipe (output piped into `head`), however
/// it was wrapped (an io error, or serde_json's error around one).
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            return io.kind() == std::io::ErrorKind::BrokenPipe;
        }
        if let Some(js) = c.downcast_ref::<serde_json::Error>() {
            return js.io_error_kind() == Some(std::io::ErrorKind::BrokenPipe);
        }
        false
    })
}

/// Prints an error chain on one line to stderr and picks the exit code: 0 for a broken
/// pipe (output piped into `head` is not a failure), 2 for usage errors, 130 after Ctrl-C,
/// else 1.
pub fn report(e: anyhow::Error) -> ExitCode {
    if is_broken_pipe(&e) {
        return ExitCode::SUCCESS;
    }
    if e.downcast_ref::<Interrupted>().is_some() {
        return ExitCode::from(INTERRUPTED_EXIT);
    }
    if let Some(q) = e.downcast_ref::<Quiet>() {
        return ExitCode::from(q.0);
    }
    eprintln!("error: {}", chain_text(&e));
    if e.downcast_ref::<UsageError>().is_some() {
        return ExitCode::from(USAGE_EXIT);
    }
    ExitCode::FAILURE
}

/// The chain joined by `: `, each message once: a cause whose text its wrapper already
/// printed (errors that show their source in their own message) is left out.
pub fn chain_text(e: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for c in e.chain() {
        let text = c.to_string();
        if text.is_empty() || parts.last().is_some_and(|p| p.contains(&text)) {
            continue;
        }
        parts.push(text);
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error that prints its source in its own message, as many do.
    #[derive(Debug)]
    struct Shows(std::io::Error);

    impl std::fmt::Display for Shows {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "cannot open x: {}", self.0)
        }
    }

    impl std::error::Error for Shows {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn chain_text_prints_a_cause_once() {
        let io = std::io::Error::from_raw_os_error(19);
        let once = io.to_string();
        let e = anyhow::Error::new(Shows(io)).context("cannot load x");
        let text = chain_text(&e);
        assert_eq!(text.matches(&once).count(), 1, "{text}");
        assert!(text.starts_with("cannot load x: cannot open x"), "{text}");
    }

    #[test]
    fn broken_pipe_is_found_inside_serde_json() {
        let io = std::io::Error::from(std::io::ErrorKind::BrokenPipe);
        let js = serde_json::Error::io(io);
        assert!(is_broken_pipe(&anyhow::Error::new(js).context("writing")));
        let other = serde_json::from_str::<u8>("x").unwrap_err();
        assert!(!is_broken_pipe(&anyhow::Error::new(other)));
    }
}
