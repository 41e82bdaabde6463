//! `minfer run --trace FILE` (and `MINFER_TRACE=<path>`) on a model written by `minfer
//! synth`: the reply's forwards land in the file as a `minfer-trace` version 1 document
//! (facts §1.15, docs/TRACE.md), with no KV store among the nodes, the reply itself the
//! untraced one, and each forward's chosen token the one the reply reports; `minfer chat
//! --trace` writes the session's forwards.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn minfer() -> Command {
    Command::new(env!("CARGO_BIN_EXE_minfer"))
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("minfer-trace-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

/// `trace` goes by the flag on metal-emu and by the variable on the CPU, so both ways are
/// exercised.
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
    match trace {
        Some(t) if backend == "cpu" => {
            cmd.env("MINFER_TRACE", t);
        }
        Some(t) => {
            cmd.arg("--trace").arg(t);
        }
        None => {}
    }
    let out = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stderr: {err}");
    String::from_utf8(out.stdout).unwrap()
}

fn synth(model: &Path) {
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
        .arg(model)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Control for the chosen tokens: they are compared with `--json`'s `generated_ids`, which
/// the sampler reports independently of the trace.
#[test]
fn run_writes_a_minfer_trace_document() {
    let model = tmp("tiny.gguf");
    synth(&model);
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
                assert_eq!((&n["nan"], &n["inf"]), (&Value::from(0), &Value::from(0)));
            }
            assert!(p["chosen"]["text"].is_string());
            assert!(nodes.iter().any(|n| n["backend"] == backend));
        }
    }
}

#[test]
fn chosen_tokens_are_the_replys_and_chat_traces_its_session() {
    let model = tmp("tiny-chosen.gguf");
    synth(&model);
    let path = tmp("trace-chosen.json");
    let out = minfer()
        .args(["run", "--temp", "0", "-n", "3", "--no-template", "--json"])
        .arg("-m")
        .arg(&model)
        .arg("--trace")
        .arg(&path)
        .arg("hello world")
        .env_remove("MINFER_TRACE")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reply: Value = serde_json::from_slice(&out.stdout).unwrap();
    let j: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let chosen: Vec<Value> = j["phases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["chosen"]["id"].clone())
        .collect();
    assert_eq!(Value::from(chosen), reply["generated_ids"]);

    let chat = tmp("trace-chat.json");
    let out = minfer()
        .args(["chat", "--single-turn", "--temp", "0", "-n", "3"])
        .arg("-m")
        .arg(&model)
        .arg("--trace")
        .arg(&chat)
        .arg("hello")
        .stdin(std::process::Stdio::null())
        .env_remove("MINFER_TRACE")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: Value = serde_json::from_str(&std::fs::read_to_string(&chat).unwrap()).unwrap();
    let phases = j["phases"].as_array().unwrap();
    // The prompt, two decodes (the third token is sampled from the second's logits) and the
    // reply's closing text.
    let kinds: Vec<&str> = phases.iter().map(|p| p["kind"].as_str().unwrap()).collect();
    assert_eq!(&kinds[..3], ["prefill", "decode", "decode"]);
    // The first choice is the next forward's input, as the trace infers it.
    assert!(phases[0]["chosen"]["id"].is_u64());
}

/// `bench --trace`: one untimed run of each test lands in the file (pp 6: one prefill of 6
/// tokens; tg 3: three one-token forwards), and the timed rows are still printed. Control:
/// --trace with --parallel is refused (exit 2) rather than writing a trace of other runs.
#[test]
fn bench_traces_one_untimed_run_of_each_test() {
    let model = tmp("tiny-bench.gguf");
    synth(&model);
    let path = tmp("trace-bench.json");
    let out = minfer()
        .args(["bench", "-p", "6", "-n", "3", "-r", "2", "-o", "json"])
        .arg("-m")
        .arg(&model)
        .arg("--trace")
        .arg(&path)
        .env_remove("MINFER_TRACE")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("trace: 4 forwards"), "{err}");
    let rows: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(rows.to_string().contains("tg3"), "{rows}");
    let j: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let shape: Vec<u64> = j["phases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["n_tokens"].as_u64().unwrap())
        .collect();
    assert_eq!(shape, [6, 1, 1, 1]);
    assert_eq!(j["phases"][0]["kind"], "prefill");
    for p in j["phases"].as_array().unwrap() {
        assert!(p["nodes"].as_array().unwrap().len() > 20);
        assert!(p["chosen"].is_null(), "bench samples nothing");
    }
    let out = minfer()
        .args(["bench", "--parallel", "2", "-p", "4", "-n", "2"])
        .arg("-m")
        .arg(&model)
        .arg("--trace")
        .arg(tmp("never.json"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// `minfer viz --trace FILE` refuses, before binding a port, a file that is not a trace and
/// model flags it would ignore (exit 2, the message naming the problem). Control: the same
/// flags without the bad parts start a server (`scripts/test-viz-page` runs it).
#[test]
fn viz_trace_refuses_what_it_cannot_replay() {
    let not_trace = tmp("not-a-trace.json");
    std::fs::write(&not_trace, r#"{"format": "something"}"#).unwrap();
    let out = minfer()
        .args(["viz", "--port", "0", "--trace"])
        .arg(&not_trace)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not a minfer trace"), "{err}");
    let out = minfer()
        .args(["viz", "--port", "0", "-m", "some.gguf", "--trace"])
        .arg(&not_trace)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("-m, -c and --backend do not apply"), "{err}");
}

/// The backends time their nodes while armed (the CPU its kernel calls, the emulated Metal
/// device its own wall time) and the trace's `timing` says what each one's times are: a
/// node has `ns` exactly when its backend is named there.
#[test]
fn nodes_carry_their_time_when_their_backend_says_what_it_times() {
    let model = tmp("tiny-ns.gguf");
    synth(&model);
    for backend in ["cpu", "metal-emu"] {
        let path = tmp(&format!("trace-ns-{backend}.json"));
        run(&model, backend, Some(&path));
        let j: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let timing = j["timing"].as_object().unwrap();
        let named: Vec<&str> = timing.keys().map(String::as_str).collect();
        assert!(
            named.contains(&backend),
            "{backend}: timing names {named:?}"
        );
        if backend == "metal-emu" {
            let what = timing["metal-emu"].as_str().unwrap();
            assert!(what.contains("not a GPU clock"), "{what}");
        }
        let mut on_backend = 0;
        for p in j["phases"].as_array().unwrap() {
            for n in p["nodes"].as_array().unwrap() {
                let timed = timing.contains_key(n["backend"].as_str().unwrap());
                assert_eq!(
                    n["ns"].as_u64() > Some(0),
                    timed,
                    "{backend}: {}",
                    n["name"]
                );
                on_backend += usize::from(n["backend"] == backend);
            }
        }
        assert!(on_backend > 20, "{backend} ran the model");
    }
}
