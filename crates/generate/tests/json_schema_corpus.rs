//! Issue 16's proof for JSON Schema: every schema of the committed corpus
//! (`tests/data/json_schemas`, written by scripts/gen-json-schema-corpus.py) is decoded
//! under its constraint on the demo model at temperature 0 and 0.8, and every reply must
//! end by end-of-generation, parse, and validate under Python's `jsonschema` (an
//! independent validator, formats checked).
//!
//! Control: each reply cut short by one byte is sent too, expected invalid; a validator
//! that checked nothing would pass those and fail the test.
//!
//! Cost: the replies run as batches of 20 sequences through one batch loop, short prompts,
//! at most 160 tokens a reply (the schemas bound their strings and arrays, so replies are
//! short). SKIPs without the model or a Python with jsonschema.

use minfer_engine::{Engine, EngineConfig};
use minfer_generate::chat::Pieces;
use minfer_generate::constrain::{ConstraintSpec, Grammars};
use minfer_generate::sampler::SamplerConfig;
use minfer_generate::{generate_batch, FinishReason, GenerateRequest};
use minfer_testkit::models;
use minfer_tokenizer::Tokenizer;
use std::path::{Path, PathBuf};
use std::process::Command;

const BATCH: usize = 20;
const MAX_TOKENS: usize = 160;

fn python_with_jsonschema() -> Option<PathBuf> {
    let p = std::env::var_os("MINFER_PYTHON")
        .map(PathBuf::from)
        .or_else(|| dirs_venv().filter(|p| p.exists()))?;
    let ok = Command::new(&p)
        .args(["-c", "import jsonschema"])
        .status()
        .is_ok_and(|s| s.success());
    ok.then_some(p)
}

fn dirs_venv() -> Option<PathBuf> {
    let home = std::env::var_os("HOME")?;
    Some(PathBuf::from(home).join(".cache/minfer/venv/bin/python"))
}

fn corpus() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/json_schemas");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("the corpus directory")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    v.sort();
    v
}

#[test]
fn every_corpus_schema_gives_replies_that_validate() {
    let (Some(model), Some(py)) = (models::qwen(), python_with_jsonschema()) else {
        eprintln!("SKIP: needs the demo model and a Python with jsonschema (scripts/venv)");
        return;
    };
    let files = corpus();
    assert!(files.len() >= 60, "the corpus has {} schemas", files.len());
    let mut engine = Engine::load(
        &model,
        EngineConfig {
            n_ctx: 4096,
            ..EngineConfig::default()
        },
    )
    .expect("load the demo model");
    let tok = Tokenizer::from_metadata(engine.model().metadata()).expect("tokenizer");
    let grammars = Grammars::new(&tok).expect("token trie");
    // One request per (schema, temperature).
    let mut jobs: Vec<(PathBuf, f32, GenerateRequest)> = Vec::new();
    for f in &files {
        let schema: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(f).unwrap()).unwrap();
        let title = schema["title"].as_str().unwrap_or("a record").to_string();
        let g = grammars
            .compile(&ConstraintSpec::JsonSchema(schema))
            .unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let prompt = format!(
            "<|im_start|>user\nA short JSON example of: {title}<|im_end|>\n<|im_start|>assistant\n"
        );
        for temperature in [0.0f32, 0.8] {
            jobs.push((
                f.clone(),
                temperature,
                GenerateRequest {
                    prompt: tok.encode(&prompt, true),
                    max_tokens: MAX_TOKENS,
                    sampler: SamplerConfig {
                        temperature,
                        seed: 16,
                        ..SamplerConfig::default()
                    },
                    stop_strings: vec![],
                    eog: tok.eog_ids().to_vec(),
                    logprobs: None,
                    constraint: Some(g.clone()),
                    lookup: None,
                    draft: None,
                },
            ));
        }
    }
    let seqs: Vec<_> = (0..BATCH).map(|_| engine.seq_create()).collect();
    let t0 = std::time::Instant::now();
    let (mut tokens, mut lines, mut unfinished) = (0usize, String::new(), Vec::new());
    let mut mask_us: Vec<f64> = Vec::new();
    for chunk in jobs.chunks(BATCH) {
        let reqs: Vec<_> = chunk
            .iter()
            .zip(&seqs)
            .map(|((_, _, r), &s)| (s, r.clone()))
            .collect();
        let outs = generate_batch(&mut engine, &Pieces(&tok), &reqs, |_, _| {}).expect("generate");
        for s in &seqs {
            engine.seq_clear(*s).expect("clear");
        }
        for ((f, temp, _), out) in chunk.iter().zip(outs) {
            tokens += out.tokens.len();
            mask_us.extend(out.constraint.map(|c| c.mask_us).unwrap_or_default());
            let text = String::from_utf8(out.text).expect("constrained text is UTF-8");
            if out.finish != FinishReason::Eos {
                unfinished.push(format!(
                    "{} @ {temp}: {:?} {text:?}",
                    f.display(),
                    out.finish
                ));
            }
            let schema = f.to_str().unwrap();
            let case = |text: &str, expect: &str| {
                serde_json::json!({"schema": schema, "text": text, "expect": expect}).to_string()
            };
            lines.push_str(&case(&text, "valid"));
            lines.push('\n');
            let cut = &text[..text.len().saturating_sub(1)];
            lines.push_str(&case(cut, "invalid"));
            lines.push('\n');
        }
    }
    mask_us.sort_by(f64::total_cmp);
    let pct = |q: f64| mask_us[((mask_us.len() - 1) as f64 * q) as usize];
    eprintln!(
        "{} replies, {tokens} tokens in {:.1} s; mask p50 {:.0} µs, p99 {:.0} µs",
        jobs.len(),
        t0.elapsed().as_secs_f64(),
        pct(0.5),
        pct(0.99)
    );
    assert!(
        unfinished.is_empty(),
        "replies that did not finish:\n{}",
        unfinished.join("\n")
    );
    let (ok, report) = minfer_testkit::script::pipe(&py, "validate-json-replies.py", &lines);
    eprintln!("{report}");
    assert!(ok, "jsonschema disagrees:\n{report}");
}
