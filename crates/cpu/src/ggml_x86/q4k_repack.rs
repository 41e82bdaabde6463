//! Q4_K weights through ggml's x86 repack (`block_q4_Kx8`, `ggml_gemv_q4_K_8x8_q8_K` /
//! `ggml_gemm_q4_K_8x8_q8_K`, activations by `ggml_quantize_mat_q8_K_4x8` in groups of four
//! rows and `quantize_row_q8_K` for the rest), as llama.cpp runs every Q4_K matrix whose row
//! count is a multiple of 8 on AVX2 and AVX-512 machines.

use super::GgmlSimd;
use crate::ops::{KResult, KernelError};

/// `out[t][o]` for the `x.len() / k` rows of `x` against the `m` Q4_K rows in `w`.
pub fn matmul(
    simd: GgmlSimd,
    w: &[u8],
    k: usize,
    m: usize,
    x: &[f32],
    out: &mut [f32],
) -> KResult<()> {
    let _ = (simd, w, k, m, x, out);
    Err(KernelError(
        "llama.cpp x86 numerics: the repacked Q4_K path is not implemented yet".into(),
    ))
}
