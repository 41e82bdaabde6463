//! Matmul with llama.cpp's x86 arithmetic, through the shared driver ([`crate::ops::matmul`]):
//! its shape checks, activation encoding, task split and bias, with the per-task kernels of
//! this module. Activations are encoded as ggml's x86 quantizers do (Q8_0 / Q8_1 round half to
//! even at 127 / amax, Q8_K its reference rule), then each output is the per-type dot of
//! [`super::legacy`] / [`super::q6k`], or a batch goes through [`super::q6k_tiled`] (Q6_K, 8
//! rows or more) or the repacked Q4_K path of [`super::q4k_repack`]. Which ggml path a batch
//! takes (vec_dot, tinyBLAS, GEMV/GEMM) does not change a dot's float order for the legacy
//! types, so one function per type serves all.

use super::{legacy, q4k_repack, q6k, q6k_tiled, LlamaCppX86};
use crate::ops::matmul::{
    add_bias, encode_activations, par_row_tasks, with_scratch, Layout, Shape, Split, Weight,
};
use crate::ops::{KResult, KernelError};
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

/// `out[t][o] = Σ_i w[o][i] · x[t][i] (+ bias[o])` for the `x.len() / w.k` rows of `x`.
pub fn matmul(
    simd: LlamaCppX86,
    w: &Weight,
    x: &[f32],
    bias: Option<&[f32]>,
    out: &mut [f32],
    threads: usize,
) -> KResult<()> {
    let shape = Shape::check(w, x, bias, out)?;
    let Shape { k, m, nt, wrb } = shape;
    if w.layout != Layout::Rows {
        return Err(KernelError(format!(
            "llama.cpp's arithmetic reads plain rows, not the {:?} layout",
            w.layout
        )));
    }
    let (wb, x, out) = (&w.bytes[..wrb * m], &x[..nt * k], &mut out[..nt * m]);
    let dot: DotFn = match w.ty {
        GgmlType::Q4K => {
            // The repack quantizes its own activations: two sign rules (q4k_repack docs).
            q4k_repack::matmul_threads(simd, wb, k, m, x, out, threads)?;
            add_bias(bias, m, out);
            return Ok(());
        }
        GgmlType::Q4_1 => avx2_dot(w.ty).unwrap_or(legacy::dot_q4_1),
        GgmlType::Q5_0 => avx2_dot(w.ty).unwrap_or(legacy::dot_q5_0),
        GgmlType::Q8_0 => avx2_dot(w.ty).unwrap_or(legacy::dot_q8_0),
        GgmlType::Q6K => avx2_dot(w.ty).unwrap_or(q6k::dot_q6_k),
        other => {
            return Err(KernelError(format!(
                "llama.cpp x86 numerics have no {other} matmul (they cover Q4_1, Q5_0, Q8_0, \
                 Q4_K and Q6_K weights)"
            )))
        }
    };
    let at = quants::vec_dot_type(w.ty);
    let arb = shape.act_row_bytes(at)?;
    with_scratch(|sc| {
        // ggml's x86 activation quantizers (`quants::quantize_act_row`) through the SIMD
        // ones, which give the same bytes for Q8_0, Q8_1 and Q8_K on every instruction set
        // (`tests/simd_exact.rs`, `quantize_act_is_byte_identical`).
        encode_activations(at, x, k, arb, nt, sc, false, threads)?;
        let act = &sc.act;
        if w.ty == GgmlType::Q6K && nt >= q6k_tiled::MIN_BATCH {
            // ggml's tiled path (its own float order) takes Q6_K batches of >= 8 rows.
            return q6k_tiled::matmul_q6k_tiled_threads(simd, wb, k, m, act, nt, out, threads);
        }
        par_row_tasks(out, m, nt, Split::new(m, nt, threads), |o| {
            for r in o.rows() {
                let wr = &wb[r * wrb..(r + 1) * wrb];
                for t in 0..nt {
                    o.set(t, r, dot(wr, &act[t * arb..(t + 1) * arb]));
                }
            }
            Ok(())
        })
    })?;
    add_bias(bias, m, out);
    Ok(())
}

/// The AVX2 form of a dot when this machine has AVX2, FMA and F16C (bit-identical to the
/// scalar one, `avx2::tests`).
#[cfg(target_arch = "x86_64")]
fn avx2_dot(ty: GgmlType) -> Option<DotFn> {
    use super::avx2;
    if !crate::cpu_features::avx2_fma_f16c() {
        return None;
    }
    // SAFETY (each wrapper): this machine has AVX2, FMA and F16C (checked just above).
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
