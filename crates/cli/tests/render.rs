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

/// A model with only a ChatML template, and `messages` written as the JSON text given.
fn render_messages(name: &str, messages: &str) -> std::process::Output {
    let dir = scratch(name);
    let model = dir.join("chatml.gguf");
    let mut w = GgufWriter::new();
    w.set(
        "tokenizer.chat_template",
        Value::String(
            "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                .into(),
        ),
    );
    w.write_to(&model).unwrap();
    let msgs = dir.join("m.json");
    std::fs::write(&msgs, messages).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_minfer"))
        .args(["render", "-m"])
        .arg(&model)
        .arg(&msgs)
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).ok();
    out
}

/// Issue 18, defect 10: OpenAI text-part content renders as its joined text, the same bytes
/// as the plain string (as `minfer serve` joins parts).
#[test]
fn render_accepts_openai_text_parts() {
    let parts = render_messages(
        "parts",
        r#"[{"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": " there"}]}]"#,
    );
    assert!(
        parts.status.success(),
        "{}",
        String::from_utf8_lossy(&parts.stderr)
    );
    let plain = render_messages("plain", r#"[{"role": "user", "content": "Hi there"}]"#);
    assert!(plain.status.success());
    assert_eq!(parts.stdout, plain.stdout);
    assert_eq!(
        String::from_utf8(parts.stdout).unwrap(),
        "<|im_start|>user\nHi there<|im_end|>\n"
    );
}

/// Issue 18, defect 10: an unknown role, a missing content, an empty part list and a
/// non-text part are refused by message index and name, before the template runs (so no
/// raw template error); an assistant message that only calls tools may lack content.
#[test]
fn render_refuses_unknown_roles_and_missing_content_by_name() {
    for (name, messages, needles) in [
        (
            "role",
            r#"[{"role": "wizard", "content": "Hi"}]"#,
            &["messages[0].role", "\"wizard\""][..],
        ),
        (
            "missing",
            r#"[{"role": "system", "content": "S"}, {"role": "user"}]"#,
            &["messages[1] (user) has no content"][..],
        ),
        (
            "empty",
            r#"[{"role": "user", "content": []}]"#,
            &["messages[0] (user) has no content", "empty list"][..],
        ),
        (
            "image",
            r#"[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]"#,
            &["messages[0].content[0]", "image_url"][..],
        ),
    ] {
        let out = render_messages(name, messages);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name}: accepted");
        assert!(!err.contains("template"), "{name}: {err}");
        for n in needles {
            assert!(err.contains(n), "{name}: {n:?} not in {err}");
        }
    }
    let calls = render_messages(
        "calls",
        r#"[{"role": "user", "content": "Hi"}, {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{}"}}]}]"#,
    );
    assert!(
        calls.status.success(),
        "{}",
        String::from_utf8_lossy(&calls.stderr)
    );
}

/// Issue 30, defect 9: `render` checks as `serve` does: an empty message list is refused
/// (it rendered to nothing, exit 0), tools are checked as OpenAI function tools, and tools
/// a template cannot render are refused (they were dropped silently).
#[test]
fn render_refuses_an_empty_list_and_tools_the_template_cannot_render() {
    let out = render_messages("nothing", "[]");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "accepted: {err}");
    assert!(err.contains("empty"), "{err}");
    assert!(out.stdout.is_empty());
    let tool = r#"{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}"#;
    for (name, tools, needle) in [
        ("untemplated", format!("[{tool}]"), "does not render tools"),
        (
            "bad-tool",
            r#"[{"type": "function"}]"#.to_string(),
            "tools[0].function",
        ),
    ] {
        let body =
            format!(r#"{{"messages": [{{"role": "user", "content": "Hi"}}], "tools": {tools}}}"#);
        let out = render_messages(name, &body);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name}: accepted");
        assert!(err.contains(needle), "{name}: {err}");
        assert!(out.stdout.is_empty(), "{name}");
    }
    // No tools (an empty list) is no refusal.
    let out = render_messages(
        "no-tools",
        r#"{"messages": [{"role": "user", "content": "Hi"}], "tools": []}"#,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
