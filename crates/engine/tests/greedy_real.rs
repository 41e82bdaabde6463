//! THE acceptance gate against llama.cpp on the real demo models (skipped when absent).
//!
//! Fixtures (`tests/fixtures/{qwen-raw,qwen-chat,smol-raw}.jsonl`, copied from the shared
//! oracle): llama-server greedy runs with top-5 pre-sampling log-probabilities per step (f16
//! KV, flash attention, AVX-512 build), from exactly the given `prompt_ids`. We feed
//! llama.cpp's ids, so one step never poisons the next, and check every step until the first
//! near-tie (llama.cpp's top1-top2 probability gap <= 0.05):
//! - ids: our argmax equals llama.cpp's at every step before the near-tie (exact);
//! - probabilities of llama.cpp's top-5 (softmax over the full vocabulary, including the
//!   near-tie step): within a per-value and a mean tolerance.
//!
//! Two arithmetics, two gates per fixture:
//! - `*_llamacpp_numerics_match_fixtures`: `--numerics llamacpp-x86-avx512` (llama.cpp's x86
//!   build float op for float op, `minfer_cpu::llamacpp_x86`), probabilities formed as llama-server
//!   forms them ([`server_probs`]), at 3e-4 per value (`AVX512_MAX_TOL`, 4.3x the largest
//!   measured, inside the issue's bound 0.02) and mean 1e-5.
//!   Measured 2026-11-30: max 4.8e-5 / mean 2.7e-7 (qwen raw, 985 values), 7.0e-5 / 1.5e-6
//!   (qwen chat, 120), 4.2e-5 / 3.0e-7 (smol, 235); 7 of 12 prompts within 1.5e-8. The same
//!   code as `llamacpp-x86-avx2` equals llama.cpp's AVX2 build on this VM at every step (9
//!   printed decimals), and as `-avx512` llama.cpp's AVX-512 build on an AVX-512 host (smol,
//!   every step; docs/PRECISION.md), which shows the same residual against these fixtures. Controls: the native arithmetic fails this bound
//!   (0.092 > 0.02, below); so does the AVX2 form against these AVX-512 fixtures (smol max
//!   0.048 at code step 9, the same as llama.cpp's own AVX2 build; qwen 0.072).
//! - `*_native_within_noise_of_llama_cpp`: minfer's own kernels, bounds explained below.
//!
//! KV cache f16, as llama.cpp ran: with fewer than 64 query rows our f16 attention uses
//! llama.cpp's flash-attention arithmetic (`minfer_cpu::llamacpp_x86::attn_f16`), and activations are
//! quantized with its x86 rule (`quants::quantize_act_row`).
//!
//! Native, why not 0.02 per value: these steps are chaotic. llama.cpp itself, same commit and
//! settings (-t 2, f16 KV, flash attention, repack) but built AVX2-native on the dev VM instead
//! of AVX-512, is up to 0.072 away from the fixtures (qwen chinese_ai_future step 3: 0.0986 vs
//! 0.1703; mean 0.0016 qwen, 0.0056 smol, max smol 0.048): its float summation orders differ
//! from the fixture build's (16-lane f16 dots, AVX-512 q4_K repack GEMV, expf), and Q8
//! activation quantization turns 1e-7 differences into 1e-3 ones that grow through the layers
//! (layer-by-layer dump vs llama.cpp on smol: 1e-7 relative after the first matmuls, 1e-2 by
//! layer 3). Our exact f64 reference forward puts the fixture itself 0.046 from the exact value
//! at that step. On our side one f32 ulp moves the maximum by 0.03: the flash-attention sum
//! S = S*ms + vs unfused gave qwen-raw 0.057, fused (llama.cpp's bits, kept) 0.092; llama.cpp's
//! SIMD expf in SiLU gave 0.064-0.078. So the maximum stays bounded at 0.10 (the noise floor
//! measured over those variants: 0.057-0.110 qwen, 0.059-0.087 smol), and the mean, which is
//! stable across them (qwen 0.0015-0.0024, smol 0.0049-0.0067), is the tight check.
//! Measured now: qwen-raw max 0.092 mean 0.0019 (985 values), qwen-chat max 0.014 mean 0.0015
//! (120), smol-raw max 0.075 mean 0.0061 (235). Every id matches in all 12 prompts.
//! Per prompt (max |dp|): within 0.02 are qwen capital_france 0.015, once_upon 0.009,
//! thermodynamics 0.007, one_question 0.014, system_user 0.011, multi_turn 0.009; beyond are
//! rust_reverse 0.039, chinese_ai_future 0.057, def_fibonacci 0.092 (step 58), smol code
//! 0.044, capital_france 0.059, english 0.075.
//!
//! Controls (tried by hand on smol, under the previous bounds 0.10 / 0.01, both far beyond
//! the present ones): the wrong RoPE
//! pairing for llama (NeoX instead of normal) gives mean |dp| 0.118, max 0.86 (fails both
//! bounds); the milder `freq_base` x 2 flips an id at code step 18 (fails). The f64-reference
//! gate (`tests/reference.rs`) is the tight check of the math.

use minfer_cpu::llamacpp_x86::LlamaCppX86;
use minfer_cpu::Numerics;
use minfer_engine::{Engine, EngineConfig};
use minfer_gguf::GgmlType;
use minfer_testkit::models::{self, QWEN, SMOL};
use serde_json::Value;
use std::path::PathBuf;

const PROB_TOL: f64 = 0.10;
/// The issue's bound per probability, for `--numerics llamacpp-x86-avx512`.
const ISSUE_TOL: f64 = 0.02;
/// The bound asserted for that arithmetic: its measured class, far inside the issue's. The
/// largest value measured is 7.0e-5 (qwen chat; the residual between two llama.cpp builds,
/// module docs), so 3e-4 is 4.3x it; 0.02 (285x) would pass a one-step error the mean alone
/// hides (1e-3 at one of 985 values moves the mean by 1e-6).
const AVX512_MAX_TOL: f64 = 3e-4;
const _: () = assert!(AVX512_MAX_TOL < ISSUE_TOL);
/// Mean bound for that gate (measured: see the module docs).
const ISSUE_MEAN_TOL: f64 = 1e-5;
const NEAR_TIE: f64 = 0.05;

fn softmax(logits: &[f32]) -> Vec<f64> {
    let m = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let e: Vec<f64> = logits.iter().map(|&l| (l as f64 - m).exp()).collect();
    let z: f64 = e.iter().sum();
    e.into_iter().map(|v| v / z).collect()
}

/// llama-server's pre-sampling probabilities (`post_sampling_probs: false`): logits sorted
/// descending, `p = expf(l - max)` summed in f32 in that order, then divided by the sum. The
/// fixtures' log-probabilities are `log` of these f32 values.
fn server_probs(logits: &[f32]) -> Vec<f32> {
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    let max = logits[order[0]];
    let mut p = vec![0f32; logits.len()];
    let mut sum = 0f32;
    for &i in &order {
        p[i] = (logits[i] - max).exp();
        sum += p[i];
    }
    for v in p.iter_mut() {
        *v /= sum;
    }
    p
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

/// Tolerances of one gate: per value, mean over the fixture, and whether probabilities are
/// computed the way llama-server computes them (f32) or exactly (f64).
struct Tol {
    max: f64,
    mean: f64,
    server_softmax: bool,
}

fn run_gate(model_file: &str, fixture: &str, numerics: Numerics, tol: Tol) {
    let Some(path) = models::find(model_file) else {
        return;
    };
    let cfg = EngineConfig {
        n_ctx: 128,
        cache_type: GgmlType::F16,
        ..Default::default()
    }
    .with_numerics(numerics);
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
            let probs: Vec<f64> = if tol.server_softmax {
                server_probs(&logits).into_iter().map(f64::from).collect()
            } else {
                softmax(&logits)
            };
            for t in top {
                let id = t[0].as_u64().unwrap() as usize;
                let want = t[1].as_f64().unwrap().exp();
                let d = (probs[id] - want).abs();
                worst = worst.max(d);
                sum_dp += d;
                n_dp += 1;
                if d > tol.max {
                    failures.push(format!(
                        "{name} step {k}: p[{id}] = {:.4}, llama.cpp {want:.4}",
                        probs[id]
                    ));
                }
            }
            if std::env::var_os("GATE_VERBOSE").is_some() {
                let ds: Vec<String> = top
                    .iter()
                    .map(|t| {
                        let id = t[0].as_u64().unwrap() as usize;
                        format!("{id}:{:+.2e}", probs[id] - t[1].as_f64().unwrap().exp())
                    })
                    .collect();
                eprintln!("  {name} step {k}: {}", ds.join(" "));
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
            "{name}: {checked} steps checked, max |dp| {worst:.3e}, {:.2} tok/s (prefill {} + {} decode)",
            (prompt.len() + checked) as f64 / secs,
            prompt.len(),
            checked.saturating_sub(1)
        );
    }
    let mean = sum_dp / n_dp.max(1) as f64;
    eprintln!(
        "{fixture} ({}): mean |dp| {mean:.3e} over {n_dp} probabilities",
        numerics.name()
    );
    assert!(mean <= tol.mean, "mean |dp| {mean} > {}", tol.mean);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// minfer's own arithmetic: within the cross-build noise (see the module docs).
fn native(mean: f64) -> Tol {
    Tol {
        max: PROB_TOL,
        mean,
        server_softmax: false,
    }
}

/// llama.cpp's x86 AVX-512 arithmetic (the fixture build): its measured class per value
/// (`AVX512_MAX_TOL`, inside the issue's 0.02), with the probabilities formed as
/// llama-server forms them.
const LLAMA_AVX512: Numerics = Numerics::LlamaCpp(LlamaCppX86::Avx512);
fn as_fixture_build() -> Tol {
    Tol {
        max: AVX512_MAX_TOL,
        mean: ISSUE_MEAN_TOL,
        server_softmax: true,
    }
}

#[test]
fn qwen_raw_native_within_noise_of_llama_cpp() {
    run_gate(QWEN, "qwen-raw.jsonl", Numerics::Native, native(0.0025));
}

#[test]
fn qwen_chat_native_within_noise_of_llama_cpp() {
    run_gate(QWEN, "qwen-chat.jsonl", Numerics::Native, native(0.0025));
}

#[test]
fn smol_raw_native_within_noise_of_llama_cpp() {
    run_gate(SMOL, "smol-raw.jsonl", Numerics::Native, native(0.008));
}

#[test]
fn qwen_raw_llamacpp_numerics_match_fixtures() {
    run_gate(QWEN, "qwen-raw.jsonl", LLAMA_AVX512, as_fixture_build());
}

#[test]
fn qwen_chat_llamacpp_numerics_match_fixtures() {
    run_gate(QWEN, "qwen-chat.jsonl", LLAMA_AVX512, as_fixture_build());
}

#[test]
fn smol_raw_llamacpp_numerics_match_fixtures() {
    run_gate(SMOL, "smol-raw.jsonl", LLAMA_AVX512, as_fixture_build());
}
