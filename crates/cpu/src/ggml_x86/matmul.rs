//! Matmul with llama.cpp's x86 arithmetic: activations quantized by ggml's x86 quantizers
//! (Q8_0 / Q8_1 round half to even at 127 / amax, Q8_K its reference rule), then each output
//! the per-type dot of [`super::legacy`] / [`super::q6k`], or the repacked Q4_K path of
//! [`super::q4k_repack`]. Which ggml path a batch takes (vec_dot, tinyBLAS, GEMV/GEMM) does not
//! change a dot's float order for the legacy types, so one function per type serves all.

use super::{legacy, q4k_repack, q6k, q6k_tiled, GgmlSimd};
use crate::ops::matmul::Weight;
use crate::ops::{KResult, KernelError};
use crate::threads::par_tasks;
use minfer_gguf::{quants, GgmlType};

/// Whether this arithmetic exists for a `rows` x `k` weight of `ty`: Q4_K only through the
/// repack, which llama.cpp uses for row counts that are multiples of 8 (others would take its
/// plain `vec_dot_q4_K_q8_K`, not reproduced here).
pub fn supports_weight(ty: GgmlType, k: usize, rows: usize) -> bool {
    match ty {
        GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::Q6K => true,
        GgmlType::Q4K => rows.is_multiple_of(8) && k.is_multiple_of(256),
        _ => false,
    }
}

/// One weight row times one encoded activation row.
type DotFn = fn(&[u8], &[u8]) -> f32;

/// A raw output pointer shared by tasks that write disjoint elements.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: tasks write disjoint elements and finish before `matmul` returns.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl OutPtr {
    fn at(self, i: usize) -> *mut f32 {
        self.0.wrapping_add(i)
    }
}

/// Weight rows per task.
const ROWS_PER_TASK: usize = 32;

/// `out[t][o] = Σ_i w[o][i] · x[t][i] (+ bias[o])` for the `x.len() / w.k` rows of `x`.
pub fn matmul(
    simd: GgmlSimd,
    w: &Weight,
    x: &[f32],
    bias: Option<&[f32]>,
    out: &mut [f32],
    threads: usize,
) -> KResult<()> {
    let (k, m) = (w.k, w.m);
    let nt = x.len().checked_div(k).unwrap_or(0);
    if out.len() < nt * m || bias.is_some_and(|b| b.len() != m) {
        return Err(KernelError(format!(
            "matmul of {nt} rows into {m} outputs: output holds {}, bias {:?}",
            out.len(),
            bias.map(<[f32]>::len)
        )));
    }
    let wrb =
        w.ty.row_bytes(k as u64)
            .ok_or_else(|| KernelError(format!("{k} weights do not fill whole {} blocks", w.ty)))?
            as usize;
    if w.bytes.len() < wrb * m {
        return Err(KernelError(format!(
            "weight holds {} bytes, {m} rows of {wrb} need {}",
            w.bytes.len(),
            wrb * m
        )));
    }
    if w.ty == GgmlType::Q6K && nt >= q6k_tiled::MIN_BATCH {
        // ggml's tiled path (its own float order) takes Q6_K batches of >= 8 rows.
        let (wb, o) = (&w.bytes[..wrb * m], &mut out[..nt * m]);
        q6k_tiled::matmul_f32(simd, wb, k, m, &x[..nt * k], o, threads)?;
        add_bias(bias, m, o);
        return Ok(());
    }
    let dot: DotFn = match w.ty {
        GgmlType::Q4_1 => simd_or(legacy::dot_q4_1, avx2_dot(w.ty)),
        GgmlType::Q5_0 => simd_or(legacy::dot_q5_0, avx2_dot(w.ty)),
        GgmlType::Q8_0 => simd_or(legacy::dot_q8_0, avx2_dot(w.ty)),
        GgmlType::Q6K => simd_or(q6k::dot_q6_k, avx2_dot(w.ty)),
        GgmlType::Q4K => {
            q4k_repack::matmul_threads(
                simd,
                &w.bytes[..wrb * m],
                k,
                m,
                &x[..nt * k],
                &mut out[..nt * m],
                threads,
            )?;
            add_bias(bias, m, &mut out[..nt * m]);
            return Ok(());
        }
        other => {
            return Err(KernelError(format!(
                "llama.cpp x86 numerics have no {other} matmul (they cover Q4_1, Q5_0, Q8_0, \
                 Q4_K and Q6_K weights)"
            )))
        }
    };
    let at = quants::vec_dot_type(w.ty);
    let arb = at.row_bytes(k as u64).unwrap_or(0) as usize;
    let mut act = vec![0u8; arb * nt];
    for (xr, ar) in x.chunks_exact(k).zip(act.chunks_exact_mut(arb)) {
        quants::quantize_act_row(at, xr, ar)?;
    }
    let outp = OutPtr(out.as_mut_ptr());
    let act = &act;
    par_tasks(m.div_ceil(ROWS_PER_TASK), threads, |task| {
        let rows = task * ROWS_PER_TASK..((task + 1) * ROWS_PER_TASK).min(m);
        for r in rows {
            let wr = &w.bytes[r * wrb..(r + 1) * wrb];
            for t in 0..nt {
                let v = dot(wr, &act[t * arb..(t + 1) * arb]);
                // SAFETY: element t * m + r < nt * m <= out.len() (checked above); each
                // (t, r) is written by the one task that owns row r.
                unsafe { *outp.at(t * m + r) = v };
            }
        }
    });
    add_bias(bias, m, &mut out[..nt * m]);
    Ok(())
}

/// The AVX2 form of a dot when this machine has AVX2, FMA and F16C (bit-identical, `avx2::tests`).
fn simd_or(scalar: DotFn, simd: Option<DotFn>) -> DotFn {
    simd.unwrap_or(scalar)
}

#[cfg(target_arch = "x86_64")]
fn avx2_dot(ty: GgmlType) -> Option<DotFn> {
    use super::avx2;
    if !(is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c"))
    {
        return None;
    }
    // SAFETY (each wrapper): AVX2, FMA and F16C were detected on this machine just above.
    let f: DotFn = match ty {
        GgmlType::Q4_1 => |w, a| unsafe { avx2::dot_q4_1(w, a) },
        GgmlType::Q5_0 => |w, a| unsafe { avx2::dot_q5_0(w, a) },
        GgmlType::Q8_0 => |w, a| unsafe { avx2::dot_q8_0(w, a) },
        GgmlType::Q6K => |w, a| unsafe { avx2::dot_q6_k(w, a) },
        _ => return None,
    };
    Some(f)
}

#[cfg(not(target_arch = "x86_64"))]
fn avx2_dot(_: GgmlType) -> Option<DotFn> {
    None
}

/// ggml adds a bias as its own op after the matmul: one f32 add per output.
fn add_bias(bias: Option<&[f32]>, m: usize, out: &mut [f32]) {
    if let Some(b) = bias {
        for row in out.chunks_exact_mut(m) {
            for (o, &b) in row.iter_mut().zip(b) {
                *o += b;
            }
        }
    }
}
