//! `minfer run` with constrained output (issue 16), through the binary on the demo model:
//! a constrained reply follows its regex and schema, and refusals (two constraints, an
//! empty regex, a refused schema keyword, a malformed grammar) are one `error:` line naming
//! the construct, with no reply text written. SKIPs without the model.

use minfer_testkit::models;
use std::process::{Command, Output};

fn run(args: &[&str]) -> Option<Output> {
    let model = models::qwen()?;
    Some(
        Command::new(env!("CARGO_BIN_EXE_minfer"))
            .arg("run")
            .arg("-m")
            .arg(model)
            .args(args)
            .output()
            .expect("minfer runs"),
    )
}

fn refused(args: &[&str], needle: &str) {
    let Some(out) = run(args) else {
        eprintln!("SKIP: no demo model");
        return;
    };
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} succeeded: {err}");
    assert!(
        out.stdout.is_empty(),
        "{args:?} wrote a reply: {:?}",
        out.stdout
    );
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].contains(needle),
        "{needle:?} not in {:?}",
        lines[0]
    );
}

#[test]
fn refusals_name_the_construct_before_any_token() {
    refused(&["--regex", "", "x"], "regex is empty");
    refused(
        &["--regex", "a", "--json-schema", "{}", "x"],
        "--json-schema and --regex",
    );
    refused(
        &[
            "--json-schema",
            r#"{"type":"object","if":{"type":"object"},"then":{}}"#,
            "x",
        ],
        "\"if\"",
    );
    refused(
        &["--grammar", "root ::= [a-", "x"],
        "unterminated character class",
    );
    refused(&["--grammar", "main ::= \"a\"", "x"], "no `root` rule");
    // Issue 30: one line, the regex's own position (llguidance's Lark wrapper is not shown).
    refused(
        &["--regex", "ab(c", "x"],
        "\"ab(c\" is refused: unclosed group at character 3",
    );
}

#[test]
fn constrained_replies_follow_their_constraint() {
    let Some(out) = run(&[
        "--temp",
        "0.8",
        "-s",
        "5",
        "-n",
        "20",
        "--regex",
        "[0-9]{3}-[a-z]{2}",
        "Anything.",
    ]) else {
        eprintln!("SKIP: no demo model");
        return;
    };
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let text = text.trim_end_matches('\n');
    let b = text.as_bytes();
    assert!(
        b.len() == 6
            && b[..3].iter().all(u8::is_ascii_digit)
            && b[3] == b'-'
            && b[4..].iter().all(u8::is_ascii_lowercase),
        "{text:?}"
    );
    let schema = r#"{"type":"object","properties":{"ok":{"type":"boolean"},"n":{"type":"integer","minimum":3,"maximum":7}},"required":["ok","n"],"additionalProperties":false}"#;
    let out = run(&[
        "--temp",
        "0",
        "-n",
        "40",
        "--json",
        "--json-schema",
        schema,
        "Give JSON.",
    ])
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["finish_reason"], "eos", "{v}");
    let reply: serde_json::Value = serde_json::from_str(v["text"].as_str().unwrap()).unwrap();
    assert!(
        reply["ok"].is_boolean() && (3..=7).contains(&reply["n"].as_i64().unwrap()),
        "{reply}"
    );
    assert!(
        !v["constraint"]["mask_us"].as_array().unwrap().is_empty(),
        "{v}"
    );
}
