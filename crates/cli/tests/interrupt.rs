//! Ctrl-C during `minfer run` (issue 18, defect 3): the reply stops, what was generated is
//! reported (timings on stderr; with --json the object, finish_reason "interrupted") and the
//! exit code is 130. SIGINT is sent to the process as a terminal's Ctrl-C would be.

use minfer_models::synth::{synthesize, SynthSpec};
use minfer_models::Arch;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// A model slow enough (about 15 M parameters) that a reply of a 4096 context lasts many
/// seconds, so a SIGINT sent a moment after generation starts lands inside it.
/// Each test writes its own file (`name`): tests run in parallel.
fn slow_model(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("minfer-interrupt-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    let p = d.join(name);
    let mut spec = SynthSpec::new(Arch::Qwen2, 4, 512, 8, 2, 2048);
    spec.weight_type = minfer_gguf::GgmlType::Q8_0;
    std::fs::write(&p, synthesize(&spec).unwrap().to_bytes()).unwrap();
    p
}

/// Starts an unlimited sampled reply (end-of-generation tokens banned: <|endoftext|> 293,
/// <|im_end|> 295), waits for the random-seed line that `run` prints just before it
/// generates, gives it a moment, sends SIGINT and returns (exit code, stdout, stderr).
fn interrupted_run(name: &str, extra: &[&str]) -> (Option<i32>, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_minfer"))
        .arg("run")
        .arg("-m")
        .arg(slow_model(name))
        .args(["-t", "1", "-n", "-1", "-c", "4096", "--temp", "0.8"])
        .args(["-l", "293-inf", "-l", "295-inf"])
        .args(extra)
        .arg("Talk forever.")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    loop {
        let mut line = String::new();
        assert!(err.read_line(&mut line).unwrap() > 0, "ended early: {seen}");
        seen.push_str(&line);
        if line.starts_with("seed:") {
            break;
        }
    }
    std::thread::sleep(std::time::Duration::from_millis(1500));
    // SAFETY: kill(2) on the pid of a child this test spawned and has not reaped.
    let rc = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    assert_eq!(rc, 0);
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut err, &mut rest).unwrap();
    seen.push_str(&rest);
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        seen,
    )
}

#[test]
fn ctrl_c_during_run_prints_the_timings_and_exits_130() {
    let (code, stdout, stderr) = interrupted_run("text.gguf", &[]);
    assert_eq!(code, Some(130), "{stderr}");
    assert!(!stdout.is_empty(), "nothing was streamed");
    let line = stderr
        .lines()
        .find(|l| l.starts_with("generated:"))
        .unwrap_or_else(|| panic!("no timings: {stderr}"));
    assert!(line.ends_with("(interrupted)"), "{line}");
    let n: usize = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(n > 0 && n < 4000, "{line}");
    assert!(!line.contains(" 0.00 tokens/s"), "{line}");
}

#[test]
fn ctrl_c_during_run_json_prints_the_object_and_exits_130() {
    let (code, stdout, stderr) = interrupted_run("json.gguf", &["--json"]);
    assert_eq!(code, Some(130), "{stderr}");
    let v: serde_json::Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("{e}: stdout {stdout:?}, stderr {stderr}"));
    assert_eq!(v["finish_reason"], "interrupted");
    let n = v["generated_ids"].as_array().unwrap().len();
    assert!(n > 0, "{v}");
    assert_eq!(v["timings"]["generated_tokens"], n);
    assert!(v["timings"]["generated_tokens_per_s"].as_f64().unwrap() > 0.0);
    assert!(stderr.contains("generated:"), "{stderr}");
}
