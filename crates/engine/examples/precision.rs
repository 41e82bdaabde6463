//! Diagnostic (not a test): replays llama.cpp's greedy fixtures and writes, per prompt and
//! step up to the first near-tie, our top-40 log-probabilities as `S step id lp ...` lines
//! into `OUT_DIR/our_<model>_<name>.txt`; `scripts/peer-logprobs/compare.py OUT_DIR/our_`
//! compares them with the fixtures (or with llama.cpp's own lines from `peer-logprobs`).
//!
//! `cargo run --release -p minfer-engine --example precision -- OUT_DIR [f32|f16|q8_0]`
//! Env: `ONLY=qwen-raw` (fixture prefix), `NAME=capital_france` (one prompt), `MAXSTEP=N`,
//! `NUMERICS=llamacpp-x86-avx512` (the CPU arithmetic, default native).
//! With `INPUT=in.txt MODEL=file.gguf` it replays a `scripts/peer-logprobs` input instead (lines
//! `P ids` prompt, `G ids` tokens to feed) and writes `OUT_DIR/our_input.txt`.

use minfer_engine::{parse_cache_type, Engine, EngineConfig};
use minfer_testkit::models;
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
    let models = models::dir().expect("a models directory (MINFER_MODELS or HOME)");
    let numerics = std::env::var("NUMERICS").map_or(minfer_cpu::Numerics::Native, |n| {
        minfer_cpu::Numerics::parse(&n).expect("NUMERICS value")
    });
    if let (Ok(input), Ok(model)) = (std::env::var("INPUT"), std::env::var("MODEL")) {
        let cfg = EngineConfig {
            n_ctx: 512,
            cache_type: ct,
            ..Default::default()
        }
        .with_numerics(numerics);
        let mut e = Engine::load(&model, cfg).expect("load");
        let text = std::fs::read_to_string(input).unwrap();
        let ids = |tag: &str| -> Vec<u32> {
            text.lines()
                .find(|l| l.starts_with(tag))
                .map(|l| {
                    l[1..]
                        .split_whitespace()
                        .map(|x| x.parse().unwrap())
                        .collect()
                })
                .unwrap_or_default()
        };
        let (prompt, generated) = (ids("P"), ids("G"));
        let mut f = std::fs::File::create(out_dir.join("our_input.txt")).unwrap();
        let mut logits = e.decode(&prompt, 0, 1).expect("prefill").to_vec();
        for k in 0..generated.len().min(max_steps) {
            write_top40(&mut f, k, &logits);
            if k + 1 < generated.len() {
                logits = e
                    .decode(&[generated[k]], prompt.len() + k, 1)
                    .expect("decode")
                    .to_vec();
            }
        }
        return;
    }
    let fixtures = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    for (model, fixture) in [
        (models::QWEN, "qwen-raw.jsonl"),
        (models::QWEN, "qwen-chat.jsonl"),
        (models::SMOL, "smol-raw.jsonl"),
    ] {
        if only.as_deref().is_some_and(|o| !fixture.starts_with(o)) {
            continue;
        }
        let cfg = EngineConfig {
            n_ctx: 256,
            cache_type: ct,
            ..Default::default()
        }
        .with_numerics(numerics);
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
                write_top40(&mut f, k, &logits);
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

/// One `S step id logprob ...` line: the top 40 of the exact (f64) softmax.
fn write_top40(f: &mut impl Write, k: usize, logits: &[f32]) {
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
}
