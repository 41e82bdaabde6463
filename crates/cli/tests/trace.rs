//! `MINFER_TRACE=<path> minfer run` on a model written by `minfer synth`: the reply's
//! forwards land in the file as a `minfer-trace` version 1 document (facts §1.15), with no
//! KV store among the nodes, and the reply itself is the untraced one.

use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

fn minfer() -> Command {
    Command::new(env!("CARGO_BIN_EXE_minfer"))
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("minfer-trace-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

fn run(model: &PathBuf, backend: &str, trace: Option<&PathBuf>) -> String {
    let mut cmd = minfer();
    cmd.args([
        "run",
        "--temp",
        "0",
        "-n",
        "3",
        "--no-template",
        "--backend",
        backend,
    ])
    .arg("-m")
    .arg(model)
    .arg("hello world")
    .env_remove("MINFER_TRACE");
    if let Some(t) = trace {
        cmd.env("MINFER_TRACE", t);
    }
    let out = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stderr: {err}");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn run_writes_a_minfer_trace_document() {
    let model = tmp("tiny.gguf");
    let out = minfer()
        .args(["synth", "--arch", "qwen2", "--layers", "2", "--embd", "64"])
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
        .arg(&model)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plain = run(&model, "cpu", None);
    for backend in ["cpu", "metal-emu"] {
        let path = tmp(&format!("trace-{backend}.json"));
        let reply = run(&model, backend, Some(&path));
        if backend == "cpu" {
            assert_eq!(reply, plain, "tracing changes nothing in the reply");
        }
        let j: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(j["format"], "minfer-trace");
        assert_eq!(j["version"], 1);
        assert!(j["model"].is_string());
        assert_eq!(j["backends"].as_array().unwrap().last().unwrap(), backend);
        let phases = j["phases"].as_array().unwrap();
        // The prompt, then one forward per generated token but the last.
        assert_eq!(phases.len(), 3, "{backend}");
        assert_eq!(phases[0]["kind"], "prefill");
        assert_eq!(phases[0]["text"], "hello world");
        for (i, p) in phases.iter().enumerate().skip(1) {
            assert_eq!(p["kind"], "decode");
            assert_eq!(p["step"], i - 1);
            assert_eq!(p["n_tokens"], 1);
        }
        for p in phases {
            assert_eq!(p["top5"].as_array().unwrap().len(), 5);
            let nodes = p["nodes"].as_array().unwrap();
            assert!(nodes.len() > 20);
            for n in nodes {
                assert_ne!(n["op"], "KvStore");
                for k in ["min", "max", "mean", "absmean"] {
                    assert!(n[k].is_number(), "{k} of {}", n["name"]);
                }
                assert_eq!(n["shape"].as_array().unwrap().len(), 2);
                assert!(n["sample"].as_array().unwrap().len() <= 64);
            }
            assert!(nodes.iter().any(|n| n["backend"] == backend));
        }
    }
}
