//! `minfer chat [-m MODEL]` (also `minfer run --cnv`): a REPL that keeps the conversation
//! in the KV cache; each turn prefills only what its message adds.
//!
//! Lines starting with `/` are commands (`/help` lists them). Ctrl-C stops the reply being
//! generated and keeps the chat; at the prompt it exits. Per turn, the tokens prefilled and
//! generated go to stderr.

use super::args::{ModelArgs, SamplingArgs};
use super::constraint_args::ConstraintArgs;
use anyhow::Context;
use clap::Args as ClapArgs;
use minfer_engine::chat::{Chat, ChatConfig, TurnEnd, TurnReport};
use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

#[derive(ClapArgs, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub constraint: ConstraintArgs,
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
    #[arg(
        short = 'n',
        long = "n-predict",
        default_value_t = 512,
        allow_negative_numbers = true
    )]
    pub n_predict: i64,
    /// Stop a reply when it contains this string (repeatable).
    #[arg(long = "stop")]
    pub stop: Vec<String>,
    /// Resume the conversation and its KV from FILE if it exists; save it after every turn.
    #[arg(long)]
    pub session: Option<PathBuf>,
    /// Colour: auto (on a terminal, unless NO_COLOR is set), always or never.
    #[arg(long, default_value = "auto")]
    pub color: String,
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

/// Set by the SIGINT handler while a reply is generated.
static CANCEL: AtomicBool = AtomicBool::new(false);
/// Whether a reply is being generated (Ctrl-C then stops it instead of exiting).
static GENERATING: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    if GENERATING.load(Ordering::SeqCst) {
        CANCEL.store(true, Ordering::SeqCst);
    } else {
        // SAFETY: write(2) and _exit(2) are async-signal-safe.
        unsafe {
            libc::write(2, b"\n".as_ptr().cast(), 1);
            libc::_exit(130);
        }
    }
}

fn install_sigint() -> anyhow::Result<()> {
    // SAFETY: the handler only touches atomics and async-signal-safe calls; the sigaction
    // struct is zeroed and then filled before use.
    let rc = unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigint as extern "C" fn(libc::c_int) as libc::sighandler_t;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGINT, &sa, std::ptr::null_mut())
    };
    if rc != 0 {
        anyhow::bail!(
            "cannot install the Ctrl-C handler: {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

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
        other => anyhow::bail!("--color {other:?}: expected auto, always or never"),
    })
}

enum Input {
    Message(String),
    Eof,
}

/// Reads one message: a line (a trailing `\` continues it), or with `multiline` lines up
/// to an empty one.
fn read_message(input: &mut impl BufRead, multiline: bool) -> anyhow::Result<Input> {
    let mut msg = String::new();
    loop {
        let mut line = String::new();
        if input.read_line(&mut line).context("cannot read stdin")? == 0 {
            return Ok(if msg.is_empty() {
                Input::Eof
            } else {
                Input::Message(msg)
            });
        }
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
                "[prefilled {} tokens ({} prompt + {} closing), generated {} tokens ({end}), {:.1} tok/s, KV {}/{}]",
                r.prefilled,
                r.prompt_tokens,
                r.closing_tokens,
                r.generated,
                r.timings.generate_tps(),
                self.chat.kv_tokens().len(),
                self.chat.engine().n_ctx()
            ))
        );
    }

    fn save_session(&mut self) -> anyhow::Result<()> {
        if let Some(p) = self.session.clone() {
            self.chat
                .save(&p)
                .with_context(|| format!("cannot save the session to {}", p.display()))?;
        }
        Ok(())
    }

    fn turn(&mut self, user: Option<&str>) -> anyhow::Result<()> {
        let mut stdout = std::io::stdout().lock();
        CANCEL.store(false, Ordering::SeqCst);
        GENERATING.store(true, Ordering::SeqCst);
        let on_text = |b: &[u8]| {
            let _ = stdout.write_all(b).and_then(|_| stdout.flush());
        };
        let res = match user {
            Some(u) => self.chat.send(u, &CANCEL, on_text),
            None => self.chat.regen(&CANCEL, on_text),
        };
        GENERATING.store(false, Ordering::SeqCst);
        println!();
        match res {
            Ok(r) => {
                self.report(&r);
                self.save_session()?;
            }
            // A refused turn leaves the chat as it was: say why and go on.
            Err(e) => eprintln!("{}", self.style.notice(&format!("error: {e}"))),
        }
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
                eprintln!("{}", self.style.notice("note: conversation cleared"));
            }
            "/regen" => self.turn(None)?,
            "/system" => {
                self.chat.set_system((!arg.is_empty()).then_some(arg));
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
                        "note: saved {} messages, {} KV tokens to {arg}",
                        self.chat.messages().len(),
                        self.chat.kv_tokens().len()
                    ))
                ),
                Err(e) => eprintln!("{}", self.style.notice(&format!("error: {e}"))),
            },
            "/load" => match self.chat.load(Path::new(arg)) {
                Ok(()) => self.resumed(arg),
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

    fn resumed(&self, from: &str) {
        eprintln!(
            "{}",
            self.style.notice(&format!(
                "note: resumed {} messages from {from}: {} KV tokens restored, 0 prefilled",
                self.chat.messages().len(),
                self.chat.kv_tokens().len()
            ))
        );
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let style = Style {
        on: colour(&args.color)?,
    };
    let sampler = args.sampling.to_config()?;
    args.constraint.spec()?;
    let (engine, _) = args.model.load()?;
    let max_tokens = if args.n_predict < 0 {
        usize::MAX
    } else {
        args.n_predict as usize
    };
    let cfg = ChatConfig {
        sampler,
        max_tokens,
        stop: args.stop.clone(),
        reply_reserve: max_tokens,
        constraint: None,
    };
    let mut chat = Chat::new(engine, cfg).context("cannot start the chat")?;
    chat.config_mut().constraint = args.constraint.compile(chat.tokenizer())?;
    if let Some(n) = chat.template_notice() {
        eprintln!("{}", style.notice(&format!("note: {n}")));
    }
    let mut repl = Repl {
        chat,
        style,
        session: args.session.clone(),
    };
    if let Some(p) = &args.session {
        if p.exists() {
            repl.chat
                .load(p)
                .with_context(|| format!("cannot resume the session {}", p.display()))?;
            repl.resumed(&p.display().to_string());
        }
    }
    if let Some(s) = &args.system {
        repl.chat.set_system(Some(s));
    }
    let interactive = std::io::stdin().is_terminal();
    install_sigint()?;
    if interactive && !args.single_turn {
        eprintln!("minfer chat: /help for commands, Ctrl-C stops a reply, /exit quits");
    }
    let mut first = args.prompt.clone();
    let mut stdin = std::io::stdin().lock();
    loop {
        let msg = match first.take() {
            Some(m) => m,
            None => {
                if interactive {
                    print!("{}", repl.style.prompt());
                    std::io::stdout().flush()?;
                }
                match read_message(&mut stdin, args.multiline)? {
                    Input::Message(m) => m,
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
