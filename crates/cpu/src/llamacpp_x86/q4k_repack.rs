//! Q4_K weights through ggml's x86 repack (`block_q4_Kx8`, `ggml_gemv_q4_K_8x8_q8_K` /
//! `ggml_gemm_q4_K_8x8_q8_K`, activations by `ggml_quantize_mat_q8_K_4x8` in groups of four
//! rows and `quantize_row_q8_K` for the rest), as llama.cpp runs every Q4_K matrix whose row
//! count is a multiple of 8 on AVX2 and AVX-512 machines.
//!
//! What the kernels compute, per output (activation row t, weight row r):
//! - The repack interleaves eight weight rows byte-wise, but every SIMD lane of both kernels
//!   holds one weight row, so the integer part is the plain per-row sum: for sub-block s
//!   (32 elements) `scale[s] · Σ q4 · q8` and `min[s] · Σ q8` (the latter from the activation's
//!   16-element `bsums`, added in pairs). Products and sums are exact in the kernels' int16 /
//!   int32 lanes (|q4 · q8| ≤ 15 · 127, at most 16 such terms per int16 lane).
//! - GEMV (the last `n % 4` rows): one fused multiply-add per 256-element super-block,
//!   `acc = fma(f32(Σ_s scale·dot), d_r · d_a, acc)` and `accm = fma(f32(Σ_s min·bsum),
//!   dmin_r · d_a, accm)`; the output is `acc - accm`. It has only an AVX2 body.
//! - GEMM (rows in groups of four): the same, but one fused multiply-add per pair of
//!   sub-blocks (64 elements, four per super-block). Its AVX-512 body (16 weight rows per
//!   vector) does per lane exactly what the AVX2 body does, so both flavours agree here.
//! - Activations: groups of four rows go through `ggml_quantize_mat_q8_K_4x8`, whose AVX2 code
//!   (also what AVX-512 builds run) picks `iscale = -127 / amax` when *any* element equals
//!   `+amax` and `+127 / amax` otherwise; `quantize_row_q8_K` (its `_ref`) takes the sign of
//!   the *first* element with the largest magnitude. Both round half to even and store
//!   `d = 1 / iscale`. The two rules differ only in the sign of `iscale` when `+amax` and
//!   `-amax` both occur, which negates every quant, sum and `d` of the block and leaves each
//!   float product (and so the output) bit-identical; both rules are still reproduced as
//!   written.
//!
//! So [`LlamaCppX86::Avx2`] and [`LlamaCppX86::Avx512`] run the same arithmetic for this path.

use super::LlamaCppX86;
use crate::ops::matmul::{par_row_tasks, Split};
use crate::ops::{KResult, KernelError};
use minfer_gguf::quants::f16_to_f32;

/// Elements per super-block.
const QK: usize = 256;
/// Bytes of one Q4_K block: d f16, dmin f16, scales[12], qs[128].
const W_BYTES: usize = 144;
/// Weight rows one repacked `block_q4_Kx8` interleaves (and one kernel lane group covers).
const ROWS_INTERLEAVED: usize = 8;
/// Activation rows `ggml_quantize_mat_q8_K_4x8` and the GEMM take at a time.
const GEMM_ROWS: usize = 4;

/// Which of ggml's two Q8_K quantizers encodes a row (see the module docs).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum SignRule {
    /// `ggml_quantize_mat_q8_K_4x8` (AVX2 body): negative iscale if any element is `+amax`.
    AnyPositiveMax,
    /// `quantize_row_q8_K_ref`: the sign of the first element of largest magnitude.
    FirstMax,
}

/// One activation super-block as the Q8_K quantizers leave it.
#[derive(Clone)]
struct ActBlock {
    d: f32,
    q: [i8; QK],
    /// Σ q over each 32-element sub-block (the kernels add the 16-element `bsums` in pairs).
    sub_sums: [i32; 8],
}

fn quantize_block(x: &[f32], rule: SignRule) -> ActBlock {
    let mut amax = 0f32;
    let mut first_max = 0f32;
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            first_max = v;
        }
    }
    let mut b = ActBlock {
        d: 0.0,
        q: [0; QK],
        sub_sums: [0; 8],
    };
    if amax == 0.0 {
        return b;
    }
    let iscale = match rule {
        SignRule::FirstMax => -127.0 / first_max,
        SignRule::AnyPositiveMax if x.contains(&amax) => -127.0 / amax,
        SignRule::AnyPositiveMax => 127.0 / amax,
    };
    for (q, &v) in b.q.iter_mut().zip(x) {
        // Round half to even (`_mm256_round_ps` / `nearest_int`); |iscale · v| ≤ 127 rounds
        // into range, so the `_ref` clamp and the 4x8 code's saturating packs never act.
        *q = ((iscale * v).round_ties_even() as i32).clamp(-128, 127) as i8;
    }
    b.d = 1.0 / iscale;
    for (s, chunk) in b.q.chunks_exact(32).enumerate() {
        b.sub_sums[s] = chunk.iter().map(|&q| q as i32).sum();
    }
    b
}

/// One weight super-block, unpacked once per matmul call.
struct WeightBlock {
    d: f32,
    dmin: f32,
    scales: [i32; 8],
    mins: [i32; 8],
    /// Byte l of 32-byte chunk c: low nibble is element 64c + l, high nibble 64c + 32 + l.
    qs: [u8; 128],
}

fn unpack_weight_block(b: &[u8]) -> WeightBlock {
    let (sc, mn) = minfer_gguf::quants::unpack_scale_min_k4(&b[4..16]);
    let mut qs = [0u8; 128];
    qs.copy_from_slice(&b[16..144]);
    WeightBlock {
        d: f16_to_f32(u16::from_le_bytes([b[0], b[1]])),
        dmin: f16_to_f32(u16::from_le_bytes([b[2], b[3]])),
        scales: sc.map(i32::from),
        mins: mn.map(i32::from),
        qs,
    }
}

/// Σ over 32 bytes of (low nibble · lo[l]) and (high nibble · hi[l]), exact.
#[inline]
fn nibble_dots(qs: &[u8], lo: &[i8], hi: &[i8]) -> (i32, i32) {
    let (mut a, mut b) = (0i32, 0i32);
    for l in 0..32 {
        a += (qs[l] & 0x0f) as i32 * lo[l] as i32;
        b += (qs[l] >> 4) as i32 * hi[l] as i32;
    }
    (a, b)
}

/// Integer parts of one super-block, per pair of sub-blocks (64 elements):
/// (Σ scale · dot, Σ min · sub-block sum).
#[inline]
fn pair_sums(w: &WeightBlock, a: &ActBlock) -> [(i32, i32); 4] {
    let mut out = [(0, 0); 4];
    for (c, o) in out.iter_mut().enumerate() {
        let (lo, hi) = nibble_dots(
            &w.qs[32 * c..32 * c + 32],
            &a.q[64 * c..64 * c + 32],
            &a.q[64 * c + 32..64 * c + 64],
        );
        let (s0, s1) = (2 * c, 2 * c + 1);
        o.0 = w.scales[s0] * lo + w.scales[s1] * hi;
        o.1 = w.mins[s0] * a.sub_sums[s0] + w.mins[s1] * a.sub_sums[s1];
    }
    out
}

/// `ggml_gemv_q4_K_8x8_q8_K`'s lane for one weight row: one fma per super-block.
fn dot_gemv(w: &[WeightBlock], a: &[ActBlock]) -> f32 {
    let (mut acc, mut accm) = (0f32, 0f32);
    for (w, a) in w.iter().zip(a) {
        let (mut isum, mut imin) = (0i32, 0i32);
        for (s, m) in pair_sums(w, a) {
            isum += s;
            imin += m;
        }
        acc = (isum as f32).mul_add(w.d * a.d, acc);
        accm = (imin as f32).mul_add(w.dmin * a.d, accm);
    }
    acc - accm
}

/// `ggml_gemm_q4_K_8x8_q8_K`'s lane for one (activation row, weight row): one fma per pair of
/// sub-blocks.
fn dot_gemm(w: &[WeightBlock], a: &[ActBlock]) -> f32 {
    let (mut acc, mut accm) = (0f32, 0f32);
    for (w, a) in w.iter().zip(a) {
        let (dd, dm) = (w.d * a.d, w.dmin * a.d);
        for (s, m) in pair_sums(w, a) {
            acc = (s as f32).mul_add(dd, acc);
            accm = (m as f32).mul_add(dm, accm);
        }
    }
    acc - accm
}

/// `out[t][o]` for the `x.len() / k` rows of `x` against the `m` Q4_K rows in `w`.
pub fn matmul(
    simd: LlamaCppX86,
    w: &[u8],
    k: usize,
    m: usize,
    x: &[f32],
    out: &mut [f32],
) -> KResult<()> {
    matmul_threads(simd, w, k, m, x, out, 1)
}

/// [`matmul`] on up to `threads` threads (the matmul driver's split of the weight rows,
/// [`crate::ops::matmul`]); every output is one weight row's own loop, so the result does not
/// depend on `threads`.
pub fn matmul_threads(
    simd: LlamaCppX86,
    w: &[u8],
    k: usize,
    m: usize,
    x: &[f32],
    out: &mut [f32],
    threads: usize,
) -> KResult<()> {
    // Both builds run the same arithmetic on this path (module docs).
    let (LlamaCppX86::Avx2 | LlamaCppX86::Avx512) = simd;
    if k == 0 || !k.is_multiple_of(QK) {
        return Err(KernelError(format!(
            "llama.cpp x86 repacked Q4_K: row length {k} is not a positive multiple of {QK}"
        )));
    }
    if !m.is_multiple_of(ROWS_INTERLEAVED) {
        return Err(KernelError(format!(
            "llama.cpp x86 repacked Q4_K: {m} weight rows are not a multiple of \
             {ROWS_INTERLEAVED} (llama.cpp would use its plain Q4_K dot, which this mode lacks)"
        )));
    }
    let nb = k / QK;
    let n = x.len() / k;
    if w.len() < m * nb * W_BYTES || x.len() != n * k || out.len() < n * m {
        return Err(KernelError(format!(
            "llama.cpp x86 repacked Q4_K: {m} x {k} weights need {} bytes (got {}), {} \
             activations are not whole rows of {k}, or the output holds {} < {}",
            m * nb * W_BYTES,
            w.len(),
            x.len(),
            out.len(),
            n * m
        )));
    }
    // ggml quantizes rows 0..n - n % 4 four at a time for the GEMM, the rest one by one.
    let n_gemm = n - n % GEMM_ROWS;
    let acts: Vec<ActBlock> = x
        .chunks_exact(QK)
        .enumerate()
        .map(|(i, xb)| {
            let rule = if i / nb < n_gemm {
                SignRule::AnyPositiveMax
            } else {
                SignRule::FirstMax
            };
            quantize_block(xb, rule)
        })
        .collect();
    par_row_tasks(out, m, n, Split::new(m, n, threads), |o| {
        for r in o.rows() {
            let wrow: Vec<WeightBlock> = w[r * nb * W_BYTES..(r + 1) * nb * W_BYTES]
                .chunks_exact(W_BYTES)
                .map(unpack_weight_block)
                .collect();
            for t in 0..n {
                let a = &acts[t * nb..(t + 1) * nb];
                let v = if t < n_gemm {
                    dot_gemm(&wrow, a)
                } else {
                    dot_gemv(&wrow, a)
                };
                o.set(t, r, v);
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sign_rules_differ_only_in_sign() {
        let mut x = [0.25f32; QK];
        x[3] = -2.0;
        x[200] = 2.0;
        let a = quantize_block(&x, SignRule::FirstMax);
        let b = quantize_block(&x, SignRule::AnyPositiveMax);
        // first max is -2 -> iscale = +63.5; any +2 -> iscale = -63.5
        assert_eq!(a.d, -b.d);
        assert!(a.d > 0.0);
        for (p, q) in a.q.iter().zip(&b.q) {
            assert_eq!(*p as i32, -(*q as i32));
        }
    }

    /// GEMV and GEMM differ only where the fma splits; with one sub-block pair non-zero they
    /// agree, with several they may not (control for the split: both orders are exercised by
    /// tests/ggml_q4k.rs against llama.cpp).
    #[test]
    fn gemv_and_gemm_agree_on_one_pair() {
        let mut wb = [0u8; W_BYTES];
        wb[0..2].copy_from_slice(&minfer_gguf::quants::f32_to_f16(0.01).to_le_bytes());
        wb[4] = 3; // scale of sub-block 0
        for b in &mut wb[16..48] {
            *b = 0x57;
        }
        let w = [unpack_weight_block(&wb)];
        let x: Vec<f32> = (0..QK).map(|i| (i as f32 * 0.37).sin()).collect();
        let a = [quantize_block(&x, SignRule::FirstMax)];
        assert_eq!(dot_gemv(&w, &a).to_bits(), dot_gemm(&w, &a).to_bits());
    }

    #[test]
    fn refuses_rows_not_multiple_of_eight() {
        let w = vec![0u8; 4 * W_BYTES];
        let mut out = [0f32; 4];
        let e = matmul(LlamaCppX86::Avx2, &w, QK, 4, &[0.0; QK], &mut out).unwrap_err();
        assert!(e.0.contains("not a multiple of 8"), "{}", e.0);
    }
}
