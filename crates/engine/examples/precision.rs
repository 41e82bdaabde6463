//! Diagnostic (not a test): replays llama.cpp's greedy fixtures and writes, per prompt and
//! step up to the first near-tie, our top-40 log-probabilities as `S step id lp ...` lines
//! into `OUT_DIR/our_<model>_<name>.txt`; `scripts/peer-logprobs/compare.py OUT_DIR/our_`
//! compares them with the fixtures (or with llama.cpp's own lines from `peer-logprobs`).
//!
//! `cargo run --release -p minfer-engine --example precision -- OUT_DIR [f32|f16|q8_0]`
//! Env: `ONLY=qwen-raw` (fixture prefix), `NAME=capital_france` (one prompt), `MAXSTEP=N`,
//! `NUMERICS=llamacpp-x86-avx512` (the CPU arithmetic, default native).

use minfer_engine::{parse_cache_type, Engine, EngineConfig};
use serde_json::Value;
use std::io::Write;
use std::path::PathBuf;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let out_dir = PathBuf::from(&args[1]);
    let ct = parse_cache_type(args.get(2).map(String::as_str).unwrap_or("f16")).unwrap();
    let only = std::env::var("ONLY").ok();
    let max_steps: usize = std::env::var("MAXSTEP")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(usize::MAX);
    let models = PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/minfer/models");
    let fixtures = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    for (model, fixture) in [
        ("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "qwen-raw.jsonl"),
        ("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "qwen-chat.jsonl"),
        ("smollm2-135m-instruct-q4_1.gguf", "smol-raw.jsonl"),
    ] {
        if only.as_deref().is_some_and(|o| !fixture.starts_with(o)) {
            continue;
        }
        let numerics = std::env::var("NUMERICS").map_or(minfer_cpu::Numerics::Native, |n| {
            minfer_cpu::Numerics::parse(&n).expect("NUMERICS value")
        });
        let cfg = EngineConfig {
            n_ctx: 256,
            cache_type: ct,
            numerics,
            ..Default::default()
        };
        let mut e = Engine::load(models.join(model), cfg).expect("load");
        let text = std::fs::read_to_string(fixtures.join(fixture)).unwrap();
        for line in text.lines() {
            let rec: Value = serde_json::from_str(line).unwrap();
            if std::env::var("NAME").is_ok_and(|n| n != rec["name"].as_str().unwrap()) {
                continue;
            }
            let ids = |v: &Value| -> Vec<u32> {
                v.as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_u64().unwrap() as u32)
                    .collect()
            };
            let prompt = ids(&rec["prompt_ids"]);
            let generated = ids(&rec["generated_ids"]);
            let key = format!(
                "{}_{}",
                &rec["model"].as_str().unwrap()[..4],
                rec["name"].as_str().unwrap()
            );
            let mut f = std::fs::File::create(out_dir.join(format!("our_{key}.txt"))).unwrap();
            e.kv_clear();
            let mut logits = e.decode(&prompt, 0, 1).expect("prefill").to_vec();
            for (k, step) in rec["steps"].as_array().unwrap().iter().enumerate() {
                let top = step["top"].as_array().unwrap();
                let p = |i: usize| top[i][1].as_f64().unwrap().exp();
                let m = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
                let z: f64 = logits.iter().map(|&l| (l as f64 - m).exp()).sum();
                let mut idx: Vec<usize> = (0..logits.len()).collect();
                idx.select_nth_unstable_by(40, |a, b| logits[*b].total_cmp(&logits[*a]));
                idx.truncate(40);
                idx.sort_by(|a, b| logits[*b].total_cmp(&logits[*a]));
                write!(f, "S {k}").unwrap();
                for i in idx {
                    write!(f, " {i} {:.9}", logits[i] as f64 - m - z.ln()).unwrap();
                }
                writeln!(f).unwrap();
                if p(0) - p(1) <= 0.05 || k + 1 == generated.len() || k + 1 >= max_steps {
                    break;
                }
                logits = e
                    .decode(&[generated[k]], prompt.len() + k, 1)
                    .expect("decode")
                    .to_vec();
            }
            eprintln!("{key} done");
        }
    }
}
