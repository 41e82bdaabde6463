//! `minfer pull` and `minfer synth` end to end through the binary.

use minfer_testkit::models;
use std::process::Command;

fn minfer() -> Command {
    Command::new(env!("CARGO_BIN_EXE_minfer"))
}

#[test]
fn pull_of_cached_models_is_a_no_op() {
    let Some(dir) = models::dir() else {
        eprintln!("SKIP: no models directory");
        return;
    };
    for (name, file) in models::KNOWN {
        if models::find(file).is_none() {
            continue;
        }
        // A Python that does not exist: any download attempt would fail loudly.
        let out = minfer()
            .args(["pull", name])
            .env("MINFER_MODELS", &dir)
            .env("MINFER_PYTHON", "/nonexistent/python")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{name}: {out:?}");
        assert!(stdout.contains("already present"), "{name}: {stdout}");
    }
    let out = minfer()
        .args(["pull", "--list"])
        .env("MINFER_MODELS", &dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("qwen2.5-coder-0.5b") && stdout.contains("(default)"),
        "{stdout}"
    );
}

#[test]
fn pull_of_an_unknown_name_fails_naming_the_known_ones() {
    let out = minfer().args(["pull", "gpt-5"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("gpt-5") && err.contains("smollm2-135m"),
        "{err}"
    );
}

#[test]
fn synth_writes_a_model_inspect_can_read() {
    let dir = std::env::temp_dir().join(format!("minfer-cli-synth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tiny.gguf");
    let out = minfer()
        .args(["synth", "--arch", "qwen3", "--layers", "2", "--embd", "64"])
        .args([
            "--heads",
            "4",
            "--kv-heads",
            "2",
            "--head-dim",
            "32",
            "--ffn",
            "128",
        ])
        .args(["--type", "q8_0", "--seed", "3", "--tied", "-o"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let out = minfer().arg("inspect").arg(&path).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("qwen3.attention.key_length = 32"), "{text}");
    assert!(text.contains("blk.1.attn_k_norm.weight"), "{text}");
    assert!(
        !text
            .lines()
            .any(|l| l.trim_start().starts_with("output.weight")),
        "tied: {text}"
    );
    // A missing shape flag is refused by name.
    let out = minfer()
        .args(["synth", "--arch", "llama", "--layers", "1", "-o"])
        .arg(dir.join("x.gguf"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--embd"));
    std::fs::remove_dir_all(dir).unwrap();
}

/// Issue 18: a models directory that cannot be written says what was being written and
/// that MINFER_MODELS picks another directory (it printed only the path and the OS error).
#[test]
fn an_unwritable_models_directory_names_what_was_written_and_minfer_models() {
    let d = std::env::temp_dir().join(format!("minfer-pull-ro-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    // A regular file where the directory should be: no directory can be made under it,
    // even as root (which permission bits would not stop).
    let file = d.join("not-a-dir");
    std::fs::write(&file, b"x").unwrap();
    let models = file.join("models");
    for args in [
        &["pull", "smollm2"][..],
        &["run", "-m", "smollm2", "hi"][..],
    ] {
        let out = minfer()
            .args(args)
            .env("MINFER_MODELS", &models)
            .env("MINFER_PYTHON", "/nonexistent/python")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(
            err.contains("cannot write the directory") && err.contains("MINFER_MODELS"),
            "{args:?}: {err}"
        );
        assert_eq!(err.matches("(os error").count(), 1, "{err}");
    }
    let help = minfer().args(["run", "--help"]).output().unwrap();
    assert!(String::from_utf8_lossy(&help.stdout).contains("MINFER_MODELS"));
}

/// Issue 18: with stderr not a terminal (a log, CI) the progress bars draw nothing, so a
/// download says what it does in plain lines, one per part. The download itself fails
/// here (a Python that does not exist), after the first part's line.
#[test]
fn a_download_prints_plain_lines_when_stderr_is_not_a_terminal() {
    let d = std::env::temp_dir().join(format!("minfer-pull-lines-{}", std::process::id()));
    let out = minfer()
        .args(["pull", "smollm2"])
        .env("MINFER_MODELS", &d)
        .env("MINFER_PYTHON", "/nonexistent/python")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("pull smollm2-135m: part 1/"), "{err}");
    std::fs::remove_dir_all(&d).ok();
}

/// Issue 30, defect 11: `pull --list --verify` re-hashes every cached model (it ignored
/// --verify): a cached file of the right size and the wrong bytes is named, exit 1.
#[test]
fn pull_list_verify_rehashes_the_cached_models() {
    let dir = std::env::temp_dir().join(format!("minfer-cli-verify-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let m = minfer_hub::KNOWN.iter().min_by_key(|m| m.size).unwrap();
    // Sparse: the right size, zeros for bytes.
    let f = std::fs::File::create(dir.join(m.file)).unwrap();
    f.set_len(m.size).unwrap();
    drop(f);
    let list = |verify: bool| {
        let mut c = minfer();
        c.args(["pull", "--list"]).env("MINFER_MODELS", &dir);
        if verify {
            c.arg("--verify");
        }
        c.output().unwrap()
    };
    let out = list(false);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("cached"));
    let out = list(true);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert!(stdout.contains("SHA-256 MISMATCH"), "{stdout}");
    assert!(stderr.contains(m.name), "{stderr}");
}

/// Issue 30, defect 11: `inspect --array-items 0` shows each array's length and type and
/// no items (it printed `[, …]`).
#[test]
fn inspect_array_items_zero_prints_no_stray_comma() {
    let dir = std::env::temp_dir().join(format!("minfer-cli-inspect0-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tiny.gguf");
    let w = minfer_models::synth::synthesize(&minfer_models::synth::SynthSpec::new(
        minfer_models::Arch::Qwen2,
        1,
        64,
        4,
        2,
        128,
    ))
    .unwrap();
    std::fs::write(&path, w.to_bytes()).unwrap();
    let out = minfer()
        .args(["inspect", "--array-items", "0"])
        .arg(&path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(!text.contains("[, "), "{text}");
    assert!(
        text.contains("tokenizer.ggml.tokens = [") && text.contains("[…]"),
        "{text}"
    );
}
