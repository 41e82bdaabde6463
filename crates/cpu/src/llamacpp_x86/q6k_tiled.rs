//! Q6_K matmuls of 8 or more activation rows as llama.cpp's tiled path computes them
//! (`ggml-cpu/tiled/`, taken by `ggml_compute_forward_mul_mat` before anything else when
//! src0 is Q6_K outside a repack buffer and src1 has >= 8 rows).
//!
//! The driver cuts the output into 256x256 windows and 16x16 microtiles and walks K in
//! 256-element slabs (the narrow path for <= 16 rows reads several slabs per weight-row
//! stream, the standard path one slab at a time). Windows and microtiles split the outputs,
//! never K, and both paths visit the slabs of one output in order, each adding its partial
//! straight into the output's f32 accumulator (zeroed per window, stored unchanged). So per
//! output `y[t][r]`, with `s` the 16-element sub-blocks of super-block `b`:
//!
//! ```text
//! acc = 0
//! for b in 0..k/256:
//!     s1  = Σ_s scale[r][b][s] · Σ_{e in s} (q6[r][e] - 32) · q8[t][e]     (exact i32)
//!     acc = fma(f16(d[r][b]) · f32(s1), q8d[t][b], acc)                  (one mul, one fma)
//! y[t][r] = acc
//! ```
//!
//! The multiply `d · f32(s1)` is rounded on its own; only the product with the activation
//! scale is fused into the add. vec_dot ([`super::q6k`]) instead folds `q8d · d` first and
//! sums eight lanes, which is why its results differ in the last bits.
//!
//! Both builds of interest compute this same float sequence:
//! - `-mavx2` (AVX2 microkernel, `ACTBIAS`): the activation is stored +128 (xor 0x80),
//!   `maddubs(q8 + 128, q6 - 32)` then `madd` with the 16-bit scale, the +128 taken back out
//!   with the weight-side sum `128 · Σ_s scale_s · Σ (q6 - 32)`; then
//!   `_mm256_mul_ps(d, cvt(s1))` and an explicit `_mm256_fmadd_ps(res, q8d, buf)`.
//! - AVX-512 VNNI (`tiled_run_micro_vnni_8x16`): `dpbusd(q6, q8)` per sub-block, minus
//!   `32 · bsums_s` (the activation's stored 16-element sums), times the scale; then
//!   `_mm512_mul_ps(cvt(s1), d)` and `buf + res · q8d`, which GCC 12 `-O3` contracts into one
//!   `vfmadd213ps` (checked in the generated assembly of the q6_K instantiation).
//!
//! The integer sums agree whenever the Q8_K `bsums` are the sums of its quants (ggml's
//! quantizer always writes them so); for blocks where they are not, the `Avx512` flavour
//! takes the stored sums as its kernel does.

use super::LlamaCppX86;
use crate::ops::matmul::{par_row_tasks, Split};
use crate::ops::{KResult, KernelError};
use minfer_gguf::quants::f16_to_f32;

/// Fewest activation rows that take the tiled path (`ggml_tiled_min_batch`).
pub const MIN_BATCH: usize = 8;

const QK: usize = 256;
const W_BYTES: usize = 210;
const A_BYTES: usize = 292;
/// Weight rows unpacked together (one microtile's height).
const ROW_GROUP: usize = 16;

/// `out[t * m + r]` for the `n` Q8_K activation rows of `act_q8k` against the `m` Q6_K
/// weight rows of `w` (`k` elements each), on the calling thread.
pub fn matmul_q6k_tiled(
    simd: LlamaCppX86,
    w: &[u8],
    k: usize,
    m: usize,
    act_q8k: &[u8],
    n: usize,
    out: &mut [f32],
) -> KResult<()> {
    matmul_q6k_tiled_threads(simd, w, k, m, act_q8k, n, out, 1)
}

/// [`matmul_q6k_tiled`] with the weight rows split over up to `threads` threads; every output
/// is computed by one thread in one fixed order, so the result does not depend on `threads`.
#[allow(clippy::too_many_arguments)]
pub fn matmul_q6k_tiled_threads(
    simd: LlamaCppX86,
    w: &[u8],
    k: usize,
    m: usize,
    act_q8k: &[u8],
    n: usize,
    out: &mut [f32],
    threads: usize,
) -> KResult<()> {
    if !k.is_multiple_of(QK) {
        return Err(KernelError(format!(
            "tiled Q6_K matmul: k = {k} is not a multiple of {QK}"
        )));
    }
    let nb = k / QK;
    let need = [
        ("weight", w.len(), m * nb * W_BYTES),
        ("activation", act_q8k.len(), n * nb * A_BYTES),
        ("output", out.len(), n * m),
    ];
    for (what, got, want) in need {
        if got < want {
            return Err(KernelError(format!(
                "tiled Q6_K matmul {m}x{k} by {n} rows: {what} holds {got}, needs {want}"
            )));
        }
    }
    let acts = Activations::new(simd, &act_q8k[..n * nb * A_BYTES], n, nb);
    // Tasks of whole row groups (the driver's tasks are multiples of 16 rows, ROW_GROUP).
    par_row_tasks(out, m, n, Split::new(m, n, threads), |o| {
        let rows = o.rows();
        let mut unpacked = WeightRows::new(nb);
        let mut part = vec![0f32; ROW_GROUP * n];
        for r0 in rows.clone().step_by(ROW_GROUP) {
            let r1 = (r0 + ROW_GROUP).min(rows.end);
            unpacked.load(&w[r0 * nb * W_BYTES..r1 * nb * W_BYTES]);
            let dst = &mut part[..(r1 - r0) * n];
            unpacked.matmul(&acts, dst);
            for (i, r) in (r0..r1).enumerate() {
                for t in 0..n {
                    o.set(t, r, dst[i * n + t]);
                }
            }
        }
        Ok(())
    })
}

/// Q8_K activations widened for the integer dots.
struct Activations {
    n: usize,
    nb: usize,
    /// `q[t][e]` as i16 (row-major, `nb * 256` per row).
    q: Vec<i16>,
    /// `d[t][b]`.
    d: Vec<f32>,
    /// Per block `(t, b)`: `Σ_{e in s} q8 - bsums[s]` for the 16 sub-blocks, or `None` when
    /// all are 0 (always, for ggml-quantized data). Only the `Avx512` flavour reads `bsums`.
    bsum_excess: Vec<Option<[i32; 16]>>,
}

impl Activations {
    fn new(simd: LlamaCppX86, a: &[u8], n: usize, nb: usize) -> Self {
        let mut q = Vec::with_capacity(n * nb * QK);
        let mut d = Vec::with_capacity(n * nb);
        let mut bsum_excess = Vec::with_capacity(n * nb);
        for blk in a.chunks_exact(A_BYTES) {
            d.push(f32::from_le_bytes([blk[0], blk[1], blk[2], blk[3]]));
            let qs = &blk[4..4 + QK];
            q.extend(qs.iter().map(|&v| v as i8 as i16));
            let mut excess = [0i32; 16];
            if simd == LlamaCppX86::Avx512 {
                for (s, e) in excess.iter_mut().enumerate() {
                    let sum: i32 = qs[16 * s..16 * s + 16]
                        .iter()
                        .map(|&v| v as i8 as i32)
                        .sum();
                    let stored = i16::from_le_bytes([blk[260 + 2 * s], blk[261 + 2 * s]]) as i32;
                    *e = sum - stored;
                }
            }
            bsum_excess.push(excess.iter().any(|&e| e != 0).then_some(excess));
        }
        Self {
            n,
            nb,
            q,
            d,
            bsum_excess,
        }
    }
}

/// Up to [`ROW_GROUP`] Q6_K weight rows unpacked: each element `scale_s · (q6 - 32)` as i16
/// (|v| <= 128 · 32, so the per-sub-block scale is folded in exactly).
struct WeightRows {
    nb: usize,
    rows: usize,
    /// `q[i][e]`, `nb * 256` per row.
    q: Vec<i16>,
    /// `d[i][b]`.
    d: Vec<f32>,
    /// `scale[i][b * 16 + s]`.
    scale: Vec<i32>,
}

impl WeightRows {
    fn new(nb: usize) -> Self {
        Self {
            nb,
            rows: 0,
            q: vec![0; ROW_GROUP * nb * QK],
            d: vec![0.0; ROW_GROUP * nb],
            scale: vec![0; ROW_GROUP * nb * 16],
        }
    }

    /// Unpacks the whole rows in `w` (at most [`ROW_GROUP`]).
    fn load(&mut self, w: &[u8]) {
        let row_bytes = self.nb * W_BYTES;
        self.rows = w.len() / row_bytes;
        for (bi, blk) in w.chunks_exact(W_BYTES).enumerate() {
            let (ql, qh) = (&blk[0..128], &blk[128..192]);
            self.d[bi] = f16_to_f32(u16::from_le_bytes([blk[208], blk[209]]));
            let sc: [i32; 16] = std::array::from_fn(|s| blk[192 + s] as i8 as i32);
            self.scale[bi * 16..bi * 16 + 16].copy_from_slice(&sc);
            let q = &mut self.q[bi * QK..(bi + 1) * QK];
            // Element 128h + 32c + l: the low (c < 2) or high nibble of ql[64h + 32(c % 2) + l],
            // with bits 2c..2c+2 of qh[32h + l] on top (ggml's Q6_K layout).
            for h in 0..2 {
                for c in 0..4 {
                    for l in 0..32 {
                        let byte = ql[64 * h + 32 * (c & 1) + l];
                        let low = if c < 2 { byte & 0x0f } else { byte >> 4 };
                        let high = (qh[32 * h + l] >> (2 * c)) & 3;
                        let e = 128 * h + 32 * c + l;
                        let v = (low | high << 4) as i32 - 32;
                        q[e] = (sc[e / 16] * v) as i16;
                    }
                }
            }
        }
    }

    /// `dst[i * n + t]` for the loaded rows `i` and every activation row `t`.
    fn matmul(&self, a: &Activations, dst: &mut [f32]) {
        let (n, nb) = (a.n, self.nb);
        dst.fill(0.0);
        for b in 0..nb {
            for i in 0..self.rows {
                let wq = &self.q[(i * nb + b) * QK..(i * nb + b + 1) * QK];
                let wd = self.d[i * nb + b];
                let sc = &self.scale[(i * nb + b) * 16..(i * nb + b + 1) * 16];
                for t in 0..n {
                    let aq = &a.q[(t * nb + b) * QK..(t * nb + b + 1) * QK];
                    let mut s1 = dot256(wq, aq);
                    if let Some(excess) = &a.bsum_excess[t * nb + b] {
                        // VNNI subtracts 32 · bsums_s where the weight-side sum uses the quants.
                        s1 += 32 * sc.iter().zip(excess).map(|(s, e)| s * e).sum::<i32>();
                    }
                    let acc = &mut dst[i * n + t];
                    *acc = (wd * s1 as f32).mul_add(a.d[t * a.nb + b], *acc);
                }
            }
        }
    }
}

/// Σ w·q over one super-block; exact (|Σ| <= 256 · 4096 · 128 < 2^31).
#[inline]
fn dot256(w: &[i16], q: &[i16]) -> i32 {
    w.iter().zip(q).map(|(&w, &q)| w as i32 * q as i32).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use minfer_gguf::quants::random_blocks;
    use minfer_gguf::GgmlType;

    #[test]
    fn bad_shapes_are_typed_errors() {
        let (w, a) = (vec![0u8; W_BYTES], vec![0u8; A_BYTES * 8]);
        let mut out = vec![0f32; 8];
        let r = matmul_q6k_tiled(LlamaCppX86::Avx2, &w, 128, 1, &a, 8, &mut out);
        assert!(r.unwrap_err().0.contains("multiple of 256"));
        let r = matmul_q6k_tiled(LlamaCppX86::Avx2, &w, 256, 2, &a, 8, &mut out);
        assert!(r.unwrap_err().0.contains("weight holds 210, needs 420"));
    }

    /// With `bsums` that are not the sums of the quants, the AVX2 kernel (which never reads
    /// them) and the VNNI kernel (`Σ scale · (Σ q6·q8 - 32 · bsums)`) part ways; each flavour
    /// follows its kernel. Expected values from the two kernels' formulas, written out per
    /// element for one super-block (control: reading bsums in both flavours fails the Avx2
    /// assertion).
    #[test]
    fn flavours_follow_their_kernels_on_inconsistent_bsums() {
        let w = random_blocks(GgmlType::Q6K, 1, 7);
        let mut a = random_blocks(GgmlType::Q8K, 8, 8);
        a[260] = a[260].wrapping_add(3); // bsums[0] of row 0 off by 3
        let wd = f16_to_f32(u16::from_le_bytes([w[208], w[209]]));
        let q6 = |e: usize| {
            let (h, c, l) = (e / 128, (e % 128) / 32, e % 32);
            let byte = w[64 * h + 32 * (c % 2) + l];
            let low = if c < 2 { byte & 15 } else { byte >> 4 };
            (low | ((w[128 + 32 * h + l] >> (2 * c)) & 3) << 4) as i32
        };
        let sc = |s: usize| w[192 + s] as i8 as i32;
        let (q8, ad) = (
            |e: usize| a[4 + e] as i8 as i32,
            f32::from_le_bytes([a[0], a[1], a[2], a[3]]),
        );
        let bsum = |s: usize| i16::from_le_bytes([a[260 + 2 * s], a[261 + 2 * s]]) as i32;
        let avx2: i32 = (0..256).map(|e| sc(e / 16) * (q6(e) - 32) * q8(e)).sum();
        let vnni: i32 = (0..16)
            .map(|s| {
                sc(s) * ((16 * s..16 * s + 16).map(|e| q6(e) * q8(e)).sum::<i32>() - 32 * bsum(s))
            })
            .sum();
        assert_ne!(avx2, vnni);
        for (simd, s1) in [(LlamaCppX86::Avx2, avx2), (LlamaCppX86::Avx512, vnni)] {
            let mut out = vec![0f32; 8];
            matmul_q6k_tiled(simd, &w, 256, 1, &a, 8, &mut out).unwrap();
            assert_eq!(
                out[0].to_bits(),
                ((wd * s1 as f32) * ad).to_bits(),
                "{simd:?}"
            );
        }
    }
}
