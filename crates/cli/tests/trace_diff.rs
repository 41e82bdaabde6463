//! `minfer trace-diff` on traces `minfer run --trace` wrote of a `minfer synth` model: two
//! CPU kernel instruction sets (`MINFER_CPU_ISA=scalar` and the machine's best) agree within
//! the default 1e-3 of each node's scale; the control is the same pair at `--tol 0`, which
//! must fail (the ISAs round differently), so the comparison is not vacuous. A trace with
//! one value changed in one node (the stand-in for a kernel bug: the value a wrong kernel
//! would have written) is reported at that node, with its op, shape and layer; a renamed
//! node is a mismatch; a non-trace file is exit 2.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn minfer() -> Command {
    Command::new(env!("CARGO_BIN_EXE_minfer"))
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("minfer-trace-diff-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

fn ok(o: Output) -> Output {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    o
}

fn trace(model: &Path, isa: &str, path: &Path) {
    ok(minfer()
        .args([
            "run",
            "--temp",
            "0",
            "-n",
            "3",
            "--no-template",
            "--backend",
            "cpu",
        ])
        .arg("-m")
        .arg(model)
        .arg("--trace")
        .arg(path)
        .arg("hello world")
        .env("MINFER_CPU_ISA", isa)
        .env_remove("MINFER_TRACE")
        .output()
        .unwrap());
}

fn diff(a: &Path, b: &Path, extra: &[&str]) -> (i32, Value) {
    let o = minfer()
        .arg("trace-diff")
        .arg(a)
        .arg(b)
        .arg("--json")
        .args(extra)
        .output()
        .unwrap();
    let code = o.status.code().unwrap();
    let v = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
    (code, v)
}

#[test]
fn trace_diff_finds_the_changed_node_and_two_isas_agree() {
    let model = tmp("tiny.gguf");
    ok(minfer()
        .args([
            "synth", "--arch", "qwen2", "--layers", "2", "--embd", "64", "--heads", "4",
        ])
        .args([
            "--kv-heads",
            "2",
            "--ffn",
            "128",
            "--ctx",
            "256",
            "--output",
        ])
        .arg(&model)
        .output()
        .unwrap());
    let (a, b) = (tmp("scalar.json"), tmp("best.json"));
    trace(&model, "scalar", &a);
    trace(&model, "", &b);
    let (code, v) = diff(&a, &b, &[]);
    assert_eq!((code, v["status"].as_str()), (0, Some("agree")), "{v}");
    assert!(v["nodes"].as_u64().unwrap() > 60);
    // Control: no tolerance at all, and the ISAs' rounding shows.
    let (code, v) = diff(&a, &b, &["--tol", "0"]);
    assert_eq!((code, v["status"].as_str()), (1, Some("differ")), "{v}");

    // One value of one mid-graph node moved by 1 % of the node's scale.
    let mut doc: Value = serde_json::from_str(&std::fs::read_to_string(&a).unwrap()).unwrap();
    let target = doc["phases"][1]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .position(|n| n["name"].as_str().unwrap().starts_with("L1.") && n["op"] == "MatMul")
        .expect("a layer-1 matmul");
    let node = &mut doc["phases"][1]["nodes"][target];
    let name = node["name"].as_str().unwrap().to_string();
    let scale = node["max"]
        .as_f64()
        .unwrap()
        .abs()
        .max(node["min"].as_f64().unwrap().abs());
    let x = node["sample"][5].as_f64().unwrap();
    node["sample"][5] = Value::from(x + 0.01 * scale);
    let bad = tmp("bad.json");
    std::fs::write(&bad, doc.to_string()).unwrap();
    let (code, v) = diff(&a, &bad, &[]);
    assert_eq!((code, v["status"].as_str()), (1, Some("differ")), "{v}");
    assert_eq!(v["at"]["name"], name.as_str());
    assert_eq!(
        (v["at"]["kind"].as_str(), v["at"]["step"].as_u64()),
        (Some("decode"), Some(0))
    );
    assert_eq!(v["field"], "sample[5]");
    assert_eq!(v["at"]["op"], "MatMul");
    assert_eq!(v["at"]["layer"], 1);
    assert!(v["at"]["shape"].is_array() && v["at"]["backend_a"] == "cpu");
    // Text form too: the node's name, op and both values.
    let o = minfer()
        .arg("trace-diff")
        .arg(&a)
        .arg(&bad)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text.contains(&name) && text.contains("MatMul") && text.contains("sample[5]"),
        "{text}"
    );

    // A renamed node: the graphs do not correspond.
    doc["phases"][1]["nodes"][target]["name"] = Value::from("renamed");
    std::fs::write(&bad, doc.to_string()).unwrap();
    let (code, v) = diff(&a, &bad, &[]);
    assert_eq!((code, v["status"].as_str()), (1, Some("mismatch")), "{v}");
    assert_eq!(v["at"]["name"], name.as_str());
    // Not a trace: a format error, exit 2.
    let (code, _) = diff(&a, &model, &[]);
    assert_eq!(code, 2);
    std::fs::write(&bad, r#"{"format":"minfer-graph","version":1}"#).unwrap();
    assert_eq!(diff(&a, &bad, &[]).0, 2);
}
