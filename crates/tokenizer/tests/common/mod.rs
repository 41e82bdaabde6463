//! Shared test helpers: locating the real models and reading oracle fixtures.

#![allow(dead_code)]

use minfer_tokenizer::Tokenizer;
use std::path::{Path, PathBuf};

pub const QWEN: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";
pub const SMOL: &str = "smollm2-135m-instruct-q4_1.gguf";

/// `$MINFER_MODELS/name` or `$HOME/.cache/minfer/models/name`, if the file exists.
pub fn model_path(name: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("MINFER_MODELS")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/minfer/models")))?;
    let p = dir.join(name);
    p.is_file().then_some(p)
}

/// The tokenizer of a cached model, or `None` (after printing SKIP) when the model is absent.
pub fn load(name: &str) -> Option<Tokenizer> {
    let Some(path) = model_path(name) else {
        println!("SKIP: model {name} not found (set MINFER_MODELS or run scripts/test)");
        return None;
    };
    let file = minfer_gguf::GgufFile::open(&path).expect("open model");
    Some(Tokenizer::from_metadata(&file.header().metadata).expect("build tokenizer"))
}

pub struct Row {
    pub i: u64,
    pub category: String,
    pub text: String,
    pub ids: Vec<u32>,
    pub ids_parse_special: Option<Vec<u32>>,
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("ids array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// Rows of `tests/fixtures/<name>`.
pub fn fixture(name: &str) -> Vec<Row> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    let text = std::fs::read_to_string(&path).expect("read fixture");
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("json line");
            Row {
                i: v["i"].as_u64().expect("i"),
                category: v["category"].as_str().unwrap_or("").to_string(),
                text: v["text"].as_str().expect("text").to_string(),
                ids: ids(&v["ids"]),
                ids_parse_special: v.get("ids_parse_special").map(ids),
            }
        })
        .collect()
}
