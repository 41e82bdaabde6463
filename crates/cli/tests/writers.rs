//! The writers of model files (`synth`, `quantize`, `split`, `merge`, `convert`) under one
//! policy (issue 30): the size is said and checked before writing, an existing output is
//! refused unless `--force`/`-y`, an output that is the input is always refused.

use minfer_models::synth::{synthesize, SynthSpec};
use minfer_models::Arch;
use std::path::PathBuf;
use std::process::{Command, Output};

fn minfer() -> Command {
    Command::new(env!("CARGO_BIN_EXE_minfer"))
}

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("minfer-writers-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn tiny_model(dir: &std::path::Path) -> PathBuf {
    let p = dir.join("in.gguf");
    let w = synthesize(&SynthSpec::new(Arch::Qwen2, 1, 64, 4, 2, 128)).unwrap();
    std::fs::write(&p, w.to_bytes()).unwrap();
    p
}

fn err(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn synth_refuses_a_model_larger_than_the_free_space_before_writing() {
    let d = tmpdir("huge");
    let out = d.join("huge.gguf");
    let o = minfer()
        .args([
            "synth", "--arch", "qwen2", "--layers", "100000", "--embd", "100000",
        ])
        .args([
            "--heads",
            "100",
            "--kv-heads",
            "100",
            "--ffn",
            "100000",
            "-o",
        ])
        .arg(&out)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let e = err(&o);
    assert!(e.contains("TB") && e.contains("free"), "{e}");
    assert!(e.contains("--force"), "{e}");
    let left: Vec<_> = std::fs::read_dir(&d).unwrap().collect();
    assert!(left.is_empty(), "nothing is written: {left:?}");
}

#[test]
fn synth_says_the_size_and_refuses_an_existing_output_unless_forced() {
    let d = tmpdir("synth-exists");
    let out = d.join("m.gguf");
    let synth = |extra: &[&str]| {
        minfer()
            .args(["synth", "--arch", "qwen2", "--layers", "1", "--embd", "64"])
            .args(["--heads", "4", "--kv-heads", "2", "--ffn", "128", "-o"])
            .arg(&out)
            .args(extra)
            .output()
            .unwrap()
    };
    let o = synth(&[]);
    assert!(o.status.success(), "{o:?}");
    assert!(err(&o).contains("of weights to"), "{}", err(&o));
    let o = synth(&[]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(
        err(&o).contains("already exists") && err(&o).contains("--force"),
        "{}",
        err(&o)
    );
    let o = synth(&["-y"]);
    assert!(o.status.success(), "{o:?}");
    let o = minfer()
        .args(["synth", "--preset", "0.5b", "-o"])
        .arg(d.join("missing/dir/m.gguf"))
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(
        err(&o).contains("does not exist") && !err(&o).contains(".partial"),
        "{}",
        err(&o)
    );
}

#[test]
fn quantize_refuses_its_own_input_and_an_existing_output_unless_forced() {
    let d = tmpdir("quantize");
    let input = tiny_model(&d);
    let before = std::fs::read(&input).unwrap();
    for force in [&[][..], &["--force"][..]] {
        let o = minfer()
            .arg("quantize")
            .arg(&input)
            .arg(&input)
            .arg("Q8_0")
            .args(force)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(1), "{o:?}");
        assert!(err(&o).contains("is the input"), "{}", err(&o));
    }
    assert_eq!(
        std::fs::read(&input).unwrap(),
        before,
        "the input is untouched"
    );
    let out = d.join("q.gguf");
    std::fs::write(&out, b"keep me").unwrap();
    let q = |extra: &[&str]| {
        minfer()
            .arg("quantize")
            .arg(&input)
            .arg(&out)
            .arg("Q8_0")
            .args(extra)
            .output()
            .unwrap()
    };
    let o = q(&[]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(err(&o).contains("already exists"), "{}", err(&o));
    assert_eq!(std::fs::read(&out).unwrap(), b"keep me");
    let o = q(&["-y"]);
    assert!(o.status.success(), "{o:?}");
    assert_ne!(std::fs::read(&out).unwrap(), b"keep me");
}

#[test]
fn split_and_merge_take_force_and_refuse_the_input() {
    let d = tmpdir("split");
    let input = tiny_model(&d);
    let prefix = d.join("part");
    let split = |extra: &[&str]| {
        minfer()
            .args(["split", "--split-max-tensors", "4"])
            .arg(&input)
            .arg(&prefix)
            .args(extra)
            .output()
            .unwrap()
    };
    assert!(split(&[]).status.success());
    let o = split(&[]);
    assert!(err(&o).contains("--force"), "{}", err(&o));
    assert!(split(&["--force"]).status.success());
    let first = std::fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().contains("part-00001-of"))
        .unwrap();
    let merged = d.join("merged.gguf");
    let merge = |out: &PathBuf, extra: &[&str]| {
        minfer()
            .arg("merge")
            .arg(&first)
            .arg(out)
            .args(extra)
            .output()
            .unwrap()
    };
    assert!(merge(&merged, &[]).status.success());
    let o = merge(&merged, &[]);
    assert!(err(&o).contains("--force"), "{}", err(&o));
    assert!(merge(&merged, &["-y"]).status.success());
    assert_eq!(
        std::fs::read(&merged).unwrap(),
        std::fs::read(&input).unwrap()
    );
    let o = merge(&first, &["--force"]);
    assert!(err(&o).contains("is the input"), "{}", err(&o));
}

/// Issue 30, defect 10: requantizing says so once, in one summary line, whether stderr is a
/// terminal or (here) a pipe; it printed a line per tensor on a terminal and none to a file.
#[test]
fn requantizing_warns_once_with_a_count() {
    let d = tmpdir("requant");
    let input = d.join("q8.gguf");
    let mut spec = SynthSpec::new(Arch::Qwen2, 2, 64, 4, 2, 128);
    spec.weight_type = minfer_gguf::GgmlType::Q8_0;
    std::fs::write(&input, synthesize(&spec).unwrap().to_bytes()).unwrap();
    let o = minfer()
        .arg("quantize")
        .arg(&input)
        .arg(d.join("q4.gguf"))
        .args(["Q4_0", "--allow-requantize", "-t", "1"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let e = err(&o);
    let lines: Vec<&str> = e.lines().filter(|l| l.contains("requantiz")).collect();
    assert_eq!(lines.len(), 1, "{e}");
    assert!(
        lines[0].contains("requantized") && lines[0].to_lowercase().contains("q8_0"),
        "{e}"
    );
    assert!(lines[0].contains(" tensors from "), "{e}");
    assert!(
        !e.contains("tensor(s)"),
        "singular or plural, not both: {e}"
    );
}

/// Issue 30 (rough edges): the names `minfer list` prints are what every command that reads
/// a model takes, `quantize` and `split` included (they took paths only): a file in the
/// models directory by its name, and a known model by its short name when it is cached.
/// Control: the same name as a path relative to the working directory does not exist, so
/// only the models directory's lookup (`args::model_file`) can find it.
#[test]
fn quantize_and_split_take_the_names_list_prints() {
    let d = tmpdir("names");
    let models = d.join("models");
    std::fs::create_dir_all(&models).unwrap();
    let w = synthesize(&SynthSpec::new(Arch::Qwen2, 1, 64, 4, 2, 128)).unwrap();
    std::fs::write(models.join("tiny.gguf"), w.to_bytes()).unwrap();
    assert!(!std::path::Path::new("tiny.gguf").exists());
    let with_models = |args: &[&str]| {
        minfer()
            .args(args)
            .env("MINFER_MODELS", &models)
            .current_dir(&d)
            .output()
            .unwrap()
    };
    let o = with_models(&["list"]);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains(" tiny.gguf"),
        "{o:?}"
    );
    let q = d.join("q8.gguf");
    let o = with_models(&["quantize", "tiny.gguf", q.to_str().unwrap(), "Q8_0"]);
    assert!(o.status.success(), "{}", err(&o));
    assert!(q.is_file());
    let prefix = d.join("parts");
    let o = with_models(&[
        "split",
        "--split-max-tensors",
        "8",
        "tiny.gguf",
        prefix.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", err(&o));
    assert!(d.join("parts-00002-of-00002.gguf").is_file(), "{}", err(&o));

    let Some(smol) = minfer_testkit::models::smol() else {
        return;
    };
    let cache = smol.parent().unwrap();
    let o = minfer()
        .arg("list")
        .env("MINFER_MODELS", cache)
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(listed.contains(" smollm2-135m\n"), "{listed}");
    let o = minfer()
        .args([
            "split",
            "--dry-run",
            "--split-max-tensors",
            "100",
            "smollm2-135m",
        ])
        .arg(d.join("smol"))
        .env("MINFER_MODELS", cache)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", err(&o));
    let q = d.join("smol-q8.gguf");
    let o = minfer()
        .args(["quantize", "smollm2", q.to_str().unwrap(), "Q8_0"])
        .args(["--allow-requantize", "-t", "2"])
        .env("MINFER_MODELS", cache)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", err(&o));
    assert!(q.is_file());
}

/// Issue 30 (no internals in messages): an output in a directory that does not exist is
/// named as such by every writer, never by the hidden `.partial` file it would have written
/// first (synth said "cannot create …/.m.gguf.partial"). Control: the same commands with the
/// directory made succeed (or, for convert's empty checkpoint, fail on the input instead).
#[test]
fn a_missing_output_directory_is_named_by_every_writer() {
    let d = tmpdir("nodir");
    let input = tiny_model(&d);
    let split = minfer()
        .args(["split", "--split-max-tensors", "8"])
        .arg(&input)
        .arg(d.join("p"))
        .output()
        .unwrap();
    assert!(split.status.success(), "{}", err(&split));
    let first = d.join("p-00001-of-00002.gguf");
    let ckpt = d.join("checkpoint");
    std::fs::create_dir_all(&ckpt).unwrap();
    let missing = d.join("missing/dir");
    let i = input.to_str().unwrap();
    let m = missing.to_str().unwrap();
    let commands: Vec<Vec<String>> = vec![
        vec![
            "quantize".into(),
            i.into(),
            format!("{m}/q.gguf"),
            "Q8_0".into(),
        ],
        vec![
            "split".into(),
            "--split-max-tensors".into(),
            "8".into(),
            i.into(),
            format!("{m}/p"),
        ],
        vec![
            "merge".into(),
            first.to_str().unwrap().into(),
            format!("{m}/m.gguf"),
        ],
        vec![
            "convert".into(),
            ckpt.to_str().unwrap().into(),
            format!("{m}/c.gguf"),
        ],
        vec![
            "synth".into(),
            "--preset".into(),
            "0.5b".into(),
            "-o".into(),
            format!("{m}/s.gguf"),
        ],
    ];
    for args in &commands {
        let o = minfer().args(args).output().unwrap();
        let e = err(&o);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {e}");
        assert!(
            e.contains("output directory") && e.contains("does not exist"),
            "{args:?}: {e}"
        );
        assert!(!e.contains(".partial"), "{args:?}: {e}");
    }
    std::fs::create_dir_all(&missing).unwrap();
    for args in &commands[..3] {
        let o = minfer().args(args).output().unwrap();
        assert!(o.status.success(), "control {args:?}: {}", err(&o));
    }
    let o = minfer().args(&commands[3]).output().unwrap();
    assert!(!err(&o).contains("output directory"), "{}", err(&o));
}
