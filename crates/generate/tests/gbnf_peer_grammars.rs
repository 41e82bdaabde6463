//! Issue 16's proof for GBNF: llama.cpp's own `grammars/*.gbnf` (from the peer source)
//! all compile, and replies decoded under each on the demo model (temperature 0 and 0.8)
//! are in the grammar's language by an independent recognizer, scripts/gbnf-recognize.py
//! (its own GBNF reader and an Earley recognizer over code points; no code shared with
//! our translation or llguidance). A reply that ended by end-of-generation must be a whole
//! sentence of the language; one cut by the token limit a viable prefix.
//!
//! Control: fixed strings with known verdicts (accept, prefix, reject) go through the same
//! recognizer, so one that accepted everything would fail the test.
//!
//! SKIPs without the peer source, the demo model or the venv's Python.

use minfer_engine::{Engine, EngineConfig};
use minfer_generate::chat::Pieces;
use minfer_generate::constrain::{ConstraintSpec, Grammars};
use minfer_generate::sampler::SamplerConfig;
use minfer_generate::{generate_batch, FinishReason, GenerateRequest};
use minfer_testkit::models;
use minfer_tokenizer::Tokenizer;
use std::path::{Path, PathBuf};

fn peer_grammars() -> Option<PathBuf> {
    let home = std::env::var_os("HOME")?;
    let d = PathBuf::from(home)
        .join(".cache/minfer/peer/src/llama_cpp_python-0.3.36/vendor/llama.cpp/grammars");
    d.is_dir().then_some(d)
}

fn python() -> Option<PathBuf> {
    std::env::var_os("MINFER_PYTHON")
        .map(PathBuf::from)
        .or_else(|| {
            let home = std::env::var_os("HOME")?;
            Some(PathBuf::from(home).join(".cache/minfer/venv/bin/python"))
        })
        .filter(|p| p.exists())
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "gbnf"))
        .collect();
    v.sort();
    v
}

fn prompt_for(stem: &str) -> &'static str {
    match stem {
        "arithmetic" => "Write two simple arithmetic equations.",
        "c" => "Write a tiny C function.",
        "chess" => "Write the first moves of a chess game.",
        "english" => "Say hello in English.",
        "japanese" => "Say hello in Japanese.",
        "json" | "json_arr" => "Give a small JSON example.",
        "list" => "List three fruits.",
        _ => "Answer briefly.",
    }
}

fn recognize(py: &Path, lines: &str) -> (bool, String) {
    minfer_testkit::script::pipe(py, "gbnf-recognize.py", lines)
}

fn case(g: &Path, text: &str, expect: &str) -> String {
    serde_json::json!({"grammar": g, "text": text, "expect": expect}).to_string() + "\n"
}

#[test]
fn peer_gbnf_grammars_compile_and_replies_are_in_their_language() {
    let (Some(dir), Some(model), Some(py)) = (peer_grammars(), models::qwen(), python()) else {
        eprintln!("SKIP: needs the peer llama.cpp source, the demo model and the venv's Python");
        return;
    };
    let gs = files(&dir);
    assert!(gs.len() >= 8, "{} grammars in {}", gs.len(), dir.display());
    let mut engine = Engine::load(&model, EngineConfig::default()).expect("load");
    let tok = Tokenizer::from_metadata(engine.model().metadata()).expect("tokenizer");
    let grammars = Grammars::new(&tok).expect("token trie");
    let mut jobs = Vec::new();
    for f in &gs {
        let src = std::fs::read_to_string(f).unwrap();
        let g = grammars
            .compile(&ConstraintSpec::Gbnf(src))
            .unwrap_or_else(|e| panic!("{} does not compile: {e}", f.display()));
        eprintln!("{}: compiled in {:.1} ms", f.display(), g.compile_ms());
        let stem = f.file_stem().unwrap().to_str().unwrap();
        let prompt = format!(
            "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n",
            prompt_for(stem)
        );
        for temperature in [0.0f32, 0.8] {
            jobs.push((
                f.clone(),
                (
                    engine.seq_create(),
                    GenerateRequest {
                        prompt: tok.encode(&prompt, true),
                        max_tokens: 40,
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
                ),
            ));
        }
    }
    let reqs: Vec<_> = jobs.iter().map(|(_, r)| r.clone()).collect();
    let outs = generate_batch(&mut engine, &Pieces(&tok), &reqs, |_, _| {}).expect("generate");
    let mut lines = String::new();
    for ((f, _), out) in jobs.iter().zip(outs) {
        let text = String::from_utf8(out.text).expect("UTF-8");
        let expect = if out.finish == FinishReason::Eos {
            "accept"
        } else {
            "prefix"
        };
        eprintln!(
            "{} ({expect}): {text:?}",
            f.file_name().unwrap().to_string_lossy()
        );
        lines.push_str(&case(f, &text, expect));
    }
    // Controls with known verdicts.
    let at = |n: &str| dir.join(n);
    for (g, text, expect) in [
        ("arithmetic.gbnf", "1+2= 3\n", "accept"),
        ("arithmetic.gbnf", "1+", "prefix"),
        ("arithmetic.gbnf", "1+=", "reject"),
        ("json.gbnf", "{\"a\": [1, 2.5, true]}", "accept"),
        ("json.gbnf", "{\"a\" 1}", "reject"),
        ("json_arr.gbnf", "[{\"a\": 1}]", "reject"),
        ("c.gbnf", "int main(){return 0;}", "accept"),
        ("chess.gbnf", "1. e4 e5\n2. Nf3 Nc6\n", "accept"),
        ("chess.gbnf", "1. e9", "reject"),
        ("list.gbnf", "- a\n- b\n", "accept"),
        ("english.gbnf", "Hello, world!", "accept"),
    ] {
        lines.push_str(&case(&at(g), text, expect));
    }
    let (ok, report) = recognize(&py, &lines);
    eprintln!("{report}");
    assert!(ok, "the independent recognizer disagrees:\n{report}");
}
