//! Whole synthetic models on the CUDA backend (`--backend cuda`) against the f64 reference
//! forward and the CPU backend (issue 15's first slice). Every test prints SKIP and passes
//! where no CUDA device exists, so CI machines stay green; scripts/gpu-gate runs them on the
//! H200.
//!
//! Tolerance classes, named before measuring:
//! - The kernels read f32 activations against the weights' dequantized values, as the
//!   reference does; the only difference is f32 accumulation (and its order) against f64.
//!   Bar: max |dlogit| <= `ACC_TOL` (1e-3, the CPU's F32 bar), for every weight type.
//! - An f16 KV cache rounds every K/V value to f16 (rel 2^-11): bar 2% of the logits' RMS.
//!   A q8_0 cache rounds K/V to 8 bits per 32-value block, as the CPU's does: bar twice the
//!   CPU's own q8_0-cache error against the reference (plus ACC_TOL).
//! - One matmul kernel for every row count and attention per (head, query): a row's bits do
//!   not depend on its batch. Chunked vs unchunked prefill, a batch of 8 sequences vs each
//!   alone and three runs: bit for bit.
//! - Greedy tokens for 32 steps: identical to the CPU's where the CPU's arithmetic is f32 (F32
//!   and F16 weights). For quantized weights the CPU quantizes activations (Q8_0/Q8_1/Q8_K dot
//!   products) and the GPU does not, so there the bar is the f64 reference's greedy tokens and
//!   the CPU's agreement is reported (first measured: Q5_0 hd 64 parted from the CPU at step
//!   3 while matching the reference to 7e-7).
//! - The 0.5B-shaped model against the f64 reference on a short prompt: bar 5e-3 (deeper and
//!   wider than the tiny models; f32 accumulation only).

#![cfg(feature = "cuda")]

use minfer_engine::{BatchEntry, Engine, EngineConfig};
use minfer_gguf::{GgmlType, GgufModel};
use minfer_models::{reference, Arch, HParams};
use minfer_testkit::logits::*;
use minfer_testkit::synth;
use std::path::{Path, PathBuf};

const ACC_TOL: f64 = 1e-3;

/// Whether a CUDA device is here; prints SKIP when not.
fn gpu() -> bool {
    match minfer_cuda::available() {
        Ok(()) => true,
        Err(why) => {
            println!("SKIP: no CUDA device ({why})");
            false
        }
    }
}

fn tiny(arch: Arch, ty: GgmlType, head_dim: usize) -> PathBuf {
    synth::tiny_hd(arch, ty, head_dim)
}

fn engine(path: &Path, cuda: bool, cache: GgmlType, n_batch: usize) -> Engine {
    Engine::load(
        path,
        EngineConfig {
            n_ctx: 160,
            threads: 2,
            cache_type: cache,
            backends: vec![if cuda { "cuda" } else { "cpu" }.into()],
            n_batch,
            ..EngineConfig::default()
        },
    )
    .unwrap()
}

/// Greedy tokens of the f64 reference forward (the whole sequence re-run each step).
fn reference_greedy(path: &Path, prompt: &[u32], n: usize) -> Vec<u32> {
    let gguf = GgufModel::open(path).unwrap();
    let hp = HParams::from_metadata(gguf.metadata()).unwrap();
    let mut seq = prompt.to_vec();
    let mut out = Vec::new();
    for _ in 0..n {
        let rows = reference::forward(&gguf, &hp, &seq).unwrap();
        let last = rows.last().unwrap();
        let next = last
            .iter()
            .enumerate()
            .fold((0, f64::MIN), |b, (i, &x)| if x > b.1 { (i, x) } else { b })
            .0 as u32;
        out.push(next);
        seq.push(next);
    }
    out
}

fn long_prompt(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 7 + 3) % 40).collect()
}

const TOKENS: [u32; 9] = [1, 5, 9, 3, 33, 7, 2, 0, 39];

#[test]
fn every_arch_and_weight_type_matches_the_reference_and_the_cpu_greedy() {
    if !gpu() {
        return;
    }
    use GgmlType as T;
    let types = [
        T::F32,
        T::F16,
        T::Q8_0,
        T::Q4_0,
        T::Q4_1,
        T::Q5_0,
        T::Q4K,
        T::Q6K,
    ];
    for arch in Arch::ALL {
        for hd in [64, 128] {
            for ty in types {
                let path = tiny(arch, ty, hd);
                let want = reference_logits(&path, &TOKENS);
                let mut g = engine(&path, true, T::F32, 512);
                let c = g.nodes_per_backend(1).unwrap();
                let on_cpu = c.iter().find(|(n, _)| n == "cpu").map_or(0, |x| x.1);
                let on_gpu = c.iter().find(|(n, _)| n == "cuda").map_or(0, |x| x.1);
                assert!(on_cpu == 0 && on_gpu > 20, "{arch:?} {ty}: {c:?}");
                let got = run_logits(&mut g, &TOKENS);
                let d = got
                    .iter()
                    .zip(&want)
                    .fold(0f64, |x, (g, w)| x.max(max_diff(g, w)));
                println!(
                    "{arch:?} hd {hd} {ty}: cuda vs reference max |dlogit| {d:.3e} (rms {:.3})",
                    rms(&want)
                );
                assert!(d <= ACC_TOL, "{arch:?} hd {hd} {ty}: {d}");
                let mut c = engine(&path, false, T::F32, 512);
                let (gg, gc) = (greedy(&mut g, &TOKENS, 32), greedy(&mut c, &TOKENS, 32));
                let agree = gg.iter().zip(&gc).take_while(|(a, b)| a == b).count();
                if matches!(ty, T::F32 | T::F16) {
                    assert_eq!(gg, gc, "{arch:?} hd {hd} {ty}: greedy tokens vs the CPU");
                } else {
                    let gr = reference_greedy(&path, &TOKENS, 32);
                    println!(
                        "  greedy: cpu agrees for {agree}/32, reference {}",
                        gr == gg
                    );
                    assert_eq!(
                        gg, gr,
                        "{arch:?} hd {hd} {ty}: greedy tokens vs the reference"
                    );
                }
            }
        }
    }
}

#[test]
fn f16_and_q8_0_kv_caches_stay_in_their_class() {
    let gpu = gpu();
    for arch in Arch::ALL {
        let path = tiny(arch, GgmlType::F32, 64);
        let want = reference_logits(&path, &TOKENS);
        let diff = |rows: Vec<Vec<f32>>| {
            rows.iter()
                .zip(&want)
                .fold(0f64, |x, (g, w)| x.max(max_diff(g, w)))
        };
        let cpu_rows = run_logits(&mut engine(&path, false, GgmlType::Q8_0, 512), &TOKENS);
        let cpu_q8 = diff(cpu_rows.clone());
        println!("{arch:?} q8_0 KV on the CPU: max |dlogit| {cpu_q8:.3e}");
        if !gpu {
            continue;
        }
        for cache in [GgmlType::F16, GgmlType::Q8_0] {
            let rows = run_logits(&mut engine(&path, true, cache, 512), &TOKENS);
            if cache == GgmlType::Q8_0 {
                // Per row, against the CPU's q8_0 cache (the same rounding rule).
                let per: Vec<String> = rows
                    .iter()
                    .zip(&cpu_rows)
                    .map(|(g, c)| {
                        let d = g.iter().zip(c).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
                        format!("{d:.1e}")
                    })
                    .collect();
                println!("{arch:?} q8_0 KV, cuda vs cpu per row: {}", per.join(" "));
            }
            let d = diff(rows);
            let bar = match cache {
                GgmlType::F16 => 0.02 * rms(&want),
                _ => 2.0 * cpu_q8 + ACC_TOL,
            };
            println!("{arch:?} {cache} KV: max |dlogit| {d:.3e}, bar {bar:.3e}");
            assert!(d <= bar, "{arch:?} {cache}: {d} > {bar}");
            assert!(d > 0.0, "the {cache} rounding is visible");
        }
    }
}

#[test]
fn chunked_prefill_is_bitwise_the_unchunked_one() {
    if !gpu() {
        return;
    }
    for arch in Arch::ALL {
        let path = tiny(arch, GgmlType::Q4K, 64);
        let prompt = long_prompt(100);
        let a = engine(&path, true, GgmlType::F16, 512)
            .decode(&prompt, 0, 1)
            .unwrap()
            .to_vec();
        let b = engine(&path, true, GgmlType::F16, 24)
            .decode(&prompt, 0, 1)
            .unwrap()
            .to_vec();
        let want = reference_logits(&path, &prompt);
        let r = max_diff(&a, want.last().unwrap());
        println!(
            "{arch:?}: chunked == whole: {}, whole vs reference {r:.3e}",
            bits(&a) == bits(&b)
        );
        assert_eq!(bits(&a), bits(&b), "{arch:?}: chunked vs whole");
        assert!(r <= 0.02 * rms(&want), "{arch:?}: {r}");
    }
}

#[test]
fn eight_sequences_batched_answer_bitwise_like_each_alone() {
    if !gpu() {
        return;
    }
    let path = tiny(Arch::Qwen2, GgmlType::Q8_0, 64);
    let prompts: Vec<Vec<u32>> = (0..8)
        .map(|i| long_prompt(70)[i..i + 4 + 3 * i].to_vec())
        .collect();
    let alone: Vec<Vec<f32>> = prompts
        .iter()
        .map(|p| {
            engine(&path, true, GgmlType::F16, 512)
                .decode(p, 0, 1)
                .unwrap()
                .to_vec()
        })
        .collect();
    let mut e = engine(&path, true, GgmlType::F16, 512);
    let seqs: Vec<_> = (0..8).map(|_| e.seq_create()).collect();
    let entries: Vec<BatchEntry> = seqs
        .iter()
        .zip(&prompts)
        .map(|(&s, p)| BatchEntry::new(s, p, 0))
        .collect();
    let out = e.forward_batch(&entries).unwrap();
    for (i, a) in alone.iter().enumerate() {
        let same = bits(a) == bits(out.logits(i));
        println!("sequence {i}: batched == alone: {same}");
        assert!(same, "sequence {i}");
    }
    let other = engine(&path, true, GgmlType::F16, 512)
        .decode(&[4, 8, 16], 0, 1)
        .unwrap()
        .to_vec();
    assert_ne!(
        bits(&other),
        bits(&alone[0]),
        "control: another prompt differs"
    );
}

#[test]
fn three_runs_are_bit_identical() {
    if !gpu() {
        return;
    }
    let path = tiny(Arch::Qwen3, GgmlType::Q6K, 128);
    let prompt = long_prompt(70);
    let runs: Vec<Vec<u32>> = (0..3)
        .map(|_| {
            bits(
                engine(&path, true, GgmlType::F16, 512)
                    .decode(&prompt, 0, 1)
                    .unwrap(),
            )
        })
        .collect();
    assert_eq!(runs[0], runs[1]);
    assert_eq!(runs[0], runs[2]);
}

/// A 0.5B-shaped model (MINFER_GATE_CUDA_MODEL, made by `minfer synth --preset 0.5b` on the
/// GPU machine): CUDA against the f64 reference on a short prompt (bar 5e-3), and against
/// the CPU (reported: the CPU quantizes activations for quantized weights, the GPU does not).
#[test]
fn a_half_b_model_agrees_with_the_cpu() {
    let Ok(path) = std::env::var("MINFER_GATE_CUDA_MODEL") else {
        println!("SKIP: MINFER_GATE_CUDA_MODEL is not set");
        return;
    };
    if !gpu() {
        return;
    }
    let load = |b: &str| {
        Engine::load(
            Path::new(&path),
            EngineConfig {
                n_ctx: 256,
                threads: 8,
                backends: vec![b.into()],
                ..EngineConfig::default()
            },
        )
        .unwrap()
    };
    let (mut g, mut c) = (load("cuda"), load("cpu"));
    let prompt: Vec<u32> = (0..40u32).map(|i| (i * 7919 + 11) % 5000).collect();
    let a = g.decode(&prompt, 0, 1).unwrap().to_vec();
    let b = c.decode(&prompt, 0, 1).unwrap().to_vec();
    let d = a
        .iter()
        .zip(&b)
        .fold(0f64, |m, (x, y)| m.max((x - y).abs() as f64));
    let r = (b.iter().map(|x| (*x as f64).powi(2)).sum::<f64>() / b.len() as f64).sqrt();
    let (gg, gc) = (greedy(&mut g, &prompt, 16), greedy(&mut c, &prompt, 16));
    let same = gg.iter().zip(&gc).take_while(|(x, y)| x == y).count();
    println!("0.5B: cuda vs cpu max |dlogit| {d:.3e} (rms {r:.3}); greedy agree {same}/16");
    let short = &prompt[..6];
    let t0 = std::time::Instant::now();
    let want = reference_logits(Path::new(&path), short);
    let got = load("cuda").decode(short, 0, short.len()).unwrap().to_vec();
    let vocab = want[0].len();
    let dr = got
        .chunks_exact(vocab)
        .zip(&want)
        .fold(0f64, |m, (g, w)| m.max(max_diff(g, w)));
    println!(
        "0.5B: cuda vs f64 reference max |dlogit| {dr:.3e} over {} rows (reference {:.1} s)",
        short.len(),
        t0.elapsed().as_secs_f64()
    );
    assert!(dr <= 5e-3, "{dr}");
}
