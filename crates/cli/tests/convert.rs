//! `minfer convert` then `minfer run` through the binary (issue 17): a checkpoint made by
//! scripts/make-hf-checkpoint.py, converted to f32, generates greedily the ids the numpy
//! Hugging Face forward generated. The byte-level gates against the `gguf`-package oracle
//! are in crates/convert/tests/convert.rs. SKIP without the venv or the demo model.

use minfer_testkit::models;
use std::path::{Path, PathBuf};
use std::process::Command;

fn python() -> Option<PathBuf> {
    let p = std::env::var_os("MINFER_PYTHON")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/minfer/venv/bin/python"))
        })
        .filter(|p| p.exists())?;
    Command::new(&p)
        .args(["-c", "import gguf, safetensors, tokenizers, numpy"])
        .status()
        .is_ok_and(|s| s.success())
        .then_some(p)
}

#[test]
fn a_converted_checkpoint_runs_greedy_as_its_source() {
    let (Some(py), Some(vocab)) = (python(), models::qwen()) else {
        eprintln!("SKIP: needs the venv (gguf, safetensors, tokenizers) and the demo model");
        return;
    };
    let dir = std::env::temp_dir().join(format!("minfer-cli-convert-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let ck = dir.join("tiny-qwen2");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/make-hf-checkpoint.py");
    let st = Command::new(&py)
        .arg(script)
        .arg(&ck)
        .args(["--arch", "qwen2", "--layers", "1", "--vocab-from"])
        .arg(&vocab)
        .status()
        .unwrap();
    assert!(st.success());
    let out = dir.join("tiny.gguf");
    let o = Command::new(env!("CARGO_BIN_EXE_minfer"))
        .arg("convert")
        .arg(&ck)
        .arg(&out)
        .args(["--outtype", "f32"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    // Converting again onto the same file is refused: nothing is overwritten.
    let again = Command::new(env!("CARGO_BIN_EXE_minfer"))
        .arg("convert")
        .arg(&ck)
        .arg(&out)
        .output()
        .unwrap();
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("already exists"));
    let r: serde_json::Value =
        serde_json::from_slice(&std::fs::read(ck.join("reference.json")).unwrap()).unwrap();
    let want: Vec<u64> = r["greedy"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    let o = Command::new(env!("CARGO_BIN_EXE_minfer"))
        .args(["run", "-m"])
        .arg(&out)
        .args(["--temp", "0", "--no-template", "--json", "-n"])
        .arg(want.len().to_string())
        .arg(r["prompt"].as_str().unwrap())
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let prompt_ids: Vec<u64> = r["prompt_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    let got_prompt: Vec<u64> = j["prompt_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(got_prompt, prompt_ids, "tokenization of the prompt");
    let got: Vec<u64> = j["generated_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(got, want);
    let _ = std::fs::remove_dir_all(&dir);
}
