//! A decode step's attention at depth: one query token against `depth` cells of an f16 KV
//! cache, for every layer of a model shape (each layer its own K and V regions, so at depth
//! they come from memory as in a real step, where the weights streamed between layers have
//! evicted them: a 64 MiB read before each layer's call), through `ops::attn::attention` (the kernel and
//! the thread pool a forward uses).
//!
//! `cargo bench -p minfer-cpu --bench decode_attention -- [threads] [depth] [shape] [passes]`
//! (defaults: 2 threads, depth 4096, `demo` (Qwen2.5-0.5B: 24 layers, 14 heads, 2 KV heads
//! of 64), 9 passes; `7b`: 28 layers, 28 heads, 4 KV heads of 128). Prints the median ms of a
//! step's attention over the passes. Not a test: nothing is asserted.

use std::time::Instant;

use minfer_cpu::ops::attn::{attention, AttnParams};
use minfer_gguf::quants::f32_to_f16;
use minfer_gguf::GgmlType;
use minfer_testkit::rng::Rng;

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let arg = |i: usize, d: &str| args.get(i).cloned().unwrap_or_else(|| d.to_string());
    let threads: usize = arg(0, "2").parse().expect("threads");
    let depth: usize = arg(1, "4096").parse().expect("depth");
    let shape = arg(2, "demo");
    let passes: usize = arg(3, "9").parse().expect("passes");
    let (layers, n_head, n_head_kv, hd) = match shape.as_str() {
        "demo" => (24, 14, 2, 64),
        "7b" => (28, 28, 4, 128),
        s => panic!("shape {s}: want demo or 7b"),
    };
    let p = AttnParams {
        n_head,
        n_head_kv,
        head_dim: hd,
        scale: 1.0 / (hd as f32).sqrt(),
        cache_type: GgmlType::F16,
        llamacpp: None,
    };
    let mut rng = Rng::xorshift64_raw(0x5eed);
    let row = n_head_kv * hd;
    let region = |rng: &mut Rng| -> Vec<u8> {
        (0..depth * row)
            .flat_map(|_| f32_to_f16(rng.signed()).to_le_bytes())
            .collect()
    };
    let kv: Vec<(Vec<u8>, Vec<u8>)> = (0..layers)
        .map(|_| (region(&mut rng), region(&mut rng)))
        .collect();
    let q: Vec<f32> = (0..n_head * hd).map(|_| rng.signed()).collect();
    let window = [f32::from_bits(0), f32::from_bits(depth as u32)];
    let mut out = vec![0f32; n_head * hd];
    // Between layers a decode step streams the layer's weights through the caches, so each
    // layer's K and V come from memory: a buffer larger than the last-level cache is read
    // before each call (not timed).
    let flush: Vec<u64> = vec![1; 64 << 17];
    let mut ms = Vec::new();
    for _ in 0..passes {
        let mut secs = 0.0;
        for (k, v) in &kv {
            std::hint::black_box(flush.iter().fold(0u64, |a, &x| a.wrapping_add(x)));
            let t = Instant::now();
            attention(&p, &q, &window, k, v, &mut out, threads).expect("attention");
            secs += t.elapsed().as_secs_f64();
        }
        ms.push(secs * 1e3);
    }
    ms.sort_by(f64::total_cmp);
    println!(
        "attention {shape} depth {depth} threads {threads}: {:.3} ms a step (median of {passes}; min {:.3}, max {:.3})",
        ms[passes / 2],
        ms[0],
        ms[passes - 1]
    );
}
