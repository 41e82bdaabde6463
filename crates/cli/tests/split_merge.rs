//! `minfer split` and `minfer merge` through the binary (issue 17): the plan printed as
//! llama-gguf-split prints it, the parts named as it names them, and merge giving back the
//! input's bytes. The byte-level gates against llama-gguf-split are in
//! crates/gguf/tests/split_tool.rs.

use minfer_testkit::models;
use std::process::Command;

fn minfer() -> Command {
    Command::new(env!("CARGO_BIN_EXE_minfer"))
}

#[test]
fn split_then_merge_through_the_cli_restores_the_model() {
    let Some(input) = models::smol() else {
        eprintln!("SKIP: smollm2-135m not cached");
        return;
    };
    let dir = std::env::temp_dir().join(format!("minfer-cli-split-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let prefix = dir.join("smol");
    let out = minfer()
        .args(["split", "--split-max-size", "40M"])
        .arg(&input)
        .arg(&prefix)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        stdout.starts_with("n_split: 3\nsplit 00001: n_tensors = "),
        "{stdout}"
    );
    let first = dir.join("smol-00001-of-00003.gguf");
    assert!(first.exists() && dir.join("smol-00003-of-00003.gguf").exists());
    let merged = dir.join("merged.gguf");
    let out = minfer()
        .arg("merge")
        .arg(&first)
        .arg(&merged)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(std::fs::read(&merged).unwrap() == std::fs::read(&input).unwrap());
    // Refusals are loud: an existing output, both limits at once, a bad size.
    let out = minfer()
        .arg("merge")
        .arg(&first)
        .arg(&merged)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("already exists"));
    let out = minfer()
        .args([
            "split",
            "--split-max-size",
            "1M",
            "--split-max-tensors",
            "3",
        ])
        .arg(&input)
        .arg(dir.join("x"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let out = minfer()
        .args(["split", "--split-max-size", "12X"])
        .arg(&input)
        .arg(dir.join("x"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("K, M or G"));
    let _ = std::fs::remove_dir_all(&dir);
}
