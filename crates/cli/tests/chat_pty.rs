//! `minfer chat` driven through a pseudo-terminal, as a person uses it: two turns, /regen,
//! a context overflow at a small --n-ctx, saving, Ctrl-C, a restart that resumes the
//! session. On a synthetic model (the replies are noise; what is checked is the chat's
//! behaviour and its per-turn token counts), and the same walk on the demo model when it
//! is cached.

use minfer_models::synth::{synthesize, SynthSpec};
use minfer_models::Arch;
use minfer_testkit::models;
use rexpect::session::{spawn_command, PtySession};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A fresh path per call: the tests run in parallel, and rewriting a model file that another
/// test's `minfer` has mapped kills that process (SIGBUS, no message).
fn tmp(name: &str) -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let d = std::env::temp_dir().join(format!("minfer-chat-pty-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(format!("{}-{name}", NEXT.fetch_add(1, Ordering::Relaxed)))
}

fn tiny_model() -> PathBuf {
    let p = tmp("tiny.gguf");
    let w = synthesize(&SynthSpec::new(Arch::Qwen2, 2, 64, 4, 2, 128)).unwrap();
    std::fs::write(&p, w.to_bytes()).unwrap();
    p
}

/// A model big enough that a reply cannot fill a 4096 context before a Ctrl-C lands
/// (about 15 M parameters: milliseconds per token instead of microseconds).
fn slow_model() -> PathBuf {
    let p = tmp("slow.gguf");
    let mut spec = SynthSpec::new(Arch::Qwen2, 4, 512, 8, 2, 2048);
    spec.weight_type = minfer_gguf::GgmlType::Q8_0;
    std::fs::write(&p, synthesize(&spec).unwrap().to_bytes()).unwrap();
    p
}

fn chat(model: &Path, extra: &[&str], timeout_ms: u64) -> PtySession {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_minfer"));
    cmd.arg("chat")
        .arg("-m")
        .arg(model)
        .args(["--temp", "0", "-t", "1"]);
    cmd.args(extra);
    spawn_command(cmd, Some(timeout_ms)).unwrap()
}

/// One turn's figures from the stats line on stderr.
struct Stats {
    prefilled: usize,
    prompt: usize,
    kv: usize,
    /// Everything printed between the message and the stats line.
    before: String,
}

const STATS: &str = r"\[prefilled (\d+) tokens? \((\d+) prompt \+ (\d+) closing\), generated (\d+) tokens? \((\w+)\), [0-9.]+ tok/s, KV (\d+)/(\d+)\]";

fn turn(p: &mut PtySession, line: &str) -> Stats {
    p.send_line(line).unwrap();
    let (before, m) = p.exp_regex(STATS).unwrap();
    let re = regex_lite(&m);
    p.exp_string("> ").unwrap();
    Stats {
        prefilled: re[0],
        prompt: re[1],
        kv: re[4],
        before,
    }
}

/// The numbers of a stats line, in order (a hand parser: the test needs no regex crate).
fn regex_lite(m: &str) -> Vec<usize> {
    m.split(|c: char| !c.is_ascii_digit() && c != '.')
        .filter(|s| !s.is_empty() && !s.contains('.'))
        .map(|s| s.parse().unwrap())
        .collect()
}

#[test]
fn a_person_chats_regenerates_overflows_saves_and_resumes() {
    let model = tiny_model();
    let session = tmp("walk.session");
    let saved = tmp("walk-saved.session");
    let _ = std::fs::remove_file(&session);
    let args = [
        "-n",
        "8",
        "--n-ctx",
        "160",
        "--color",
        "never",
        "--system",
        "Be brief.",
    ];
    let mut p = chat(
        &model,
        &[&args[..], &["--session", session.to_str().unwrap()]].concat(),
        30_000,
    );
    p.exp_string("/help for commands").unwrap();
    p.exp_string("> ").unwrap();

    let t1 = turn(&mut p, "Hello there, how are you?");
    assert!(t1.prefilled > 0 && t1.kv > t1.prefilled);
    let t2 = turn(&mut p, "Tell me about the sea.");
    // The history is not prefilled again: turn 2 prefills about as much as turn 1's
    // message did (turn 1 also carried the system message).
    assert!(
        t2.prompt < t1.kv,
        "turn 2 prompt {} vs KV {}",
        t2.prompt,
        t1.kv
    );

    let r = turn(&mut p, "/regen");
    assert_eq!(r.prompt, 1, "regen re-decodes only the last prompt token");
    // Greedy: the same reply again, so the KV ends where it did.
    assert_eq!(r.kv, t2.kv);

    // Overflow: keep talking until the oldest turn is dropped.
    let mut overflowed = None;
    for i in 0..8 {
        let t = turn(&mut p, &format!("Another question, number {i}."));
        assert!(t.kv <= 160);
        if t.before.contains("context full: dropped the oldest turn") {
            overflowed = Some(t);
            break;
        }
    }
    let t = overflowed.expect("the context never filled");
    assert!(t.before.contains("shifted back"), "{}", t.before);
    assert!(
        t.prefilled < 60,
        "after the drop the turn prefilled {}",
        t.prefilled
    );

    // A message that can never fit is refused and the chat goes on.
    p.send_line(&"word ".repeat(200)).unwrap();
    p.exp_string("nothing was changed").unwrap();
    p.exp_string("> ").unwrap();

    p.send_line(&format!("/save {}", saved.display())).unwrap();
    p.exp_string("note: saved").unwrap();
    p.exp_string("> ").unwrap();
    p.send_line("/help").unwrap();
    p.exp_string("/regen").unwrap();
    p.exp_string("> ").unwrap();
    p.send_line("/exit").unwrap();
    p.exp_eof().unwrap();

    // Restart on the session file: nothing is prefilled to resume, and the next turn
    // prefills only its own message.
    let mut p = chat(
        &model,
        &[&args[..], &["--session", session.to_str().unwrap()]].concat(),
        30_000,
    );
    let (_, m) = p
        .exp_regex(r"resumed \d+ messages? from \S+: (\d+) KV tokens? restored, 0 prefilled")
        .unwrap();
    let restored = regex_lite(m.rsplit(": ").next().unwrap())[0];
    assert!(restored > 0);
    p.exp_string("> ").unwrap();
    let t = turn(&mut p, "And one more.");
    assert!(t.prefilled < 60, "resumed turn prefilled {}", t.prefilled);
    p.send_line("/load /nonexistent/file.session").unwrap();
    p.exp_string("the chat is unchanged").unwrap();
    p.exp_string("> ").unwrap();
    p.send_line(&format!("/load {}", saved.display())).unwrap();
    p.exp_string("0 prefilled").unwrap();
    p.exp_string("> ").unwrap();
    p.send_line("/quit").unwrap();
    p.exp_eof().unwrap();
}

/// Gives the REPL time to read the line and start the reply, so a Ctrl-C sent next lands
/// inside the reply (at the prompt it would exit). The slow model keeps the reply going for
/// many seconds, so a generous pause cannot overshoot it.
fn wait_for_reply(_p: &mut PtySession) {
    std::thread::sleep(std::time::Duration::from_millis(1000));
}

#[test]
fn ctrl_c_stops_the_reply_and_keeps_the_chat() {
    let model = slow_model();
    // Unlimited reply with the end-of-generation tokens (<|endoftext|> 293, <|im_end|> 295
    // in the built-in vocabulary) banned: only Ctrl-C (or the full context) ends it.
    let mut p = chat(
        &model,
        &[
            "-n", "-1", "--n-ctx", "4096", "-l", "293-inf", "-l", "295-inf",
        ],
        60_000,
    );
    p.exp_string("> ").unwrap();
    p.send_line("Talk forever.").unwrap();
    wait_for_reply(&mut p);
    p.send_control('c').unwrap();
    let (_, m) = p.exp_regex(STATS).unwrap();
    assert!(m.contains("(interrupted)"), "{m}");
    let kv = regex_lite(&m)[4];
    assert!(kv < 4000, "stopped at KV {kv}");
    // Issue 18, defect 3: the interrupted reply reports its real rate (it read 0.0 tok/s).
    let rate: f64 = m
        .split(", ")
        .find_map(|part| part.strip_suffix(" tok/s"))
        .unwrap()
        .parse()
        .unwrap();
    assert!(rate > 0.0, "{m}");
    p.exp_string("> ").unwrap();
    // The chat goes on after the interrupted reply.
    p.send_line("Still there?").unwrap();
    wait_for_reply(&mut p);
    p.send_control('c').unwrap();
    p.exp_string("(interrupted)").unwrap();
    p.exp_string("> ").unwrap();
    p.send_line("/exit").unwrap();
    p.exp_eof().unwrap();
}

#[test]
fn the_prompt_is_coloured_on_a_terminal() {
    let model = tiny_model();
    let mut p = chat(&model, &["-n", "2"], 30_000);
    p.exp_string("\x1b[1;32m> \x1b[0m").unwrap();
    p.send_control('c').unwrap();
    p.exp_eof().unwrap();
}

/// The same walk on the demo model, kept short (the CPU path may be slow).
#[test]
fn demo_model_two_turns_and_resume() {
    let Some(model) = models::qwen() else { return };
    let session = tmp("demo.session");
    let _ = std::fs::remove_file(&session);
    let args = [
        "-n",
        "12",
        "--n-ctx",
        "512",
        "--color",
        "never",
        "--session",
        session.to_str().unwrap(),
    ];
    let mut p = chat(&model, &args, 300_000);
    p.exp_string("> ").unwrap();
    let t1 = turn(&mut p, "What is 2+2? Answer with one number.");
    assert!(t1.before.contains('4'), "{}", t1.before);
    let t2 = turn(&mut p, "And 3+3?");
    assert!(t2.prompt < 30, "turn 2 prompt {}", t2.prompt);
    p.send_line("/exit").unwrap();
    p.exp_eof().unwrap();
    let mut p = chat(&model, &args, 300_000);
    p.exp_string("0 prefilled").unwrap();
    p.exp_string("> ").unwrap();
    let t3 = turn(&mut p, "And 4+4?");
    assert!(t3.prompt < 30, "turn 3 prompt {}", t3.prompt);
    assert!(t3.kv > t2.kv);
    p.send_line("/exit").unwrap();
    p.exp_eof().unwrap();
}

/// Piped (no terminal): `--single-turn` answers the first message and exits; `--multiline`
/// reads a message up to an empty line.
#[test]
fn single_turn_and_multiline_from_a_pipe() {
    use std::io::Write;
    let model = tiny_model();
    let run = |args: &[&str], input: &str| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_minfer"))
            .arg("chat")
            .arg("-m")
            .arg(&model)
            .args(["--temp", "0", "-t", "1", "-n", "4"])
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = run(&["--single-turn"], "first\nsecond\n");
    assert_eq!(err.matches("[prefilled").count(), 1, "{err}");
    let err = run(&["--multiline"], "line one\nline two\n\nnext message\n");
    assert_eq!(err.matches("[prefilled").count(), 2, "{err}");
}
