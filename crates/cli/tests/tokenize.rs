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

    // Issue 30: without -m, the demo model, as every command (this is it: the same ids).
    let out = minfer(&["tokenize", "--json", "Hello world"]);
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ids"], serde_json::json!([9707, 1879]));
    let msgs = std::env::temp_dir().join(format!("minfer-tokenize-msgs-{}", std::process::id()));
    std::fs::write(&msgs, r#"[{"role": "user", "content": "hi"}]"#).unwrap();
    let msgs = msgs.to_str().unwrap();
    let out = minfer(&["render", msgs]);
    assert!(out.status.success(), "{out:?}");
    let named = minfer(&["render", "-m", m, msgs]);
    assert!(String::from_utf8_lossy(&named.stdout).contains("<|im_start|>user\nhi"));
    assert_eq!(out.stdout, named.stdout);
}

/// Issue 30: a piece holding a newline or a tab is printed escaped, one token a line (the
/// JSON keeps the raw text).
#[test]
fn pieces_with_control_characters_print_escaped() {
    use minfer_models::synth::{synthesize, SynthSpec};
    let d = std::env::temp_dir().join(format!("minfer-tokenize-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    let p = d.join("tiny.gguf");
    let spec = SynthSpec::new(minfer_models::Arch::Qwen2, 1, 64, 4, 2, 128);
    std::fs::write(&p, synthesize(&spec).unwrap().to_bytes()).unwrap();
    let m = p.to_str().unwrap();
    let out = minfer(&["tokenize", "-m", m, "a\nb\tc\\"]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("'\\n'") && text.contains("'\\t'"), "{text}");
    assert!(text.contains("'\\\\'"), "{text}");
    assert_eq!(text.lines().count(), 6, "{text}");
    let out = minfer(&["tokenize", "-m", m, "--json", "a\n"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["pieces"][1], "\n");
}
