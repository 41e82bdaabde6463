//! Output into a closed pipe (`minfer ... | head -c 5`) is a quiet exit 0 in every
//! subcommand (issue 18, defect 1): no panic (exit 101), no `error: Broken pipe`.

use minfer_gguf::{Array, Value};
use minfer_models::synth::{synthesize, SynthSpec};
use minfer_models::Arch;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("minfer-pipes-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

/// A tiny model, with a metadata array long enough that `inspect --json` prints far more
/// than a pipe buffer holds (so the write after the reader closes must fail).
fn tiny() -> PathBuf {
    // Written once per process, before any test reads it (the tests run in parallel).
    static MODEL: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    MODEL
        .get_or_init(|| {
            let p = tmp("tiny.gguf");
            let mut w = synthesize(&SynthSpec::new(Arch::Qwen2, 1, 64, 4, 2, 128)).unwrap();
            w.set(
                "test.padding",
                Value::Array(Array::String(vec!["x".repeat(100); 4000].into())),
            );
            std::fs::write(&p, w.to_bytes()).unwrap();
            p
        })
        .clone()
}

/// Runs `minfer args` with `input` on stdin, reads 5 bytes of stdout (all that is left if
/// fewer) and closes it, as `| head -c 5` does.
fn into_closed_pipe(args: &[&str], input: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_minfer"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.as_bytes()).unwrap();
    drop(stdin);
    let mut head = [0u8; 5];
    let _ = stdout.read(&mut head);
    drop(stdout);
    child.wait_with_output().unwrap()
}

fn assert_quiet_success(what: &str, out: &Output) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{what}: {err}");
    assert!(
        !err.contains("panicked") && !err.contains("error"),
        "{what}: {err}"
    );
}

#[test]
fn chat_into_a_closed_pipe_exits_0() {
    let m = tiny();
    let m = m.to_str().unwrap();
    // Banning the end-of-generation tokens (<|endoftext|> 293, <|im_end|> 295) keeps the
    // replies writing after the reader has gone.
    let flags = [
        "-m", m, "-n", "64", "-t", "1", "-l", "293-inf", "-l", "295-inf",
    ];
    let out = into_closed_pipe(&[&["chat"][..], &flags].concat(), "Hi\nmore\n");
    assert_quiet_success("chat", &out);
    let out = into_closed_pipe(&[&["run", "--cnv"][..], &flags].concat(), "Hi\nmore\n");
    assert_quiet_success("run --cnv", &out);
    let out = into_closed_pipe(&[&["run"][..], &flags, &["Hi"]].concat(), "");
    assert_quiet_success("run", &out);
}

#[test]
fn inspect_json_into_a_closed_pipe_exits_0() {
    let m = tiny();
    let args = [
        "inspect",
        "--json",
        "--array-items",
        "4000",
        m.to_str().unwrap(),
    ];
    assert_quiet_success("inspect --json", &into_closed_pipe(&args, ""));
    let args = ["inspect", "--array-items", "4000", m.to_str().unwrap()];
    assert_quiet_success("inspect", &into_closed_pipe(&args, ""));
}
