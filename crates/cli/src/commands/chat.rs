//! `minfer chat [-m MODEL]` (also `minfer run --cnv`): a REPL that keeps the conversation
//! in the KV cache; each turn prefills only what its message adds.
//!
//! Lines starting with `/` are commands (`/help` lists them). Ctrl-C stops the reply being
//! generated and keeps the chat; at the prompt it exits. Per turn, the tokens prefilled and
//! generated go to stderr.

use super::args::{max_tokens, n_predict_value, ModelArgs, SamplingArgs};
use super::constraint_args::ConstraintArgs;
use super::interrupt::{self, Generating, CANCEL};
use super::spec_args::SpecArgs;
use crate::usage;
use anyhow::Context;
use clap::Args as ClapArgs;
use minfer_engine::session::SessionError;
use minfer_generate::chat::{Chat, ChatConfig, Resumed, TurnEnd, TurnReport};
use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};
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
    /// A first message, sent before the prompt appears.
    pub prompt: Option<String>,
    /// System message.
    #[arg(long)]
    pub system: Option<String>,
    /// Answer one message (the PROMPT argument, or the first one read) and exit.
    #[arg(long)]
    pub single_turn: bool,
    /// A message spans lines and ends with an empty line (otherwise a line ending in `\`
    /// continues).
    #[arg(long)]
    pub multiline: bool,
    /// Reply tokens at most (-1: until end of generation or a full context).
    #[arg(short = 'n', long = "n-predict", default_value_t = 512, value_parser = n_predict_value)]
    pub n_predict: i64,
    /// Stop a reply when it contains this string (repeatable).
    #[arg(long = "stop")]
    pub stop: Vec<String>,
    /// Resume the conversation and its KV from FILE if it exists; save it after every turn
    /// and /clear. A KV saved with another --n-ctx, --cache-type or model is not reused:
    /// the conversation is prefilled again.
    #[arg(long)]
    pub session: Option<PathBuf>,
    /// Colour: auto (on a terminal, unless NO_COLOR is set), always or never.
    #[arg(long, default_value = "auto", value_parser = ["auto", "always", "never"])]
    pub color: String,
    /// Write the per-node trace of every forward of the session to FILE, rewritten after
    /// each turn (docs/TRACE.md). A backend that cannot capture refuses (exit non-zero).
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
}

const HELP: &str = "\
commands:
  /exit, /quit     leave
  /clear           forget the conversation (the system message stays)
  /regen           generate the last reply again
  /system TEXT     set the system message (empty: remove it)
  /save FILE       save the conversation and its KV
  /load FILE       restore a saved conversation
  /help            this list
Ctrl-C stops a reply; at the prompt it exits.";

struct Style {
    on: bool,
}

impl Style {
    fn paint(&self, code: &str, s: &str) -> String {
        if self.on {
            format!("\x1b[{code}m{s}\x1b[0m")
        } else {
            s.to_string()
        }
    }
    fn prompt(&self) -> String {
        self.paint("1;32", "> ")
    }
    fn notice(&self, s: &str) -> String {
        self.paint("33", s)
    }
    fn stats(&self, s: &str) -> String {
        self.paint("2", s)
    }
}

fn colour(mode: &str) -> anyhow::Result<bool> {
    Ok(match mode {
        "auto" => std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none(),
        "always" => true,
        "never" => false,
        other => usage!("--color {other:?}: expected auto, always or never"),
    })
}

enum Input {
    Message(String),
    /// A line that is not UTF-8 (the message it belonged to is dropped, the chat goes on).
    NotUtf8(String),
    Eof,
}

/// Reads one message: a line (a trailing `\` continues it), or with `multiline` lines up
/// to an empty one. `offset` counts the bytes read from stdin so far (for error messages).
fn read_message(
    input: &mut impl BufRead,
    multiline: bool,
    offset: &mut usize,
) -> anyhow::Result<Input> {
    let mut msg = String::new();
    loop {
        let mut raw = Vec::new();
        if input
            .read_until(b'\n', &mut raw)
            .context("cannot read stdin")?
            == 0
        {
            return Ok(if msg.is_empty() {
                Input::Eof
            } else {
                Input::Message(msg)
            });
        }
        let at = *offset;
        *offset += raw.len();
        let line = match String::from_utf8(raw) {
            Ok(l) => l,
            Err(e) => {
                let bad = at + e.utf8_error().valid_up_to();
                return Ok(Input::NotUtf8(format!(
                    "the message is not UTF-8 text (invalid byte at offset {bad} of stdin); it was not sent"
                )));
            }
        };
        let line = line.trim_end_matches(['\n', '\r']);
        if multiline {
            if line.is_empty() && !msg.is_empty() {
                return Ok(Input::Message(msg));
            }
            if !msg.is_empty() {
                msg.push('\n');
            }
            msg.push_str(line);
            if msg.starts_with('/') {
                return Ok(Input::Message(msg));
            }
        } else if let Some(head) = line.strip_suffix('\\') {
            msg.push_str(head);
            msg.push('\n');
        } else {
            msg.push_str(line);
            return Ok(Input::Message(msg));
        }
    }
}

/// How the REPL goes on after a line.
enum Next {
    Continue,
    Exit,
}

struct Repl {
    chat: Chat,
    style: Style,
    session: Option<PathBuf>,
    /// `--trace`: the file rewritten after each turn.
    trace: Option<PathBuf>,
}

/// The flag a user changes to make a saved KV fit again.
fn flag_of(why: &SessionError) -> &'static str {
    match why {
        SessionError::NCtx { .. }
        | SessionError::TooManyTokens { .. }
        | SessionError::NoRoom { .. } => "--n-ctx",
        SessionError::KvType { .. } => "--cache-type",
        SessionError::Backend { .. } => "--backend",
        _ => "-m",
    }
}

/// Refuses a `--session` path whose save would fail, before the first message is read: a
/// directory, or a file in a directory that does not exist.
fn check_session_path(p: &Path) -> anyhow::Result<()> {
    if p.is_dir() {
        usage!("--session {}: is a directory, not a file", p.display());
    }
    let parent = match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !parent.is_dir() {
        usage!(
            "--session {}: the directory {} does not exist (the session could not be saved)",
            p.display(),
            parent.display()
        );
    }
    Ok(())
}

impl Repl {
    fn report(&self, r: &TurnReport) {
        for n in &r.notices {
            eprintln!("{}", self.style.notice(&format!("note: {n}")));
        }
        let end = match r.end {
            TurnEnd::Interrupted => "interrupted".to_string(),
            TurnEnd::Finished(f) => format!("{f:?}").to_lowercase(),
        };
        eprintln!(
            "{}",
            self.style.stats(&format!(
                "[prefilled {} ({} prompt + {} closing), generated {} ({end}), {:.1} tok/s, KV {}/{}]",
                super::count(r.prefilled, "token"),
                r.prompt_tokens,
                r.closing_tokens,
                super::count(r.generated, "token"),
                r.timings.generate_tps(),
                self.chat.kv_tokens().len(),
                self.chat.engine().n_ctx()
            ))
        );
    }

    /// Saves to `--session`; a failure is reported and the chat goes on (the next save may
    /// work, and ending here would lose the rest of the input).
    fn save_session(&mut self) {
        let Some(p) = self.session.clone() else {
            return;
        };
        if let Err(e) = self.chat.save(&p) {
            let e = anyhow::Error::new(e);
            eprintln!(
                "{}",
                self.style.notice(&format!(
                    "error: cannot save the session to {}: {}; the chat goes on",
                    p.display(),
                    super::chain_text(&e)
                ))
            );
        }
    }

    /// One turn. A write error on stdout (a closed pipe) stops the reply, the turn is kept
    /// and saved, and the error is returned so the chat ends (quietly for a broken pipe).
    fn turn(&mut self, user: Option<&str>) -> anyhow::Result<()> {
        let mut stdout = std::io::stdout().lock();
        let mut write_err: Option<std::io::Error> = None;
        let res = {
            let _generating = Generating::start();
            let on_text = |b: &[u8]| {
                if write_err.is_none() {
                    if let Err(e) = stdout.write_all(b).and_then(|_| stdout.flush()) {
                        write_err = Some(e);
                        CANCEL.store(true, Ordering::SeqCst);
                    }
                }
            };
            match user {
                Some(u) => self.chat.send(u, &CANCEL, on_text),
                None => self.chat.regen(&CANCEL, on_text),
            }
        };
        if write_err.is_none() {
            if let Err(e) = writeln!(stdout).and_then(|_| stdout.flush()) {
                write_err = Some(e);
            }
        }
        match res {
            Ok(r) => {
                self.report(&r);
                self.save_session();
                self.write_trace()?;
            }
            // A refused turn leaves the chat as it was: say why and go on.
            Err(e) => eprintln!("{}", self.style.notice(&format!("error: {e}"))),
        }
        match write_err {
            Some(e) => Err(anyhow::Error::new(e).context("cannot write the reply to stdout")),
            None => Ok(()),
        }
    }

    /// Rewrites `--trace`'s file with every forward so far (the trace stays armed): a
    /// session ended by Ctrl-C or EOF keeps its last complete turn on disk.
    fn write_trace(&mut self) -> anyhow::Result<()> {
        let Some(path) = self.trace.clone() else {
            return Ok(());
        };
        let mut t = self
            .chat
            .engine_mut()
            .trace_snapshot()
            .context("the trace was not recorded")?;
        // The sampler's choices are not reported per turn; each one fed back as the next
        // forward's input is (a reply's last token may stay null, docs/TRACE.md).
        t.infer_chosen();
        let tok = self.chat.tokenizer();
        t.write(&path, &minfer_generate::chat::Pieces(tok))
            .with_context(|| format!("cannot write the trace {}", path.display()))?;
        eprintln!(
            "{}",
            self.style.stats(&format!(
                "[trace: {} forwards in {}]",
                t.phases.len(),
                path.display()
            ))
        );
        Ok(())
    }

    fn command(&mut self, line: &str) -> anyhow::Result<Next> {
        let (cmd, arg) = match line.split_once(char::is_whitespace) {
            Some((c, a)) => (c, a.trim()),
            None => (line, ""),
        };
        match cmd {
            "/exit" | "/quit" => return Ok(Next::Exit),
            "/help" => eprintln!("{HELP}"),
            "/clear" => {
                self.chat.clear();
                // Saved now, or a resume would bring the cleared messages back.
                self.save_session();
                eprintln!("{}", self.style.notice("note: conversation cleared"));
            }
            "/regen" => self.turn(None)?,
            "/system" => {
                self.chat.set_system((!arg.is_empty()).then_some(arg));
                self.save_session();
                let what = if arg.is_empty() { "removed" } else { "set" };
                eprintln!(
                    "{}",
                    self.style.notice(&format!(
                        "note: system message {what}; the next turn re-renders the conversation"
                    ))
                );
            }
            "/save" | "/load" if arg.is_empty() => {
                eprintln!(
                    "{}",
                    self.style.notice(&format!("error: {cmd} needs a FILE"))
                )
            }
            "/save" => match self.chat.save(Path::new(arg)) {
                Ok(()) => eprintln!(
                    "{}",
                    self.style.notice(&format!(
                        "note: saved {}, {} to {arg}",
                        super::count(self.chat.messages().len(), "message"),
                        super::count(self.chat.kv_tokens().len(), "KV token")
                    ))
                ),
                Err(e) => eprintln!("{}", self.style.notice(&format!("error: {e}"))),
            },
            "/load" => match self.chat.load(Path::new(arg)) {
                Ok(r) => self.resumed(arg, &r),
                Err(e) => eprintln!(
                    "{}",
                    self.style
                        .notice(&format!("error: {e} (the chat is unchanged)"))
                ),
            },
            other => eprintln!(
                "{}",
                self.style
                    .notice(&format!("error: unknown command {other}; /help lists them"))
            ),
        }
        Ok(Next::Continue)
    }

    fn resumed(&self, from: &str, r: &Resumed) {
        let n = super::count(self.chat.messages().len(), "message");
        let text = match r {
            Resumed::Kv { tokens } => format!(
                "note: resumed {n} from {from}: {} restored, 0 prefilled",
                super::count(*tokens, "KV token")
            ),
            Resumed::Messages { why } => format!(
                "note: resumed {n} from {from}; its KV cannot be reused ({why}; {} differs), so the next turn prefills the conversation again",
                flag_of(why)
            ),
        };
        eprintln!("{}", self.style.notice(&text));
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let style = Style {
        on: colour(&args.color)?,
    };
    if let Some(p) = &args.session {
        check_session_path(p)?;
    }
    let sampler = args.sampling.to_config()?;
    args.constraint.spec()?;
    args.spec.check()?;
    let (engine, _) = args.model.load()?;
    let draft = args.spec.draft_handle(&engine, &args.model, false)?;
    if let Some(note) = args.sampling.seed_note(&sampler) {
        eprintln!("{note}");
    }
    let max_tokens = max_tokens(args.n_predict);
    let cfg = ChatConfig {
        sampler,
        max_tokens,
        stop: args.stop.clone(),
        reply_reserve: max_tokens,
        constraint: None,
        lookup: args.spec.config(),
        draft,
    };
    let mut chat = Chat::new(engine, cfg).context("cannot start the chat")?;
    chat.config_mut().constraint = args.constraint.compile(chat.tokenizer())?;
    if let Some(n) = chat.template_notice() {
        eprintln!("{}", style.notice(&format!("note: {n}")));
    }
    if args.trace.is_some() {
        // Armed before any forward; a backend that cannot capture refuses here, naming itself.
        chat.engine_mut().trace_begin()?;
    }
    let mut repl = Repl {
        chat,
        style,
        session: args.session.clone(),
        trace: args.trace.clone(),
    };
    if let Some(p) = &args.session {
        if p.exists() {
            let r = repl
                .chat
                .load(p)
                .with_context(|| format!("cannot resume the session {}", p.display()))?;
            repl.resumed(&p.display().to_string(), &r);
        }
    }
    if let Some(s) = &args.system {
        repl.chat.set_system(Some(s));
    }
    let interactive = std::io::stdin().is_terminal();
    interrupt::install()?;
    if interactive && !args.single_turn {
        eprintln!("minfer chat: /help for commands, Ctrl-C stops a reply, /exit quits");
    }
    let mut first = args.prompt.clone();
    let mut stdin = std::io::stdin().lock();
    let mut offset = 0;
    loop {
        let msg = match first.take() {
            Some(m) => m,
            None => {
                if interactive {
                    let mut out = std::io::stdout().lock();
                    write!(out, "{}", repl.style.prompt())?;
                    out.flush()?;
                }
                match read_message(&mut stdin, args.multiline, &mut offset)? {
                    Input::Message(m) => m,
                    Input::NotUtf8(why) => {
                        eprintln!("{}", repl.style.notice(&format!("error: {why}")));
                        continue;
                    }
                    Input::Eof => break,
                }
            }
        };
        let line = msg.trim();
        if line.is_empty() {
            continue;
        }
        if line.starts_with('/') {
            if let Next::Exit = repl.command(line)? {
                break;
            }
            continue;
        }
        repl.turn(Some(&msg))?;
        if args.single_turn {
            break;
        }
    }
    Ok(())
}
