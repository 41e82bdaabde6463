//! Batched-decode matmul throughput: the demo model's (Qwen2.5-0.5B Q4_K_M) matrices of one
//! decode step against 1 to 16 activation rows (one per sequence), weights streamed from
//! memory as in a real step (each case cycles through copies of its matrix that together
//! exceed the last-level cache; the LM head alone is 144 MB). Minimum over rounds of the
//! whole `matmul` call, as ms and GMAC/s.
//! `cargo bench -p minfer-cpu --bench batched_decode [-- THREADS [ROUNDS]]`.
//! Not a test: it asserts nothing about speed.

use std::hint::black_box;
use std::time::Instant;

use minfer_cpu::ops::matmul::{matmul, Weight};
use minfer_gguf::quants::random_blocks;
use minfer_gguf::GgmlType;

/// Bytes of weight copies per case: past a 32 MiB last-level cache.
const STREAM_BYTES: usize = 96 << 20;

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let threads: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(2);
    let rounds: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(20);
    // (type, k, m): FFN-in (Q5_0), attention q/o (Q5_0), FFN-out (Q4_K, Q6_K), LM head (Q8_0).
    let cases = [
        (GgmlType::Q5_0, 896, 4864),
        (GgmlType::Q5_0, 896, 896),
        (GgmlType::Q4K, 4864, 896),
        (GgmlType::Q6K, 4864, 896),
        (GgmlType::Q8_0, 896, 151_936),
    ];
    println!("threads {threads}, best of {rounds} rounds");
    for (ty, k, m) in cases {
        let bs = ty.block_size() as usize;
        let bytes = ty.row_bytes(k as u64).unwrap() as usize * m;
        let copies = STREAM_BYTES.div_ceil(bytes).max(1);
        let ws: Vec<Vec<u8>> = (0..copies)
            .map(|c| random_blocks(ty, m * k / bs, 3 + c as u64))
            .collect();
        for nt in [1usize, 2, 4, 8, 16] {
            let x: Vec<f32> = (0..nt * k)
                .map(|i| ((i * 7919 % 1013) as f32 - 506.0) * 0.002)
                .collect();
            let mut out = vec![0f32; nt * m];
            let mut best = f64::INFINITY;
            for r in 0..rounds * copies {
                let wt = Weight {
                    ty,
                    k,
                    m,
                    bytes: &ws[r % copies],
                    layout: Default::default(),
                };
                let t = Instant::now();
                matmul(&wt, black_box(&x), None, &mut out, threads).unwrap();
                best = best.min(t.elapsed().as_secs_f64());
            }
            let macs = (nt * k * m) as f64;
            println!(
                "{ty:>5} k={k:>5} m={m:>6} nt={nt:>2}: {:>8.3} ms  {:>6.2} GMAC/s",
                best * 1e3,
                macs / best / 1e9,
            );
        }
    }
}
