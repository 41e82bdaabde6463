//! Issue 30 (rough edges): long silent work shows progress on a terminal. Driven through a
//! pseudo-terminal, on synthetic models: `run` with a prompt of several batch-size forwards
//! rewrites `prompt: FED/TOTAL tokens` after each and erases it before the reply; `bench`'s
//! default run and `bench --parallel` draw a bar naming the test and its repetition.
//!
//! Controls: the same `run` with stderr a pipe prints no such line (it is for terminals
//! only); a prompt of one forward prints none either. Removing the line (or the bars)
//! fails the terminal cases: each waits for its text and times out.

use minfer_models::synth::{synthesize, SynthSpec};
use minfer_models::Arch;
use rexpect::session::spawn_command;
use std::path::PathBuf;
use std::process::Command;

fn model() -> PathBuf {
    static MODEL: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    MODEL
        .get_or_init(|| {
            let d = std::env::temp_dir().join(format!("minfer-progress-{}", std::process::id()));
            std::fs::create_dir_all(&d).unwrap();
            let p = d.join("tiny.gguf");
            let spec = SynthSpec::new(Arch::Qwen2, 1, 64, 4, 2, 128);
            std::fs::write(&p, synthesize(&spec).unwrap().to_bytes()).unwrap();
            p
        })
        .clone()
}

fn minfer() -> Command {
    Command::new(env!("CARGO_BIN_EXE_minfer"))
}

/// A raw prompt of `n` one-byte words' worth of tokens (more than `n` tokens: each word
/// and its space).
fn long_prompt(n: usize) -> String {
    "a ".repeat(n)
}

fn run_cmd(prompt: &str) -> Command {
    let mut c = minfer();
    c.args([
        "run",
        "-t",
        "1",
        "--no-template",
        "-n",
        "1",
        "--temp",
        "0",
        "-m",
    ])
    .arg(model())
    .args(["--", prompt]);
    c
}

#[test]
fn a_long_prompt_shows_its_prefill_on_a_terminal() {
    let prompt = long_prompt(1200);
    let mut p = spawn_command(run_cmd(&prompt), Some(60_000)).unwrap();
    let (_, first) = p.exp_regex(r"prompt: \d+/\d+ tokens").unwrap();
    let nums: Vec<usize> = first
        .trim_start_matches("prompt: ")
        .trim_end_matches(" tokens")
        .split('/')
        .map(|s| s.parse().unwrap())
        .collect();
    assert_eq!(nums[0], 512, "{first}: one batch-size forward");
    assert!(nums[1] > 1024, "{first}");
    let before = p.exp_string("generated: 1 token").unwrap();
    assert!(
        before.contains(&format!("prompt: 1024/{}", nums[1])),
        "{before}"
    );
    assert!(
        before.contains("\r\x1b[2K"),
        "the line is erased: {before:?}"
    );
    p.exp_eof().unwrap();

    // Control: stderr a pipe, no line; one forward's prompt on a terminal, no line.
    let o = run_cmd(&prompt).output().unwrap();
    assert!(o.status.success());
    assert!(
        !String::from_utf8_lossy(&o.stderr).contains("prompt: 512/"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let mut p = spawn_command(run_cmd(&long_prompt(20)), Some(60_000)).unwrap();
    let before = p.exp_string("generated: 1 token").unwrap();
    assert!(!before.contains("\x1b[2Kprompt: "), "{before:?}");
    p.exp_eof().unwrap();
}

#[test]
fn bench_draws_a_bar_for_each_test_and_for_parallel_runs() {
    let bench = |extra: &[&str]| {
        let mut c = minfer();
        c.args(["bench", "-t", "1", "-r", "2", "-m"])
            .arg(model())
            .args(extra);
        c
    };
    let mut p = spawn_command(bench(&["-p", "64", "-n", "4"]), Some(120_000)).unwrap();
    p.exp_regex(r"pp64 t=1: repetition \d/2").unwrap();
    p.exp_regex(r"tg4 t=1: repetition \d/2").unwrap();
    p.exp_eof().unwrap();
    let mut p = spawn_command(
        bench(&["--parallel", "2", "-p", "64", "-n", "4"]),
        Some(120_000),
    )
    .unwrap();
    p.exp_regex(r"t=1: repetition \d/2").unwrap();
    p.exp_eof().unwrap();
}

/// Issue 30, defect 10, on a terminal: requantizing says so in one summary line (it printed
/// a line per tensor through the progress bar on a terminal; `writers.rs` checks a pipe).
/// Control: a warning per tensor through the bar (`bar.println`, the old code) fails it while
/// the pipe case in `writers.rs` still passes (tried by hand).
#[test]
fn requantizing_on_a_terminal_warns_once() {
    let d = std::env::temp_dir().join(format!("minfer-progress-rq-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    let input = d.join("q8.gguf");
    let mut spec = SynthSpec::new(Arch::Qwen2, 2, 64, 4, 2, 128);
    spec.weight_type = minfer_gguf::GgmlType::Q8_0;
    std::fs::write(&input, synthesize(&spec).unwrap().to_bytes()).unwrap();
    let mut c = minfer();
    c.arg("quantize").arg(&input).arg(d.join("q4.gguf")).args([
        "Q4_0",
        "--allow-requantize",
        "-t",
        "1",
        "-y",
    ]);
    let mut p = spawn_command(c, Some(60_000)).unwrap();
    let all = p.exp_eof().unwrap();
    let warned = all.matches("requantiz").count();
    assert_eq!(warned, 1, "{all:?}");
    assert!(all.contains(" tensors from "), "{all:?}");
    let _ = std::fs::remove_dir_all(&d);
}
