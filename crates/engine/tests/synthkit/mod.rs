//! Synthetic models on disk for the KV, session and chat tests.
#![allow(dead_code)]

use minfer_engine::{Engine, EngineConfig};
use minfer_gguf::GgmlType;
use minfer_models::synth::{synthesize, SynthSpec};
use minfer_models::Arch;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

static NEXT: AtomicUsize = AtomicUsize::new(0);

pub fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("minfer-chat-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(format!("{}-{name}", NEXT.fetch_add(1, Ordering::Relaxed)))
}

/// A synthetic model file: `layers` blocks of width 64, 4 heads, 2 KV heads.
pub fn model(arch: Arch, layers: usize, seed: u64) -> PathBuf {
    model_heads(arch, layers, seed, 4, 2)
}

/// Width 64 with `heads` query heads and `kv_heads` KV heads (2 and 1 give head dim 32,
/// which q8_0 KV needs).
pub fn model_heads(arch: Arch, layers: usize, seed: u64, heads: usize, kv_heads: usize) -> PathBuf {
    let mut spec = SynthSpec::new(arch, layers, 64, heads, kv_heads, 128);
    spec.seed = seed;
    let p = tmp(&format!("{}-{layers}-{seed}-{heads}.gguf", arch.name()));
    std::fs::write(&p, synthesize(&spec).unwrap().to_bytes()).unwrap();
    p
}

pub fn engine(path: &PathBuf, n_ctx: usize, cache_type: GgmlType) -> Engine {
    Engine::load(
        path,
        EngineConfig {
            n_ctx,
            threads: 1,
            cache_type,
            ..EngineConfig::default()
        },
    )
    .unwrap()
}

/// Deterministic token ids below `vocab`.
pub fn tokens(n: usize, seed: u32, vocab: usize) -> Vec<u32> {
    let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x % vocab as u32
        })
        .collect()
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

pub fn max_abs(a: &[f32]) -> f32 {
    a.iter().map(|x| x.abs()).fold(0.0, f32::max)
}
