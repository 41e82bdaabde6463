//! `minfer bench` end to end through the binary, on a synthesized tiny model.

use minfer_models::synth::{synthesize, SynthSpec};
use minfer_models::Arch;
use std::path::PathBuf;
use std::process::Command;

fn minfer() -> Command {
    Command::new(env!("CARGO_BIN_EXE_minfer"))
}

fn tiny_model(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("minfer-bench-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    let p = d.join(name);
    let w = synthesize(&SynthSpec::new(Arch::Qwen2, 1, 64, 4, 2, 128)).unwrap();
    std::fs::write(&p, w.to_bytes()).unwrap();
    p
}

#[test]
fn parallel_json_has_one_row_per_n() {
    let p = tiny_model("parallel.gguf");
    let out = minfer()
        .args([
            "bench",
            "--parallel",
            "1,2",
            "-p",
            "8",
            "-n",
            "4",
            "-r",
            "1",
            "-o",
            "json",
        ])
        .args(["-t", "1", "-m"])
        .arg(&p)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v["results"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{v}");
    for (row, n) in rows.iter().zip([1u64, 2]) {
        assert_eq!(row["n_parallel"], n);
        assert_eq!(row["n_prompt"], 8);
        assert_eq!(row["n_gen"], 4);
        assert_eq!(row["n_kv"], n * 12);
        assert_eq!(row["kv_layout"], "slots");
        assert_eq!(row["samples_tg_ns"].as_array().unwrap().len(), 1);
        for key in ["s_pp_ts", "s_tg_ts", "s_ts", "t_pp_s", "t_tg_s", "t_s"] {
            let x = row[key].as_f64().unwrap();
            assert!(x.is_finite() && x > 0.0, "{key} = {x}");
        }
        // S_TG is all N sequences' tokens over the decode time.
        let s_tg = row["s_tg_ts"].as_f64().unwrap();
        let t_tg = row["t_tg_s"].as_f64().unwrap();
        assert!((s_tg * t_tg / (4.0 * n as f64) - 1.0).abs() < 1e-6);
    }
}

#[test]
fn parallel_refuses_depth_and_zero_lengths() {
    let p = tiny_model("refuse.gguf");
    for (flags, needle) in [
        (&["-d", "16"][..], "--n-depth"),
        (&["-n", "0"][..], "at least 1"),
    ] {
        let out = minfer()
            .args(["bench", "--parallel", "2", "-r", "1", "-t", "1", "-m"])
            .arg(&p)
            .args(flags)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(needle), "{err}");
    }
}

/// Issue 18, defect 11: a bandwidth buffer too small to measure memory (it reported
/// 0.00 GB/s) is refused by name, exit 2.
#[test]
fn membw_refuses_buffers_too_small_to_measure() {
    for mib in ["0", "1"] {
        let out = minfer()
            .args(["bench", "--membw", "--membw-mib", mib, "-p", "0", "-n", "0"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains(&format!("--membw-mib {mib}")), "{err}");
        assert!(out.stdout.is_empty());
    }
}

/// The CSV rows carry `n_depth`, as the JSON rows do (llama-bench's column).
#[test]
fn csv_has_the_depth_column() {
    let p = tiny_model("csv.gguf");
    let out = minfer()
        .args([
            "bench", "-p", "8", "-n", "0", "-d", "4", "-r", "1", "-o", "csv",
        ])
        .args(["-t", "1", "-m"])
        .arg(&p)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let row: Vec<&str> = lines.next().unwrap().split(',').collect();
    assert_eq!(header.len(), row.len(), "{text}");
    let at = header.iter().position(|h| *h == "n_depth").expect(&text);
    assert_eq!(row[at], "4", "{text}");
}

/// `MINFER_CPU_ISA` picks the CPU kernels' instruction set (reported as `cpu_kernels`); a name
/// that is no instruction set, or one the machine lacks, is a usage error naming the value.
#[test]
fn cpu_isa_override_is_reported_and_checked() {
    let p = tiny_model("isa.gguf");
    let run = |isa: Option<&str>| {
        let mut c = minfer();
        c.args([
            "bench", "-p", "8", "-n", "4", "-r", "1", "-t", "1", "-o", "json", "-m",
        ])
        .arg(&p);
        match isa {
            Some(v) => c.env("MINFER_CPU_ISA", v),
            None => c.env_remove("MINFER_CPU_ISA"),
        };
        c.output().unwrap()
    };
    let kernels = |out: &std::process::Output| {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["system"]["cpu_kernels"].as_str().unwrap().to_string()
    };
    let best = kernels(&run(None));
    assert_ne!(best, "", "the default names an instruction set");
    // Scalar runs everywhere and is never the best on the machines CI uses; the control that
    // the override took effect.
    assert_eq!(kernels(&run(Some("scalar"))), "scalar");
    for (bad, says) in [
        ("avx9", "not an instruction set"),
        ("neon-avx2", "not an instruction set"),
    ] {
        let out = run(Some(bad));
        assert_eq!(out.status.code(), Some(2), "{bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("MINFER_CPU_ISA={bad}")) && err.contains(says),
            "{err}"
        );
    }
    let missing = if cfg!(target_arch = "x86_64") {
        "neon"
    } else {
        "avx2"
    };
    let out = run(Some(missing));
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("this machine cannot run it"));
}

/// Every instruction set is bit-identical to the scalar reference, so greedy decoding on the
/// real SmolLM2 (Q4_1 weights, Q8_0 output: the side kernels of decode) gives the same text
/// under `MINFER_CPU_ISA=scalar` as with the best kernels of this machine.
#[test]
fn cpu_isa_override_keeps_the_tokens_on_smollm2() {
    let Some(model) = minfer_testkit::models::smol() else {
        println!("SKIP: SmolLM2 not in the model cache");
        return;
    };
    let run = |isa: Option<&str>| {
        let mut c = minfer();
        c.args([
            "run",
            "--temp",
            "0",
            "-n",
            "24",
            "-t",
            "1",
            "--no-template",
            "-m",
        ])
        .arg(&model)
        .arg("The capital of France is");
        match isa {
            Some(v) => c.env("MINFER_CPU_ISA", v),
            None => c.env_remove("MINFER_CPU_ISA"),
        };
        let out = c.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let best = run(None);
    assert!(best.len() > 20, "{best:?}");
    assert_eq!(run(Some("scalar")), best);
}

/// `MINFER_CPU_PACK=0` keeps the weights in plain rows (ADR 0017): the same tokens as the
/// packed default (on AVX-512 VNNI machines with huge pages the two run different kernels;
/// elsewhere both are plain), and a value other than 0 or 1 is a usage error naming it.
#[test]
fn cpu_pack_switch_keeps_the_tokens_and_refuses_other_values() {
    let p = tiny_model("pack.gguf");
    let out = minfer()
        .args(["run", "-n", "1", "-p", "hi", "-m"])
        .arg(&p)
        .env("MINFER_CPU_PACK", "yes")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("MINFER_CPU_PACK=yes"), "{err}");
    let Some(model) = minfer_testkit::models::smol() else {
        println!("SKIP: SmolLM2 not in the model cache");
        return;
    };
    let run = |pack: &str| {
        let out = minfer()
            .args([
                "run",
                "--temp",
                "0",
                "-n",
                "24",
                "-t",
                "2",
                "--no-template",
                "-m",
            ])
            .arg(&model)
            .arg("The capital of France is")
            .env("MINFER_CPU_PACK", pack)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let packed = run("1");
    assert!(packed.len() > 20, "{packed:?}");
    assert_eq!(run("0"), packed);
}

/// Issue 30, defect 2: a depth past the model's context (it ran for minutes, silently) is
/// refused at once, exit 2, naming the flags and the context; the untimed depth prefill
/// reports its progress with `--progress`.
#[test]
fn depth_past_the_context_is_refused_and_the_depth_prefill_shows_progress() {
    let p = tiny_model("depth.gguf");
    let t0 = std::time::Instant::now();
    let out = minfer()
        .args([
            "bench", "-p", "16", "-n", "4", "-d", "100000", "-r", "1", "-t", "1", "-m",
        ])
        .arg(&p)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("-d 100000") && err.contains("4096"), "{err}");
    assert!(t0.elapsed().as_secs() < 30);
    let out = minfer()
        .args([
            "bench",
            "--parallel",
            "2",
            "-p",
            "4000",
            "-n",
            "200",
            "-r",
            "1",
            "-m",
        ])
        .arg(&p)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("4200") && err.contains("4096"), "{err}");
    let out = minfer()
        .args([
            "bench", "-p", "0", "-n", "1", "-d", "600", "-b", "256", "-r", "1",
        ])
        .args(["--no-warmup", "--progress", "-t", "1", "-m"])
        .arg(&p)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("depth prefill 600/600 tokens"), "{err}");
}

/// Issue 30, defect 11: `--cache-type auto` is taken as `run` takes it (resolved in the
/// rows: f32 on the CPU), and without --cache-type the header says bench's f16 default is
/// not run's.
#[test]
fn cache_type_auto_is_taken_and_the_default_is_said() {
    let p = tiny_model("auto.gguf");
    let bench = |extra: &[&str]| {
        let out = minfer()
            .args(["bench", "-p", "8", "-n", "2", "-r", "1", "-t", "1", "-m"])
            .arg(&p)
            .args(extra)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let md = bench(&["--cache-type", "auto"]);
    assert!(md.contains("| f32 |"), "{md}");
    assert!(!md.contains("llama-bench's default"), "{md}");
    let md = bench(&[]);
    assert!(
        md.contains("| f16 |") && md.contains("KV cache: f16, llama-bench's default"),
        "{md}"
    );
    let js = bench(&["--cache-type", "auto", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_str(&js).unwrap();
    assert_eq!(v["results"][0]["type_kv"], "f32", "{v}");
}
