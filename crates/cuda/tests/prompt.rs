//! The prompt rows' kernels (kernels/prompt.cu, crates/cuda/src/lt.rs; ADR 0011) on random
//! data, against host references. SKIP (pass) without a CUDA device.
//!
//! Classes, named before measuring:
//! - Dequantization to f16/bf16: the reference's f32 value rounded once to nearest-even:
//!   bit for bit, every type (`mf_deq_half` against `quants::dequantize_row` + rounding).
//! - The GEMM over f16 operands with f32 accumulation against an f64 product of the same
//!   rounded operands: relative error (‖d‖/‖ref‖ per row) ≤ 1e-5 (k ≤ 4864 f32 additions).
//! - Row invariance of the pinned GEMM: the rows of every row count 1 … 4096 (and at an offset
//!   inside a larger call) bit for bit those of the 4096-row call. Control: the unpinned
//!   heuristic (`MINFER_CUDA_GEMM_PIN=0`) changes some row count's bits.
//!
//! The tensor-core attention's gates are in `prompt_attention.rs`.

#![cfg(feature = "cuda")]

use minfer_cuda::device::{Arg, Gpu};
use minfer_cuda::lt::{GemmCall, GemmType};
use minfer_gguf::quants::{dequantize_row, f16_to_f32, f32_to_bf16, f32_to_f16, quantize_row};
use minfer_gguf::GgmlType;

fn gpu() -> Option<Gpu> {
    match minfer_cuda::available().and_then(|_| Gpu::new().map_err(minfer_cuda::CudaError::from)) {
        Ok(g) => Some(g),
        Err(why) => {
            println!("SKIP: no CUDA device ({why})");
            None
        }
    }
}

struct Rng(u64);
impl Rng {
    fn unit(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) as u32) as f32 / (1u64 << 31) as f32 * 2.0 - 1.0
    }
}

fn bytes_f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn bytes_u16s(b: &[u8]) -> Vec<u16> {
    b.chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect()
}

fn put(g: &mut Gpu, data: &[u8]) -> u64 {
    let p = g.alloc(data.len()).unwrap();
    g.upload(p, data).unwrap();
    p
}

fn get(g: &Gpu, p: u64, len: usize) -> Vec<u8> {
    g.sync().unwrap();
    let mut out = vec![0u8; len];
    g.download(p, &mut out).unwrap();
    out
}

/// A random quantized matrix of `n` rows of `k`: the bytes and their f32 dequantization.
fn matrix(ty: GgmlType, n: usize, k: usize, r: &mut Rng) -> (Vec<u8>, Vec<f32>) {
    let rb = ty.row_bytes(k as u64).unwrap() as usize;
    let mut bytes = vec![0u8; rb * n];
    let mut deq = vec![0f32; n * k];
    for (row, (b, d)) in bytes
        .chunks_exact_mut(rb)
        .zip(deq.chunks_exact_mut(k))
        .enumerate()
    {
        let x: Vec<f32> = (0..k)
            .map(|i| r.unit() * (1.0 + (i % 7) as f32) * 0.05 + row as f32 * 1e-4)
            .collect();
        quantize_row(ty, &x, b).unwrap();
        dequantize_row(ty, b, d).unwrap();
    }
    (bytes, deq)
}

const TYPES: [GgmlType; 6] = [
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q4K,
    GgmlType::Q6K,
];

fn code(ty: GgmlType) -> i32 {
    match ty {
        GgmlType::Q8_0 => 2,
        GgmlType::Q4_0 => 3,
        GgmlType::Q4_1 => 4,
        GgmlType::Q5_0 => 5,
        GgmlType::Q4K => 6,
        GgmlType::Q6K => 7,
        _ => unreachable!(),
    }
}

fn dequant(g: &mut Gpu, ty: GgmlType, w: u64, n: usize, k: usize, bf16: bool) -> u64 {
    let out = g.alloc(n * k * 2).unwrap();
    let rb = ty.row_bytes(k as u64).unwrap();
    g.launch(
        "mf_deq_half",
        ((n * k / 32).div_ceil(256) as u32, 1, 1),
        256,
        &[
            Arg::I32(code(ty)),
            Arg::U64(w),
            Arg::U64(rb),
            Arg::U64(out),
            Arg::I32(k as i32),
            Arg::I32(n as i32),
            Arg::I32(bf16 as i32),
        ],
    )
    .unwrap();
    out
}

#[test]
fn dequantization_to_half_is_the_reference_rounded() {
    let Some(mut g) = gpu() else { return };
    let mut r = Rng(7);
    for ty in TYPES {
        let (n, k) = (37, 512);
        let (bytes, deq) = matrix(ty, n, k, &mut r);
        let w = put(&mut g, &bytes);
        for bf16 in [false, true] {
            let out = dequant(&mut g, ty, w, n, k, bf16);
            let got = bytes_u16s(&get(&g, out, n * k * 2));
            let want: Vec<u16> = deq
                .iter()
                .map(|&v| if bf16 { f32_to_bf16(v) } else { f32_to_f16(v) })
                .collect();
            let bad = got.iter().zip(&want).filter(|(a, b)| a != b).count();
            println!(
                "{ty} -> {}: {bad} of {} values differ",
                if bf16 { "bf16" } else { "f16" },
                n * k
            );
            assert_eq!(bad, 0, "{ty} bf16={bf16}");
        }
    }
}

/// Y rows of the GEMM on the f16 operands at `w`, `x` (+ `r0` rows), `m` rows.
#[allow(clippy::too_many_arguments)]
fn gemm(
    g: &mut Gpu,
    plan: usize,
    w: u64,
    x: u64,
    k: usize,
    n: usize,
    m: usize,
    r0: usize,
) -> Vec<f32> {
    let y = g.alloc(m * n * 4).unwrap();
    g.gemm(GemmCall {
        plan,
        w,
        x: x + (r0 * k * 2) as u64,
        y,
        m: m as u64,
    })
    .unwrap();
    bytes_f32s(&get(g, y, m * n * 4))
}

fn row_invariance(
    g: &mut Gpu,
    ty: GgmlType,
    n: usize,
    k: usize,
    counts: &[usize],
) -> (usize, Vec<f32>, Vec<f32>, Vec<f32>) {
    let mut r = Rng(11 + n as u64);
    let (bytes, _) = matrix(ty, n, k, &mut r);
    let wq = put(g, &bytes);
    let w = dequant(g, ty, wq, n, k, false);
    let m_all = 4096;
    let xs: Vec<f32> = (0..m_all * k).map(|_| r.unit()).collect();
    let xh: Vec<u8> = xs
        .iter()
        .flat_map(|&v| f32_to_f16(v).to_le_bytes())
        .collect();
    let x = put(g, &xh);
    let plan = g.gemm_plan(n as u64, k as u64, GemmType::F16).unwrap();
    println!("{ty} {n}x{k}: {}", g.gemm_describe(plan));
    let all = gemm(g, plan, w, x, k, n, m_all, 0);
    let mut differ = 0;
    for &m in counts {
        let got = gemm(g, plan, w, x, k, n, m, 0);
        let same = got == all[..m * n];
        // The same rows at an offset inside a call.
        let off = gemm(g, plan, w, x, k, n, m.min(m_all - 77), 77);
        let same_off = off == all[77 * n..(77 + off.len() / n) * n];
        if !(same && same_off) {
            differ += 1;
            println!("  m = {m}: rows equal {same}, at offset 77 {same_off}");
        }
    }
    let wh = bytes_u16s(&get(g, w, n * k * 2));
    let wf: Vec<f32> = wh.iter().map(|&h| f16_to_f32(h)).collect();
    let xf: Vec<f32> = xh
        .chunks_exact(2)
        .map(|c| f16_to_f32(u16::from_le_bytes([c[0], c[1]])))
        .collect();
    (differ, all, wf, xf)
}

const COUNTS: [usize; 18] = [
    1, 2, 3, 5, 7, 8, 16, 31, 64, 100, 127, 128, 255, 256, 512, 1000, 2048, 4095,
];

#[test]
fn pinned_gemm_rows_are_bitwise_equal_for_every_row_count() {
    let Some(mut g) = gpu() else { return };
    for (ty, n, k) in [
        (GgmlType::Q4K, 3584, 3584),
        (GgmlType::Q5_0, 896, 4864),
        (GgmlType::Q6K, 1024, 2048),
    ] {
        let (differ, all, wf, xf) = row_invariance(&mut g, ty, n, k, &COUNTS);
        assert_eq!(differ, 0, "{ty} {n}x{k}: {differ} row counts changed bits");
        // Accuracy against f64 over the same f16 operands, a few rows.
        let mut worst = 0f64;
        for t in [0usize, 1, 777, 4095] {
            let (mut num, mut den) = (0f64, 0f64);
            for o in 0..n {
                let want: f64 = (0..k)
                    .map(|i| wf[o * k + i] as f64 * xf[t * k + i] as f64)
                    .sum();
                let d = all[t * n + o] as f64 - want;
                num += d * d;
                den += want * want;
            }
            worst = worst.max((num / den).sqrt());
        }
        println!("{ty} {n}x{k}: rows of every count equal; worst relative error {worst:.2e}");
        assert!(worst <= 1e-5, "{ty}: {worst}");
    }
}

#[test]
fn unpinned_gemm_changes_bits_with_the_row_count() {
    std::env::set_var("MINFER_CUDA_GEMM_PIN", "0");
    let Some(mut g) = gpu() else { return };
    let (differ, ..) = row_invariance(&mut g, GgmlType::Q4K, 3584, 3584, &COUNTS);
    std::env::remove_var("MINFER_CUDA_GEMM_PIN");
    println!(
        "control: unpinned, {differ} of {} row counts changed bits",
        COUNTS.len()
    );
    assert!(
        differ > 0,
        "the unpinned heuristic changed no bits: the gate cannot see it"
    );
}
