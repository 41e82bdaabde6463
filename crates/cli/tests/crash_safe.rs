//! Crash-safe writes (issue 34) through the real binary: every writer of a user file
//! (`synth`, `quantize`, `convert`, `split`, `merge`, `chat --session`, `pull hf:…`) is killed with
//! SIGKILL at a random moment, `MINFER_KILL_RUNS` times each (default 100; the seed is
//! printed and `MINFER_KILL_SEED` replays it). After every kill each final name holds the
//! old file, nothing (when there was none) or the complete new file, byte for byte the
//! output of an uninterrupted run; an uninterrupted run leaves no temporary behind.
//!
//! Control: making `minfer_gguf::atomic::AtomicFile::create` open the final name instead of
//! `<final>.partial` (and `Staged::commit` skip its rename) makes every model-file case
//! here fail with "a prefix of the new file" within a few runs; the session case fails the
//! same way when `write_atomic` in engine/session.rs writes the final name directly, and
//! the pull case when `part_path` in hub/download.rs returns the final name.
//!
//! A full disk (a 64 MB tmpfs, mounted when the tests run as root; SKIP otherwise) gives an
//! error naming the file and the bytes written, a non-zero exit, the old file intact and
//! no temporary left. Control: leaving out `AtomicFile`'s removal on drop leaves a
//! `.partial` that `a_full_disk_…` reports.

mod kill_harness;

use kill_harness::{kill_loop, minfer, reference, run_ok, tmpdir, Expect};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Synthesizes a model of about 12 MB (F32): big enough that writing it is most of a run.
fn synth_args(out: &Path, seed: u64) -> Command {
    let mut c = minfer();
    c.args(["synth", "--arch", "qwen2", "--layers", "3", "--embd", "256"])
        .args([
            "--heads",
            "4",
            "--kv-heads",
            "2",
            "--ffn",
            "1024",
            "-t",
            "1",
        ])
        .args(["--seed", &seed.to_string(), "-y", "-o"])
        .arg(out);
    c
}

#[test]
fn synth_killed_at_random_leaves_the_old_model_or_the_new_one() {
    let d = tmpdir("synth");
    let out = d.join("m.gguf");
    run_ok(synth_args(&out, 2));
    let old = std::fs::read(&out).unwrap();
    let full = reference(&d, synth_args(&out, 1));
    let new = std::fs::read(&out).unwrap();
    assert_ne!(old, new);
    let e = [Expect {
        path: out.clone(),
        old: Some(old),
        new,
        also: vec![],
    }];
    kill_loop("synth", &d, &e, full, || synth_args(&out, 1));
}

#[test]
fn quantize_killed_at_random_leaves_the_old_file_or_the_new_one() {
    let d = tmpdir("quantize");
    let src = d.join("src.gguf");
    run_ok(synth_args(&src, 1));
    let out = d.join("q.gguf");
    let old = b"an older file under the output's name".to_vec();
    std::fs::write(&out, &old).unwrap();
    let quantize = || {
        let mut c = minfer();
        c.arg("quantize").arg(&src).arg(&out).args(["Q8_0", "-y"]);
        c
    };
    let full = reference(&d, quantize());
    let new = std::fs::read(&out).unwrap();
    let e = [Expect {
        path: out.clone(),
        old: Some(old.clone()),
        new,
        also: vec![],
    }];
    kill_loop("quantize", &d, &e, full, quantize);
}

#[test]
fn merge_killed_at_random_leaves_the_old_file_or_the_new_one() {
    let d = tmpdir("merge");
    let src = d.join("src.gguf");
    run_ok(synth_args(&src, 1));
    let old = b"an older file under the output's name".to_vec();
    // A split set (written once) merged over an old file.
    let prefix = d.join("parts");
    let mut c = minfer();
    c.arg("split")
        .args(["--split-max-tensors", "8"])
        .arg(&src)
        .arg(&prefix);
    run_ok(c);
    let first = d.join("parts-00001-of-00005.gguf");
    assert!(first.exists(), "the split made 5 parts");
    let merged = d.join("merged.gguf");
    std::fs::write(&merged, &old).unwrap();
    let merge = || {
        let mut c = minfer();
        c.arg("merge").arg(&first).arg(&merged).arg("-y");
        c
    };
    let full = reference(&d, merge());
    let new = std::fs::read(&merged).unwrap();
    assert_eq!(
        new,
        std::fs::read(&src).unwrap(),
        "merge gives back the source"
    );
    let e = [Expect {
        path: merged.clone(),
        old: Some(old),
        new,
        also: vec![],
    }];
    kill_loop("merge", &d, &e, full, merge);
}

/// The venv's python with what scripts/make-hf-checkpoint.py imports (as the convert tests
/// find it: `MINFER_PYTHON`, else the venv `scripts/venv` makes), or None.
fn python() -> Option<PathBuf> {
    let p = std::env::var_os("MINFER_PYTHON")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/minfer/venv/bin/python"))
        })
        .filter(|p| p.exists())?;
    Command::new(&p)
        .args(["-c", "import gguf, safetensors, tokenizers, numpy"])
        .status()
        .is_ok_and(|s| s.success())
        .then_some(p)
}

/// A Hugging Face checkpoint (bf16, the demo model's vocabulary: its 151 936 × 64 embedding
/// makes the f32 output about 40 MB, so the write is most of a run) converted over an old file.
#[test]
fn convert_killed_at_random_leaves_the_old_file_or_the_new_one() {
    let (Some(py), Some(vocab)) = (python(), minfer_testkit::models::qwen()) else {
        eprintln!(
            "SKIP: needs the venv (scripts/venv: gguf, safetensors, tokenizers) and the demo model"
        );
        return;
    };
    let d = tmpdir("convert");
    let ck = d.join("ck");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/make-hf-checkpoint.py");
    let st = Command::new(&py)
        .arg(script)
        .arg(&ck)
        .args(["--arch", "qwen2", "--layers", "2", "--vocab-from"])
        .arg(&vocab)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(st.success(), "make-hf-checkpoint.py failed");
    let out = d.join("c.gguf");
    let old = b"an older file under the output's name".to_vec();
    std::fs::write(&out, &old).unwrap();
    let convert = || {
        let mut c = minfer();
        c.arg("convert")
            .arg(&ck)
            .arg(&out)
            .args(["--outtype", "f32", "-y"]);
        c
    };
    let full = reference(&d, convert());
    let new = std::fs::read(&out).unwrap();
    // The kill check compares bytes: a second run must give the same ones.
    std::fs::write(&out, &old).unwrap();
    reference(&d, convert());
    assert!(
        std::fs::read(&out).unwrap() == new,
        "convert is not deterministic"
    );
    let e = [Expect {
        path: out.clone(),
        old: Some(old),
        new,
        also: vec![],
    }];
    kill_loop("convert", &d, &e, full, convert);
}

/// Each part is checked alone: absent or complete. (A kill between two of the final
/// renames can leave some parts of the new set and not others; a part that is present is
/// always whole, which `minfer` then reports as a missing part, not a corrupt one.)
#[test]
fn split_killed_at_random_leaves_no_part_truncated() {
    let d = tmpdir("split");
    let src = d.join("src.gguf");
    run_ok(synth_args(&src, 3));
    let out = d.join("out");
    std::fs::create_dir_all(&out).unwrap();
    let prefix = out.join("p");
    let split = || {
        let mut c = minfer();
        c.arg("split")
            .args(["--split-max-tensors", "8", "-y"])
            .arg(&src)
            .arg(&prefix);
        c
    };
    let full = reference(&out, split());
    let mut e = Vec::new();
    for k in 1..=5 {
        let path = out.join(format!("p-{k:05}-of-00005.gguf"));
        let new = std::fs::read(&path).unwrap();
        e.push(Expect {
            path,
            old: None,
            new,
            also: vec![],
        });
    }
    kill_loop("split", &out, &e, full, split);
}

const QWEN_LIKE: &str = "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

fn chat_model(dir: &Path) -> PathBuf {
    use minfer_models::synth::{synthesize, SynthSpec};
    let p = dir.join("chat.gguf");
    let mut w = synthesize(&SynthSpec::new(
        minfer_models::Arch::Qwen2,
        2,
        64,
        4,
        2,
        128,
    ))
    .unwrap();
    w.set(
        "tokenizer.chat_template",
        minfer_gguf::Value::String(QWEN_LIKE.into()),
    );
    std::fs::write(&p, w.to_bytes()).unwrap();
    p
}

/// A piped chat of `lines` turns saving to `session` (greedy, one thread: the same bytes).
fn chat(model: &Path, session: &Path, lines: &str) -> Command {
    // The input comes from a file so a killed run and a whole one read the same bytes.
    // Not beside the session: that directory may be a full tmpfs whose listing is checked.
    let inputs = std::env::temp_dir().join(format!("minfer-crash-inputs-{}", std::process::id()));
    std::fs::create_dir_all(&inputs).unwrap();
    let tag = session.to_string_lossy().replace('/', "_");
    let input = inputs.join(format!("{tag}-{}", lines.len()));
    std::fs::write(&input, lines).unwrap();
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg("exec \"$0\" chat -m \"$1\" --temp 0 -t 1 -n 4 --session \"$2\" < \"$3\"")
        .arg(env!("CARGO_BIN_EXE_minfer"))
        .arg(model)
        .arg(session)
        .arg(&input);
    c
}

#[test]
fn a_chat_killed_at_random_leaves_a_whole_session_file() {
    let d = tmpdir("session");
    let m = chat_model(&d);
    let s = d.join("s.session");
    run_ok(chat(&m, &s, "one\n"));
    let after_one = std::fs::read(&s).unwrap();
    std::fs::remove_file(&s).unwrap();
    let lines = "one\ntwo\nthree\n";
    let full = reference(&d, chat(&m, &s, lines));
    let new = std::fs::read(&s).unwrap();
    std::fs::remove_file(&s).unwrap();
    // Determinism is what makes "whole" checkable: a second run gives the same bytes.
    run_ok(chat(&m, &s, lines));
    assert_eq!(
        std::fs::read(&s).unwrap(),
        new,
        "the session bytes are reproducible"
    );
    // An existing session is resumed (turns append), so each reference starts afresh.
    std::fs::remove_file(&s).unwrap();
    run_ok(chat(&m, &s, "one\ntwo\n"));
    let after_two = std::fs::read(&s).unwrap();
    let e = [Expect {
        path: s.clone(),
        old: None,
        new,
        also: vec![after_one, after_two],
    }];
    kill_loop("session", &d, &e, full, || chat(&m, &s, lines));
}

struct HubServer(std::process::Child);

impl Drop for HubServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_pull_killed_at_random_leaves_no_truncated_model() {
    if Command::new("python3").arg("--version").output().is_err() {
        eprintln!("SKIP: no python3 for scripts/hf-test-server.py");
        return;
    }
    let d = tmpdir("pull");
    let repo = d.join("root/tester/tiny-GGUF");
    std::fs::create_dir_all(&repo).unwrap();
    run_ok(synth_args(&repo.join("tiny-Q8_0.gguf"), 4));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/hf-test-server.py");
    let mut child = Command::new("python3")
        .arg(script)
        .arg("--root")
        .arg(d.join("root"))
        .args(["--token", "tok"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port: u16 = line.trim().strip_prefix("PORT ").unwrap().parse().unwrap();
    let _server = HubServer(child);
    let models = d.join("models");
    let pull = || {
        let mut c = minfer();
        c.args(["pull", "hf:tester/tiny-GGUF:q8_0"])
            .env("MINFER_MODELS", &models)
            .env("HF_ENDPOINT", format!("http://127.0.0.1:{port}/"))
            .env("HF_TOKEN", "tok");
        c
    };
    let full = reference(&models, pull());
    let dest = models.join("hf/tester/tiny-GGUF/tiny-Q8_0.gguf");
    let new = std::fs::read(&dest).unwrap();
    assert_eq!(new, std::fs::read(repo.join("tiny-Q8_0.gguf")).unwrap());
    let e = [Expect {
        path: dest,
        old: None,
        new,
        also: vec![],
    }];
    // The `.part` a kill leaves is resumed by the next run, by design (hub/download.rs).
    kill_loop("pull", &d, &e, full, pull);
    let _ = std::io::stderr().flush();
}

/// A tmpfs of `size` mounted at `dir`, unmounted on drop (also when a test fails).
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Result<Tmpfs, String> {
        std::fs::create_dir_all(dir).unwrap();
        let o = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output()
            .map_err(|e| e.to_string())?;
        if !o.status.success() {
            return Err(String::from_utf8_lossy(&o.stderr).trim().to_string());
        }
        Ok(Tmpfs(dir.into()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Checks a writer that ran out of space: exit 1, the message names the final file, the
/// cause and the bytes written, and `dir` holds exactly `left` afterwards.
fn assert_full_disk(what: &str, o: &std::process::Output, file: &str, dir: &Path, left: &[&str]) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{what}: {o:?}");
    assert!(
        err.contains(file) && err.contains("No space left on device"),
        "{what}: {err}"
    );
    assert!(err.contains("bytes written to"), "{what}: {err}");
    assert_eq!(listing(dir), left, "{what}: {err}");
}

#[test]
fn a_full_disk_is_a_clear_error_and_leaves_nothing_behind() {
    let d = tmpdir("full");
    let mnt = d.join("mnt");
    let _fs = match Tmpfs::mount(&mnt, "64m") {
        Ok(m) => m,
        Err(e) => {
            eprintln!("SKIP: cannot mount a 64 MB tmpfs ({e}); run as root to test a full disk");
            return;
        }
    };
    // 44 MiB of the 64 taken: the 49.5 MB model runs out part way.
    std::fs::write(mnt.join("filler"), vec![7u8; 44 << 20]).unwrap();
    let old = b"an older file under the output's name".to_vec();

    // synth, with --force past its free-space check, to reach the write itself.
    let o = minfer()
        .args(["synth", "--arch", "qwen2", "--layers", "4", "--embd", "512"])
        .args([
            "--heads",
            "8",
            "--kv-heads",
            "2",
            "--ffn",
            "1536",
            "-t",
            "1",
            "-y",
            "-o",
        ])
        .arg(mnt.join("big.gguf"))
        .output()
        .unwrap();
    assert_full_disk("synth", &o, "big.gguf", &mnt, &["filler"]);
    let err = String::from_utf8_lossy(&o.stderr);
    eprintln!("synth on a full disk said: {}", err.trim());

    // quantize over an old file: the old file stays.
    let src = d.join("src.gguf");
    run_ok(synth_args(&src, 1));
    // 56 MiB taken: the 12 MB outputs below do not fit the 8 left.
    std::fs::write(mnt.join("filler"), vec![7u8; 56 << 20]).unwrap();
    std::fs::write(mnt.join("q.gguf"), &old).unwrap();
    let o = minfer()
        .arg("quantize")
        .arg(&src)
        .arg(mnt.join("q.gguf"))
        .args(["F32", "-y"])
        .output()
        .unwrap();
    assert_full_disk("quantize", &o, "q.gguf", &mnt, &["filler", "q.gguf"]);
    assert_eq!(std::fs::read(mnt.join("q.gguf")).unwrap(), old);

    // merge over an old file.
    let prefix = d.join("parts");
    let mut c = minfer();
    c.arg("split")
        .args(["--split-max-tensors", "8"])
        .arg(&src)
        .arg(&prefix);
    run_ok(c);
    let o = minfer()
        .arg("merge")
        .arg(d.join("parts-00001-of-00005.gguf"))
        .arg(mnt.join("q.gguf"))
        .arg("-y")
        .output()
        .unwrap();
    assert_full_disk("merge", &o, "q.gguf", &mnt, &["filler", "q.gguf"]);
    assert_eq!(std::fs::read(mnt.join("q.gguf")).unwrap(), old);

    // split onto the full disk: no part of the set is left.
    let o = minfer()
        .arg("split")
        .args(["--split-max-tensors", "8"])
        .arg(&src)
        .arg(mnt.join("p"))
        .output()
        .unwrap();
    assert_full_disk("split", &o, "p-0000", &mnt, &["filler", "q.gguf"]);

    // A chat's session save on a full disk is reported each turn and leaves no temporary.
    std::fs::write(mnt.join("filler"), vec![7u8; (64 << 20) - (8 << 10)]).unwrap();
    let m = chat_model(&d);
    let o = chat(&m, &mnt.join("s.session"), "one\ntwo\n")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.matches("cannot save the session").count(), 2, "{err}");
    assert!(
        err.contains("No space left on device") && err.contains("bytes written to"),
        "{err}"
    );
    assert_eq!(listing(&mnt), ["filler", "q.gguf"], "{err}");
}
