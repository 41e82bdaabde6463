//! The model drafters through the binary (issue 31): `run --draft MODEL` (and llama.cpp's
//! `-md`) and `--self-draft LAYERS` give plain decoding's greedy tokens; a draft of another
//! vocabulary is refused naming the first difference (control: one of the same vocabulary
//! loads); `serve` starts with `--draft`, `-md` and `--self-draft` and names the drafter
//! (control: no drafter line without one) and refuses what `run` refuses; one drafter at a
//! time; the self-draft's bounds are named. On a device backend (`--backend metal-emu`)
//! `run --self-draft L` gives that backend's plain tokens and `serve --self-draft L` starts,
//! the draft sharing the model's resident weights.

use minfer_models::synth::{synthesize, SynthSpec};
use minfer_models::Arch;
use std::path::PathBuf;
use std::process::{Command, Output};

fn minfer() -> Command {
    Command::new(env!("CARGO_BIN_EXE_minfer"))
}

/// A synthesized model written once per process under `name`.
fn model(name: &str, spec: impl FnOnce() -> SynthSpec) -> PathBuf {
    let d = std::env::temp_dir().join(format!("minfer-draft-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    let p = d.join(name);
    if !p.exists() {
        let tmp = d.join(format!("{name}.{:?}.part", std::thread::current().id()));
        std::fs::write(&tmp, synthesize(&spec()).unwrap().to_bytes()).unwrap();
        std::fs::rename(&tmp, &p).unwrap();
    }
    p
}

fn target() -> PathBuf {
    model("target.gguf", || {
        SynthSpec::new(Arch::Qwen2, 3, 64, 4, 2, 128)
    })
}

fn run(m: &PathBuf, args: &[&str]) -> Output {
    minfer()
        .args(["run", "-t", "1", "--temp", "0", "-n", "24", "--json", "-m"])
        .arg(m)
        .args(args)
        .output()
        .unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn json(out: &Output) -> serde_json::Value {
    assert!(out.status.success(), "{}", stderr(out));
    serde_json::from_slice(&out.stdout).unwrap()
}

const PROMPT: &str = "one two three one two three one two";

#[test]
fn drafted_runs_give_the_plain_tokens() {
    let t = target();
    let t_s = t.to_str().unwrap();
    let other = model("draft.gguf", || {
        let mut s = SynthSpec::new(Arch::Qwen2, 1, 64, 4, 2, 128);
        s.seed = 7;
        s
    });
    let o_s = other.to_str().unwrap();
    let plain = json(&run(&t, &[PROMPT]));
    for flags in [
        &["--draft", t_s, "--draft-p-min", "0"][..],
        &["-md", o_s][..],
        &["--self-draft", "2", "--draft-p-min", "0"][..],
        &["--self-draft=1", "--draft-max", "3", "--draft-min", "2"][..],
    ] {
        let v = json(&run(&t, &[flags, &[PROMPT]].concat()));
        assert_eq!(v["generated_ids"], plain["generated_ids"], "{flags:?}");
        assert!(v["speculative"].is_object(), "{flags:?}: {v}");
    }
    // The target drafting for itself: every draft held.
    let v = json(&run(&t, &["--draft", t_s, "--draft-p-min", "0", PROMPT]));
    let s = &v["speculative"];
    assert!(s["drafted"].as_u64().unwrap() > 0, "{s}");
    assert_eq!(s["drafted"], s["accepted"]);
}

/// `run --backend metal-emu --self-draft L`: the greedy ids of plain decoding on metal-emu,
/// for L = 1 and 2 of 3 blocks. Controls: the drafts ran (a `speculative` object counting
/// them), and the draft's weights were not placed again (the startup line says the draft
/// shares them; the engine gates count the bytes).
#[test]
fn self_drafted_runs_on_a_device_give_the_plain_tokens() {
    let t = target();
    let emu = ["--backend", "metal-emu"];
    let plain = json(&run(&t, &[&emu[..], &[PROMPT]].concat()));
    assert!(plain["speculative"].is_null(), "control: {plain}");
    for l in ["1", "2"] {
        let out = run(
            &t,
            &[&emu[..], &["--self-draft", l, "--draft-p-min", "0", PROMPT]].concat(),
        );
        let v = json(&out);
        assert_eq!(
            v["generated_ids"], plain["generated_ids"],
            "--self-draft {l}"
        );
        let s = &v["speculative"];
        assert!(
            s["drafted"].as_u64().unwrap_or(0) > 0,
            "--self-draft {l}: {v}"
        );
        assert!(
            stderr(&out).contains("shared with the model on metal-emu"),
            "{}",
            stderr(&out)
        );
    }
    // serve starts with it and names the drafter.
    let (err, code) = serve_startup(
        t.to_str().unwrap(),
        &["--backend", "metal-emu", "--self-draft", "2"],
    );
    assert_eq!(code, None, "did not start: {err}");
    assert!(
        err.contains("drafter: self-draft, the first 2 blocks"),
        "{err}"
    );
}

#[test]
fn a_draft_of_another_vocabulary_is_refused_by_its_first_difference() {
    let t = target();
    let big = model("big-vocab.gguf", || {
        let mut s = SynthSpec::new(Arch::Qwen2, 1, 64, 4, 2, 128);
        s.vocab_size = Some(1000);
        s
    });
    let out = run(&t, &["--draft", big.to_str().unwrap(), PROMPT]);
    let err = stderr(&out);
    assert!(!out.status.success());
    assert!(
        err.contains("its vocabulary is not the model's") && err.contains("1000 (draft)"),
        "{err}"
    );
    // Control: a llama-architecture draft of the same built-in vocabulary loads.
    let same = model("llama-draft.gguf", || {
        SynthSpec::new(Arch::Llama, 1, 64, 4, 2, 128)
    });
    json(&run(&t, &["--draft", same.to_str().unwrap(), PROMPT]));
}

#[test]
fn flag_combinations_and_bounds_are_refused_by_name() {
    let t = target();
    let t_s = t.to_str().unwrap();
    for (flags, code, name) in [
        (
            &["--lookup", "--self-draft", "1"][..],
            2,
            "--lookup and --self-draft",
        ),
        (
            &["--draft", t_s, "--self-draft", "1"][..],
            2,
            "--draft and --self-draft",
        ),
        (&["--draft-backend", "cpu"][..], 2, "--draft-backend"),
        (
            &["--self-draft", "1", "--draft-p-min", "2"][..],
            2,
            "--draft-p-min",
        ),
        (
            &["--self-draft", "1", "--draft-min", "9"][..],
            2,
            "--draft-min",
        ),
        (&["--self-draft", "0"][..], 1, "must be 1 to 2"),
        (&["--self-draft", "3"][..], 1, "must be 1 to 2"),
    ] {
        let out = run(&t, &[flags, &[PROMPT]].concat());
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(code), "{flags:?}: {err}");
        assert!(err.contains(name), "{flags:?}: {err}");
    }
    // Control: the edge is accepted.
    json(&run(&t, &["--self-draft", "2", PROMPT]));
}

/// `serve -m t FLAGS` on a free port: its stderr up to the "listening on" line (the server
/// is then stopped), or all of it and the exit code when it did not start.
fn serve_startup(t: &str, flags: &[&str]) -> (String, Option<i32>) {
    use std::io::{BufRead, BufReader};
    let mut child = minfer()
        .args([&["serve", "-t", "1", "-m", t, "--port", "0"][..], flags].concat())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut text = String::new();
    for line in BufReader::new(child.stderr.take().unwrap()).lines() {
        let line = line.unwrap();
        text.push_str(&line);
        text.push('\n');
        if line.starts_with("listening on") {
            child.kill().unwrap();
            child.wait().unwrap();
            return (text, None);
        }
    }
    (text, child.wait().unwrap().code())
}

#[test]
fn serve_starts_with_the_model_drafters_and_names_them() {
    let t = target();
    let t_s = t.to_str().unwrap();
    for (flags, name) in [
        (&["--draft", t_s][..], format!("drafter: draft model {t_s}")),
        (&["-md", t_s][..], format!("drafter: draft model {t_s}")),
        (
            &["--self-draft", "1"][..],
            "drafter: self-draft, the first 1 blocks".to_string(),
        ),
    ] {
        let (err, code) = serve_startup(t_s, flags);
        assert_eq!(code, None, "{flags:?} did not start: {err}");
        assert!(err.contains(&name), "{flags:?}: {err}");
    }
    // Control: without a drafter no drafter line.
    let (err, code) = serve_startup(t_s, &[]);
    assert_eq!(code, None, "{err}");
    assert!(!err.contains("drafter:"), "{err}");
    // Refusals as in run: the self-draft's bounds, one drafter at a time.
    for (flags, code, name) in [
        (&["--self-draft", "3"][..], 1, "must be 1 to 2"),
        (
            &["--self-draft", "1", "--lookup"][..],
            2,
            "one drafter at a time",
        ),
        (
            &["--draft", t_s, "--self-draft", "1"][..],
            2,
            "one drafter at a time",
        ),
    ] {
        let (err, got) = serve_startup(t_s, flags);
        assert_eq!(got, Some(code), "{flags:?}: {err}");
        assert!(err.contains(name), "{flags:?}: {err}");
    }
}
