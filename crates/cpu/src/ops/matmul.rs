//! Quantized matmul: `out[t][o] = Σ_i w[o][i] · x[t][i]`.
//!
//! Activations are encoded once per op in the weight type's `vec_dot_type` (Q8_0, Q8_1 or
//! Q8_K for quantized weights, as llama.cpp does); output rows are split across threads,
//! and each weight row is read once for all tokens.

use super::{KResult, KernelError};
use crate::dot;
use crate::threads::par_ranges;
use minfer_gguf::{quants, GgmlType};

pub struct Weight<'a> {
    pub ty: GgmlType,
    /// Input dim (elements per row).
    pub k: usize,
    /// Output dim (rows).
    pub m: usize,
    pub bytes: &'a [u8],
}

/// Encodes `n_tokens` rows of `k` activations in `ty`'s vec_dot type.
pub fn quantize_activations(ty: GgmlType, x: &[f32], k: usize) -> KResult<(Vec<u8>, usize)> {
    let at = quants::vec_dot_type(ty);
    let arb = at
        .row_bytes(k as u64)
        .ok_or_else(|| KernelError(format!("{k} activations do not fill whole {at} blocks")))?
        as usize;
    let nt = x.len() / k;
    let mut out = vec![0u8; arb * nt];
    for (xr, or) in x.chunks_exact(k).zip(out.chunks_exact_mut(arb)) {
        crate::simd::quantize_act(at, xr, or)?;
    }
    Ok((out, arb))
}

/// `x`: `[n_tokens][k]`, `out`: `[n_tokens][m]`, optional f32 `bias` of `m`.
pub fn matmul(
    w: &Weight,
    x: &[f32],
    bias: Option<&[f32]>,
    out: &mut [f32],
    threads: usize,
) -> KResult<()> {
    let (k, m) = (w.k, w.m);
    let nt = x.len() / k;
    let wrb =
        w.ty.row_bytes(k as u64)
            .ok_or_else(|| KernelError(format!("{k} is not a whole number of {} blocks", w.ty)))?
            as usize;
    if w.bytes.len() < wrb * m {
        return Err(KernelError(format!(
            "weight holds {} bytes, {m} rows of {k} {} need {}",
            w.bytes.len(),
            w.ty,
            wrb * m
        )));
    }
    let (act, arb) = quantize_activations(w.ty, x, k)?;
    let kernel = dot::RowKernel::for_type(w.ty);
    // Enough rows per thread to amortise the spawn.
    let threads = threads.min(m.div_ceil(64)).max(1);
    let parts = par_ranges(m, threads, |rows| -> KResult<Vec<f32>> {
        let mut local = vec![0f32; rows.len() * nt];
        for (ri, o) in rows.clone().enumerate() {
            let wr = &w.bytes[o * wrb..(o + 1) * wrb];
            for t in 0..nt {
                local[ri * nt + t] = kernel.dot(k, wr, &act[t * arb..(t + 1) * arb])?;
            }
        }
        Ok(local)
    });
    let mut o0 = 0;
    for part in parts {
        let part = part?;
        let n_rows = part.len() / nt.max(1);
        for ri in 0..n_rows {
            for t in 0..nt {
                out[t * m + o0 + ri] = part[ri * nt + t];
            }
        }
        o0 += n_rows;
    }
    if let Some(b) = bias {
        for row in out.chunks_exact_mut(m) {
            for (o, bv) in row.iter_mut().zip(b) {
                *o += bv;
            }
        }
    }
    Ok(())
}
