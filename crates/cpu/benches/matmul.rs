//! Prefill matmul throughput per weight type at the demo model's shapes (Qwen2.5-0.5B:
//! 896-wide attention/FFN-in, 4864-wide FFN-out), 64 tokens, one thread: the minimum over
//! rounds of the whole `matmul` call (activation quantization included), as GMAC/s and
//! cycles-free ns per (32-element block × token). `cargo bench -p minfer-cpu --bench matmul`.
//! Each prefill case runs on plain rows, then on rows packed 16 at a time where the
//! instruction set in use has packed kernels (`MINFER_CPU_ISA=avx2` measures AVX2's on an
//! AVX-512 machine). Not a test: it asserts nothing about speed.
//!
//! Then decode's side: one token against ~256 KiB of weight rows (in L2), the minimum over
//! rounds, as weight GB/s: the kernels' compute speed without DRAM (compare
//! `benches/decode_matvec.rs`, which streams a real model's weights).
//!
//! Arguments (after `--`) keep only the cases whose type name is one of them, e.g.
//! `cargo bench -p minfer-cpu --bench matmul -- Q5_0 Q4_0` (no arguments: every case).

use std::hint::black_box;
use std::time::Instant;

use minfer_cpu::ops::matmul::packed::pack_x16;
use minfer_cpu::ops::matmul::{matmul, Layout, Weight};
use minfer_gguf::quants::random_blocks;
use minfer_gguf::GgmlType;

fn main() {
    // `cargo bench` passes `--bench`; the other arguments name the types to run.
    let only: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let wanted = |ty: GgmlType| only.is_empty() || only.iter().any(|o| *o == ty.to_string());
    let nt = 64;
    let cases = [
        (GgmlType::Q5_0, 896, 896),
        (GgmlType::Q4_0, 896, 896),
        (GgmlType::Q8_0, 896, 896),
        (GgmlType::Q4_1, 576, 576),
        (GgmlType::Q4K, 4864, 896),
        (GgmlType::Q6K, 4864, 896),
        // Qwen2.5-1.5B's FFN in and out (issue 35's rows).
        (GgmlType::Q4K, 1536, 8960),
        (GgmlType::Q4K, 8960, 1536),
        (GgmlType::Q6K, 8960, 1536),
    ];
    for (ty, k, m) in cases.into_iter().filter(|c| wanted(c.0)) {
        let bs = ty.block_size() as usize;
        let w = random_blocks(ty, m * k / bs, 3);
        let x: Vec<f32> = (0..nt * k)
            .map(|i| ((i * 7919 % 1013) as f32 - 506.0) * 0.002)
            .collect();
        let mut out = vec![0f32; nt * m];
        let packed = Layout::packed_for(ty)
            .filter(|_| minfer_cpu::simd::x16_kernel(ty).is_some())
            .map(|l| (l, pack_x16(l, &w, k, m).unwrap()));
        let mut layouts = vec![(Layout::Rows, &w[..])];
        layouts.extend(packed.as_ref().map(|(l, b)| (*l, &b[..])));
        for (layout, bytes) in layouts {
            let wt = Weight {
                ty,
                k,
                m,
                bytes,
                layout,
            };
            let mut best = f64::INFINITY;
            for _ in 0..80 {
                let t = Instant::now();
                matmul(&wt, black_box(&x), None, &mut out, 1).unwrap();
                best = best.min(t.elapsed().as_secs_f64());
            }
            let macs = (nt * k * m) as f64;
            println!(
                "{ty:>5} k={k:>5} m={m:>4} nt={nt} {:>7}: {:>7.2} ms  {:>6.2} GMAC/s  {:>5.2} ns per 32-block x token",
                format!("{layout:?}"),
                best * 1e3,
                macs / best / 1e9,
                best * 1e9 / (macs / 32.0)
            );
        }
    }
    for (ty, k) in [
        (GgmlType::Q4K, 1536),
        (GgmlType::Q4K, 8960),
        (GgmlType::Q6K, 1536),
        (GgmlType::Q6K, 8960),
        (GgmlType::Q5_0, 896),
        (GgmlType::Q8_0, 896),
    ]
    .into_iter()
    .filter(|c| wanted(c.0))
    {
        let bs = ty.block_size() as usize;
        let wrb = ty.row_bytes(k as u64).unwrap() as usize;
        let m = (256 * 1024 / wrb) / 16 * 16;
        let w = random_blocks(ty, m * k / bs, 5);
        let x: Vec<f32> = (0..k)
            .map(|i| ((i * 7919 % 1013) as f32 - 506.0) * 0.002)
            .collect();
        let mut out = vec![0f32; m];
        let wt = Weight {
            ty,
            k,
            m,
            bytes: &w,
            layout: Default::default(),
        };
        let mut best = f64::INFINITY;
        for _ in 0..2000 {
            let t = Instant::now();
            matmul(&wt, black_box(&x), None, &mut out, 1).unwrap();
            best = best.min(t.elapsed().as_secs_f64());
        }
        println!(
            "{ty:>5} k={k:>5} m={m:>4} nt=1 (hot): {:>7.1} us  {:>6.2} GB/s of weights",
            best * 1e6,
            w.len() as f64 / best / 1e9
        );
    }
}
