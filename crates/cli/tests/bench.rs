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
