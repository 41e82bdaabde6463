//! `minfer render` end to end: the binary reproduces HF's renderings of the chat fixtures
//! with the real models' templates, and falls back to ChatML with a notice on stderr.

use minfer_gguf::{GgufWriter, Value};
use minfer_testkit::models;
use serde_json::Value as Json;
use std::path::{Path, PathBuf};
use std::process::Command;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tokenizer/tests/fixtures/chat")
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("minfer-render-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn render_matches_hf_fixtures() {
    let dir = scratch("fixtures");
    let mut checked = 0;
    for (key, gguf) in [("qwen", models::QWEN), ("smol", models::SMOL)] {
        let Some(model) = models::find(gguf) else {
            continue;
        };
        let text =
            std::fs::read_to_string(fixtures().join(format!("{key}-templates.jsonl"))).unwrap();
        for line in text.lines() {
            let case: Json = serde_json::from_str(line).unwrap();
            let msgs = dir.join("messages.json");
            std::fs::write(&msgs, case["messages"].to_string()).unwrap();
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_minfer"));
            cmd.arg("render").arg("-m").arg(&model).arg(&msgs);
            if !case["tools"].is_null() {
                let tools = dir.join("tools.json");
                std::fs::write(&tools, case["tools"].to_string()).unwrap();
                cmd.arg("--tools").arg(&tools);
            }
            if case["add_generation_prompt"] == Json::Bool(true) {
                cmd.arg("--add-generation-prompt");
            }
            let out = cmd.output().unwrap();
            let name = case["name"].as_str().unwrap();
            assert!(
                out.status.success(),
                "{name}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(
                String::from_utf8(out.stdout).unwrap(),
                case["rendered"].as_str().unwrap(),
                "{key}/{name}"
            );
            checked += 1;
        }
    }
    println!("{checked} cases");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn render_without_template_uses_chatml_with_notice() {
    let dir = scratch("chatml");
    let model = dir.join("no-template.gguf");
    let mut w = GgufWriter::new();
    w.set("general.architecture", Value::String("llama".into()));
    w.write_to(&model).unwrap();
    let msgs = dir.join("m.json");
    std::fs::write(
        &msgs,
        r#"{"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]}"#,
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_minfer"))
        .args(["render", "--add-generation-prompt", "-m"])
        .arg(&model)
        .arg(&msgs)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    );
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("ChatML"), "{stderr}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn render_refuses_a_broken_template() {
    let dir = scratch("broken");
    let model = dir.join("broken.gguf");
    let mut w = GgufWriter::new();
    w.set(
        "tokenizer.chat_template",
        Value::String("{% for m in messages %}\n{{ m.content | nosuch }}\n{% endfor %}".into()),
    );
    w.write_to(&model).unwrap();
    let msgs = dir.join("m.json");
    std::fs::write(&msgs, r#"[{"role": "user", "content": "U"}]"#).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_minfer"))
        .args(["render", "-m"])
        .arg(&model)
        .arg(&msgs)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("nosuch") && stderr.contains("template line 2"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).ok();
}
