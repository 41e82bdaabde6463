//! `minfer tokenize` end to end on the cached Qwen model (SKIP when absent); ids checked
//! against llama.cpp oracle values (tokenizer fixtures: "Hello world" -> [9707, 1879]).

use minfer_testkit::models;
use std::process::Command;

fn minfer(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_minfer"))
        .args(args)
        .output()
        .expect("run minfer")
}

#[test]
fn tokenize_and_decode() {
    let Some(model) = models::qwen() else { return };
    let m = model.to_str().unwrap();
    let out = minfer(&["tokenize", "-m", m, "--json", "Hello world"]);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ids"], serde_json::json!([9707, 1879]));
    assert_eq!(v["pieces"], serde_json::json!(["Hello", " world"]));

    let out = minfer(&[
        "tokenize",
        "-m",
        m,
        "--parse-special",
        "--json",
        "<|im_start|>user",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ids"][0], 151644);

    let text = String::from_utf8(minfer(&["tokenize", "-m", m, "Hello world"]).stdout).unwrap();
    assert_eq!(text, "  9707 -> 'Hello'\n  1879 -> ' world'\n");

    let out = minfer(&["tokenize", "-m", m, "--decode", "[9707, 1879]"]);
    assert_eq!(out.stdout, b"Hello world");

    let out = minfer(&["tokenize", "-m", m, "--decode", "1 999999"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("out of range"));
}
