//! Layer offload's flags (issue 32) on `minfer run` with metal-emu: `-ngl`/`--gpu-layers`
//! /`--n-gpu-layers`, the startup line (exact text), the refusal of a value that is neither
//! a count nor `auto` (before loading), a budget below one block, and a failed memory query.

use minfer_models::synth::{synthesize, SynthSpec};
use minfer_models::Arch;
use std::path::PathBuf;
use std::process::{Command, Output};

fn minfer() -> Command {
    Command::new(env!("CARGO_BIN_EXE_minfer"))
}

/// One 4-block model per process (F32 weights: 145.0 KiB per block, 148.2 KiB outside).
fn tiny() -> PathBuf {
    static MODEL: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    MODEL
        .get_or_init(|| {
            let d = std::env::temp_dir().join(format!("minfer-offload-{}", std::process::id()));
            std::fs::create_dir_all(&d).unwrap();
            let p = d.join("tiny4.gguf");
            let spec = SynthSpec::new(Arch::Qwen2, 4, 64, 4, 2, 128);
            std::fs::write(&p, synthesize(&spec).unwrap().to_bytes()).unwrap();
            p
        })
        .clone()
}

fn run_with(env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut c = minfer();
    c.args(["run", "-t", "1", "-m"]).arg(tiny()).args(args);
    c.args(["-n", "2", "--temp", "0", "--no-template", "hi"]);
    c.env_remove("MINFER_EMU_MEM");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

fn run(args: &[&str]) -> Output {
    run_with(&[], args)
}

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn lines(o: &Output) -> Vec<String> {
    err(o).lines().map(str::to_string).collect()
}

const HALF: &str = "offload: 2 of 4 blocks on metal-emu, 2 on cpu; weights 290.0 KiB on device, \
                    438.2 KiB on host; KV f32 on each block's device";
const ALL: &str = "offload: 4 of 4 blocks on metal-emu, 0 on cpu; weights 728.2 KiB on device, \
                   0 B on host; KV f32 on each block's device";
const HALF_HEAD: &str = "offload: 2 of 4 blocks on metal-emu, 2 on cpu; output head on metal-emu; \
                         weights 364.2 KiB on device, 364.0 KiB on host; KV f32 on each block's \
                         device";
const NONE: &str = "offload: 0 of 4 blocks on metal-emu, 4 on cpu; weights 0 B on device, \
                    728.2 KiB on host; KV f32 on each block's device";

/// `-ngl 2`, `-ngl=2`, `--gpu-layers 2` and `--n-gpu-layers=2` are one flag, and the
/// startup line says the plan; a count past the blocks is clamped (the control: the line
/// changes with the count).
#[test]
fn ngl_spellings_and_the_startup_line() {
    for flag in [
        &["--backend", "metal-emu", "-ngl", "2"][..],
        &["--backend", "metal-emu", "-ngl=2"][..],
        &["--backend", "metal-emu", "--gpu-layers", "2"][..],
        &["--backend", "metal-emu", "--n-gpu-layers=2"][..],
    ] {
        let o = run(flag);
        assert!(o.status.success(), "{flag:?}: {}", err(&o));
        assert_eq!(lines(&o)[0], HALF, "{flag:?}");
    }
    let o = run(&["--backend", "metal-emu", "-ngl", "99"]);
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(lines(&o)[0], ALL);
    let o = run(&["--backend", "metal-emu", "-ngl", "0"]);
    assert_eq!(lines(&o)[0], NONE);
    // --help says a count past the blocks is clamped.
    let h = minfer().args(["run", "--help"]).output().unwrap();
    let h = String::from_utf8_lossy(&h.stdout).into_owned();
    assert!(
        h.contains("--gpu-layers <N|auto>") && h.contains("clamped"),
        "{h}"
    );
}

/// A value neither a number nor `auto` is a usage error naming it, before the model is read
/// (a model path that does not exist is never reached); the control: `auto` and a count on
/// that path fail at loading instead.
#[test]
fn a_bad_count_is_refused_before_loading() {
    for bad in ["lots", "-1", "2.5"] {
        let o = minfer()
            .args([
                "run",
                "-m",
                "/nonexistent/model.gguf",
                "--gpu-layers",
                bad,
                "hi",
            ])
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{bad}: {}", err(&o));
        assert_eq!(
            lines(&o)[0],
            format!(
                "error: invalid value '{bad}' for '--gpu-layers <N|auto>': '{bad}' is neither \
                 a number of blocks nor `auto`"
            )
        );
    }
    let o = minfer()
        .args([
            "run",
            "-m",
            "/nonexistent/model.gguf",
            "--gpu-mem",
            "3Q",
            "hi",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", err(&o));
    assert!(lines(&o)[0].starts_with("error: invalid value '3Q' for '--gpu-mem <SIZE>'"));
    for good in ["auto", "3"] {
        let o = minfer()
            .args([
                "run",
                "-m",
                "/nonexistent/model.gguf",
                "--gpu-layers",
                good,
                "hi",
            ])
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(1), "control {good}: {}", err(&o));
    }
}

/// A budget below one block runs every block on the CPU and says why; the control: a budget
/// of 1G places every block, with no note.
#[test]
fn a_budget_below_one_block_says_why() {
    let o = run(&["--backend", "metal-emu", "--gpu-mem", "1K"]);
    assert!(o.status.success(), "{}", err(&o));
    let l = lines(&o);
    assert_eq!(l[0], NONE);
    assert_eq!(
        l[1],
        "note: offload: a budget of 1.0 KiB (--gpu-mem) holds 0 of 4 blocks: the reserve for \
         activations and the pool takes 49.8 MiB, block 0 needs 1.2 MiB more; every block \
         runs on the CPU"
    );
    let o = run(&["--backend", "metal-emu", "--gpu-mem", "1G"]);
    assert_eq!(lines(&o)[0], ALL);
    assert!(!err(&o).contains("note: offload"), "{}", err(&o));
}

/// Without `--gpu-mem`, the device's free memory is the budget; a failed query is an error
/// with the device's reason and the weights charged (exit 1), never a zero budget. The
/// control: a reported figure places by it.
#[test]
fn a_failed_memory_query_is_an_error() {
    let o = run_with(&[("MINFER_EMU_MEM", "fail")], &["--backend", "metal-emu"]);
    assert_eq!(o.status.code(), Some(1), "{}", err(&o));
    let e = err(&o);
    assert!(
        e.contains(
            "offload: cannot size the plan: metal-emu's free-memory query failed: the emulated \
             device's memory query failed (MINFER_EMU_MEM=fail); the model's blocks would \
             charge 0.7 MiB of weights"
        ),
        "{e}"
    );
    assert!(e.contains("give --gpu-mem SIZE or --gpu-layers N"), "{e}");
    // A count needs no query.
    let o = run_with(
        &[("MINFER_EMU_MEM", "fail")],
        &["--backend", "metal-emu", "-ngl", "2"],
    );
    assert_eq!(lines(&o)[0], HALF);
    let o = run_with(&[("MINFER_EMU_MEM", "1G")], &["--backend", "metal-emu"]);
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(lines(&o)[0], ALL);
    let o = run_with(&[("MINFER_EMU_MEM", "1K")], &["--backend", "metal-emu"]);
    assert_eq!(lines(&o)[0], NONE);
    assert!(err(&o).contains("(metal-emu's free memory)"), "{}", err(&o));
}

/// On the CPU alone the flag has nothing to place and says so; the control: no flag, no note.
#[test]
fn the_flag_on_the_cpu_says_it_has_no_device() {
    let o = run(&["--backend", "cpu", "-ngl", "3"]);
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(
        lines(&o)[0],
        "note: --gpu-layers/--gpu-mem/--offload-head: no device backend holds the model's blocks; every \
         block runs on the cpu"
    );
    let o = run(&["--backend", "cpu"]);
    assert!(!err(&o).contains("offload") && !err(&o).contains("gpu-layers"));
}

/// `--offload-head` puts the final norm and output head on the device beside some blocks
/// (llama.cpp's -ngl 3 holds what `-ngl 2 --offload-head` holds here) and the line says so;
/// control: without it the same count keeps the head on the CPU (the HALF line).
#[test]
fn offload_head_line() {
    let o = run(&["--backend", "metal-emu", "-ngl", "2", "--offload-head"]);
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(lines(&o)[0], HALF_HEAD);
    let o = run(&["--backend", "metal-emu", "-ngl", "0", "--offload-head"]);
    assert!(o.status.success(), "{}", err(&o));
    assert!(
        lines(&o)[0].starts_with(
            "offload: 0 of 4 blocks on metal-emu, 4 on cpu; output head on metal-emu;"
        ),
        "{}",
        err(&o)
    );
    let o = run(&["--backend", "metal-emu", "-ngl", "2"]);
    assert_eq!(lines(&o)[0], HALF);
}
