//! Crash-safe writes (issue 34) through the real binary: every writer of a user file
//! (`synth`, `quantize`, `split`, `merge`, `chat --session`, `pull hf:…`) is killed with
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

use minfer_testkit::rng::Rng;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn minfer() -> Command {
    Command::new(env!("CARGO_BIN_EXE_minfer"))
}

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("minfer-crash-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn runs() -> usize {
    std::env::var("MINFER_KILL_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100)
}

fn seed(name: &str) -> u64 {
    let s = std::env::var("MINFER_KILL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!("{name}: MINFER_KILL_SEED={s}");
    s
}

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

fn run_ok(c: impl std::borrow::BorrowMut<Command>) {
    let mut c = c;
    let c = c.borrow_mut();
    let o = c.output().unwrap();
    assert!(o.status.success(), "{c:?}: {o:?}");
}

/// Files under `dir` (recursively) whose name ends with a temporary's suffix (the shared
/// writer's `.partial`; a download's `.part` and its `.part.json` record).
fn temporaries(dir: &Path) -> Vec<PathBuf> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            v.extend(temporaries(&p));
        } else if [".partial", ".part", ".part.json"]
            .iter()
            .any(|t| p.to_string_lossy().ends_with(t))
        {
            v.push(p);
        }
    }
    v
}

/// What one final name may hold after a kill.
struct Expect {
    path: PathBuf,
    /// The states allowed besides the new file: the old bytes, or None for "absent".
    old: Option<Vec<u8>>,
    new: Vec<u8>,
    /// More complete states (a chat saves after every turn: each turn's file is whole).
    also: Vec<Vec<u8>>,
}

/// How the kills landed, so a run can show they hit the write and not only start-up.
#[derive(Default, Debug)]
struct Tally {
    old: usize,
    new: usize,
    other_whole: usize,
    /// Kills that left a temporary: they landed while a file was being written.
    mid_write: usize,
}

/// Restores the old state, runs `cmd`, kills it after a random delay in [0, 1.2 × the
/// uninterrupted run's time], and checks every final name (temporaries are looked for in
/// `dir`, recursively).
fn kill_loop(
    name: &str,
    dir: &Path,
    expects: &[Expect],
    full: Duration,
    mut cmd: impl FnMut() -> Command,
) {
    let mut rng = Rng::splitmix64(seed(name));
    let mut tally = Tally::default();
    let max_us = (full.as_micros() as u64 * 6 / 5).max(1);
    let t0 = Instant::now();
    for run in 0..runs() {
        for e in expects {
            match &e.old {
                Some(b) => std::fs::write(&e.path, b).unwrap(),
                None => {
                    let _ = std::fs::remove_file(&e.path);
                }
            }
        }
        let delay = Duration::from_micros(rng.next_u64() % max_us);
        let mut child = cmd()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(delay);
        // SIGKILL: no destructor, no signal handler runs in the writer.
        let _ = child.kill();
        child.wait().unwrap();
        if !temporaries(dir).is_empty() {
            tally.mid_write += 1;
        }
        for e in expects {
            let got = std::fs::read(&e.path).ok();
            if got.as_deref() == Some(&e.new[..]) {
                tally.new += 1;
            } else if got == e.old {
                tally.old += 1;
            } else if got.as_ref().is_some_and(|g| e.also.contains(g)) {
                tally.other_whole += 1;
            } else {
                let len = got.as_ref().map(|g| g.len());
                let prefix = got.as_ref().is_some_and(|g| e.new.starts_with(g));
                panic!(
                    "{name} run {run} (killed after {delay:?}): {} holds {len:?} bytes, neither \
                     the old file nor the complete new one ({} bytes){}",
                    e.path.display(),
                    e.new.len(),
                    if prefix {
                        ": a prefix of the new file"
                    } else {
                        ""
                    }
                );
            }
        }
    }
    eprintln!(
        "{name}: {} kills in {:.1} s (run {full:?} uninterrupted): {tally:?}",
        runs(),
        t0.elapsed().as_secs_f64()
    );
}

/// Runs `cmd` to completion: its time, and no temporary left in `dir`.
fn reference(dir: &Path, mut cmd: Command) -> Duration {
    let t = Instant::now();
    run_ok(cmd.stdin(Stdio::null()));
    let full = t.elapsed();
    assert_eq!(temporaries(dir), Vec::<PathBuf>::new(), "{cmd:?}");
    full
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
