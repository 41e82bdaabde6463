//! `minfer trace-diff` finds a wrong kernel in one command: with the test-only planted bug
//! `MINFER_TEST_PLANT_CPU=rmsnorm-eps@<layer>` (the CPU's RMSNorm of that layer gets a wrong
//! epsilon, crates/cpu/src/plant.rs) a trace of `minfer run` is compared with a plain one,
//! and the first difference must be exactly that layer's first RMSNorm node.
//!
//! Controls: two plain traces agree (the difference comes from the plant, not from run to
//! run noise); planted in layer 0 instead, the node named moves to layer 0 (the layer is
//! found, not assumed); a value that plants nothing is refused (exit 2), not ignored.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn minfer() -> Command {
    Command::new(env!("CARGO_BIN_EXE_minfer"))
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("minfer-plant-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

fn synth(model: &Path) {
    let out = minfer()
        .args(["synth", "--arch", "qwen2", "--layers", "3", "--embd", "64"])
        .args([
            "--heads",
            "4",
            "--kv-heads",
            "2",
            "--ffn",
            "128",
            "--ctx",
            "256",
        ])
        .arg("--output")
        .arg(model)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `minfer run` with the plant `plant` (empty: none), traced to `trace`.
fn traced_run(model: &Path, plant: &str, trace: &Path) -> std::process::Output {
    minfer()
        .args(["run", "--temp", "0", "-n", "3", "--no-template"])
        .arg("-m")
        .arg(model)
        .arg("--trace")
        .arg(trace)
        .arg("hello world")
        .env_remove("MINFER_TRACE")
        .env("MINFER_TEST_PLANT_CPU", plant)
        .output()
        .unwrap()
}

fn diff(a: &Path, b: &Path) -> (i32, Value) {
    let out = minfer()
        .arg("trace-diff")
        .arg(a)
        .arg(b)
        .arg("--json")
        .output()
        .unwrap();
    let v = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    (out.status.code().unwrap(), v)
}

/// The name of the first RmsNorm node of `layer` in the trace's first phase.
fn first_norm(trace: &Path, layer: u32) -> String {
    let j: Value = serde_json::from_str(&std::fs::read_to_string(trace).unwrap()).unwrap();
    let prefix = format!("L{layer}.");
    j["phases"][0]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["op"] == "RmsNorm" && n["name"].as_str().unwrap().starts_with(&prefix))
        .map(|n| n["name"].as_str().unwrap().to_string())
        .expect("a norm in the layer")
}

#[test]
fn trace_diff_names_the_node_of_a_planted_kernel_bug() {
    let model = tmp("plant.gguf");
    synth(&model);
    let plain = tmp("plain.json");
    let again = tmp("plain-again.json");
    for t in [&plain, &again] {
        let out = traced_run(&model, "", t);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let (code, v) = diff(&plain, &again);
    assert_eq!((code, &v["status"]), (0, &Value::from("agree")), "{v}");

    for layer in [1u32, 0] {
        let planted = tmp(&format!("planted-{layer}.json"));
        let out = traced_run(&model, &format!("rmsnorm-eps@{layer}"), &planted);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let (code, v) = diff(&plain, &planted);
        assert_eq!(code, 1, "{v}");
        assert_eq!(v["status"], "differ", "{v}");
        let at = &v["at"];
        assert_eq!(at["op"], "RmsNorm", "{v}");
        assert_eq!(at["layer"], layer, "{v}");
        assert_eq!(at["name"], first_norm(&plain, layer), "{v}");
        assert_eq!(
            (&at["kind"], &at["step"]),
            (&Value::from("prefill"), &Value::from(0))
        );
    }

    let out = traced_run(&model, "silu@1", &tmp("refused.json"));
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("MINFER_TEST_PLANT_CPU=silu@1"), "{err}");
}
