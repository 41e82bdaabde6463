//! THE acceptance gate against llama.cpp on the real demo models (skipped when absent).
//!
//! Fixtures (`tests/fixtures/{qwen,smol}-raw.jsonl`, copied from the shared oracle): llama-server
//! greedy runs with top-5 pre-sampling log-probabilities per step (f16 KV, flash attention),
//! from exactly the given `prompt_ids`. We feed llama.cpp's ids, so one step never poisons the
//! next, and check every step until the first near-tie (llama.cpp's top1-top2 probability gap
//! <= 0.05):
//! - ids: our argmax equals llama.cpp's at every step before the near-tie (exact);
//! - probabilities of llama.cpp's top-5 (softmax over the full vocabulary, including the
//!   near-tie step): within `PROB_TOL` per value and `MEAN_TOL` on average.
//!
//! Why not 0.02 per value: both engines quantize activations to Q8 (and llama.cpp rounds Q, K
//! and V to f16 in its flash attention), and those rounding errors are independent. Measured
//! against our exact f64 reference forward (dequantized weights, no activation rounding):
//! llama.cpp itself is up to 0.046 away (qwen chinese_ai_future step 3: exact 0.2156,
//! llama.cpp 0.1703) and we are up to 0.077 away (same prompt, step 4) with f32 KV, so the two
//! can be ~0.1 apart with both correct. Measured max |dp| vs llama.cpp with f32 KV: qwen
//! 0.083, smol 0.073 (f16 KV: qwen 0.104); mean |dp| qwen 0.0019 (985 values), smol 0.0061
//! (235 values); with the 4-lane block summation of the SIMD kernels: qwen 0.070 / 0.0018,
//! smol 0.063 / 0.0064. Every id matched in all 9 prompts.
//!
//! Controls (tried by hand on smol): the wrong RoPE pairing for llama (NeoX instead of
//! normal) gives mean |dp| 0.118, max 0.86 (fails both bounds); the milder `freq_base` x 2
//! flips an id at code step 18 (fails). The f64-reference gate
//! (`tests/reference.rs`) is the tight check of the math.

use minfer_engine::{Engine, EngineConfig};
use minfer_gguf::GgmlType;
use serde_json::Value;
use std::path::PathBuf;

const PROB_TOL: f64 = 0.10;
const MEAN_TOL: f64 = 0.01;
const NEAR_TIE: f64 = 0.05;

fn model_path(file: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("MINFER_MODELS")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/minfer/models"))
        })?;
    let p = dir.join(file);
    p.exists().then_some(p)
}

fn softmax(logits: &[f32]) -> Vec<f64> {
    let m = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let e: Vec<f64> = logits.iter().map(|&l| (l as f64 - m).exp()).collect();
    let z: f64 = e.iter().sum();
    e.into_iter().map(|v| v / z).collect()
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best as u32
}

fn run_gate(model_file: &str, fixture: &str) {
    let Some(path) = model_path(model_file) else {
        eprintln!("SKIP: {model_file} not found (set MINFER_MODELS)");
        return;
    };
    let cfg = EngineConfig {
        n_ctx: 128,
        cache_type: GgmlType::F32,
        ..Default::default()
    };
    let mut e = Engine::load(&path, cfg).expect("load");
    let text = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(fixture),
    )
    .unwrap();
    let mut failures = Vec::new();
    let (mut sum_dp, mut n_dp) = (0f64, 0usize);
    for line in text.lines() {
        let rec: Value = serde_json::from_str(line).unwrap();
        let name = rec["name"].as_str().unwrap().to_string();
        let ids = |v: &Value| -> Vec<u32> {
            v.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect()
        };
        let prompt = ids(&rec["prompt_ids"]);
        let generated = ids(&rec["generated_ids"]);
        let steps = rec["steps"].as_array().unwrap();
        e.kv_clear();
        let start = std::time::Instant::now();
        let mut logits = e.decode(&prompt, 0, 1).expect("prefill").to_vec();
        let mut worst = 0f64;
        let mut checked = 0;
        for (k, step) in steps.iter().enumerate() {
            let top = step["top"].as_array().unwrap();
            let lp = |i: usize| top[i][1].as_f64().unwrap().exp();
            let near_tie = lp(0) - lp(1) <= NEAR_TIE;
            let probs = softmax(&logits);
            for t in top {
                let id = t[0].as_u64().unwrap() as usize;
                let want = t[1].as_f64().unwrap().exp();
                let d = (probs[id] - want).abs();
                worst = worst.max(d);
                sum_dp += d;
                n_dp += 1;
                if d > PROB_TOL {
                    failures.push(format!(
                        "{name} step {k}: p[{id}] = {:.4}, llama.cpp {want:.4}",
                        probs[id]
                    ));
                }
            }
            let want_id = step["id"].as_u64().unwrap() as u32;
            if !near_tie && argmax(&logits) != want_id {
                failures.push(format!(
                    "{name} step {k}: argmax {} != llama.cpp {want_id}",
                    argmax(&logits)
                ));
            }
            checked = k + 1;
            if near_tie || k + 1 == generated.len() {
                break;
            }
            logits = e
                .decode(&[generated[k]], prompt.len() + k, 1)
                .expect("decode")
                .to_vec();
        }
        let secs = start.elapsed().as_secs_f64();
        eprintln!(
            "{name}: {checked} steps checked, max |dp| {worst:.4}, {:.2} tok/s (prefill {} + {} decode)",
            (prompt.len() + checked) as f64 / secs,
            prompt.len(),
            checked.saturating_sub(1)
        );
    }
    let mean = sum_dp / n_dp.max(1) as f64;
    eprintln!("{fixture}: mean |dp| {mean:.4} over {n_dp} probabilities");
    assert!(mean <= MEAN_TOL, "mean |dp| {mean} > {MEAN_TOL}");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn qwen_raw_greedy_matches_llama_cpp() {
    run_gate("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "qwen-raw.jsonl");
}

#[test]
fn smol_raw_greedy_matches_llama_cpp() {
    run_gate("smollm2-135m-instruct-q4_1.gguf", "smol-raw.jsonl");
}
