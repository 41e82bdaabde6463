//! llama.cpp's x86 CPU arithmetic, reproduced float operation for float operation.
//!
//! minfer's own kernels ([`crate::ops`], [`crate::simd`]) fix one float order that every
//! instruction set reproduces bit for bit. llama.cpp's CPU build (ggml-cpu, commit 0c1e570)
//! has a different order per kernel: per-block integer sums split into 8 f32 lanes with a
//! fused multiply-add per block and a horizontal sum at the end, a repacked Q4_K path, its own
//! SIMD `expf` in SiLU, f16 flash attention with 8- or 16-lane dots. Because quantized
//! activations turn any last-bit difference into a different Q8 code at the next matmul, two
//! correct engines disagree by several hundredths in top-5 probabilities after a few layers;
//! only the same arithmetic gives the same probabilities.
//!
//! This module is that arithmetic, written from the kernels' documented structure as plain
//! scalar Rust (lanes are arrays), for the ops the Qwen2/LLaMA graphs of the demo models use:
//! Q4_1, Q5_0, Q8_0, Q6_K matmuls (`vec_dot` and tinyBLAS, which share one order), Q4_K through
//! the 8x8 repack (GEMV/GEMM), SwiGLU, and f16-cache flash attention. [`LlamaCppX86`] picks the
//! build: `Avx2` is a `-march=native` build on an AVX2 machine, `Avx512` one on an AVX-512
//! (F/BW/DQ/VL/VNNI) machine such as the one llama.cpp's reference fixtures came from. The two
//! differ only in SiLU's `expf`, the flash-attention f16 dot and the Q4_K repack kernels; the
//! legacy and Q6_K dots are the same AVX2 code in both.
//!
//! Selected by `--numerics llamacpp-x86-avx2|llamacpp-x86-avx512` (see docs/PRECISION.md);
//! types and caches outside this list are refused, never computed another way.

pub mod attn_f16;
#[cfg(target_arch = "x86_64")]
mod attn_f16_avx2;
#[cfg(target_arch = "x86_64")]
mod attn_f16_avx512;
#[cfg(target_arch = "x86_64")]
mod attn_f16_avx512_tile;
#[cfg(target_arch = "x86_64")]
mod avx2;
pub mod expf;
pub mod legacy;
#[cfg(target_arch = "x86_64")]
pub mod libm_expf;
mod matmul;
pub mod q4k_repack;
pub mod q6k;
pub mod q6k_tiled;

pub use matmul::{matmul, supports_weight};

/// Which llama.cpp x86 build's arithmetic to reproduce.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LlamaCppX86 {
    /// `-march=native` on an AVX2 + FMA + F16C machine.
    Avx2,
    /// `-march=native` on an AVX-512 F/BW/DQ/VL/VNNI machine (no AVX512-FP16).
    Avx512,
}

/// ggml's `hsum_float_8` (and tinyBLAS's `hsum` of a 256-bit vector): the upper four lanes
/// add onto the lower four, then lanes 2-3 onto 0-1, then lane 1 onto lane 0.
#[inline]
pub fn hsum8(a: &[f32; 8]) -> f32 {
    let r = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
    let r = [r[0] + r[2], r[1] + r[3]];
    r[0] + r[1]
}

/// GCC's `_mm512_reduce_add_ps`: upper 256 bits onto lower, upper 128 onto lower, lanes 2-3
/// onto 0-1, lane 1 onto lane 0.
#[inline]
pub fn reduce16(a: &[f32; 16]) -> f32 {
    let mut t = [0f32; 8];
    for i in 0..8 {
        t[i] = a[8 + i] + a[i];
    }
    let u = [t[4] + t[0], t[5] + t[1], t[6] + t[2], t[7] + t[3]];
    let w = [u[0] + u[2], u[1] + u[3]];
    w[0] + w[1]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lane pairs chosen so that a different tree rounds differently (control: swapping the
    /// pairing in hsum8, e.g. (a0+a1)+..., changes the result).
    #[test]
    fn hsum8_pairs_lanes_four_apart() {
        let big = 16_777_216.0f32; // 2^24: adding 1 to it is lost, adding 2 is not
        let a = [big, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0];
        // (big + 1) rounds to big; + 0 ... + (1 + 0) = big + 1 -> big (ties to even)
        assert_eq!(hsum8(&a), big);
        let b = [big, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0];
        // (big + 1) -> big, then + (1 + 0) -> big
        assert_eq!(hsum8(&b), big);
        let c = [big, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0];
        // lane0 = big; lanes 1 and 3 meet first: 1 + 1 = 2, big + 2 is exact
        assert_eq!(hsum8(&c), big + 2.0);
    }

    #[test]
    fn reduce16_halves_then_quarters() {
        let big = 16_777_216.0f32;
        let mut a = [0f32; 16];
        a[0] = big;
        a[4] = 1.0;
        a[12] = 1.0;
        // t[4] = a[12] + a[4] = 2 meets big as u[0] = t4 + t0: exact
        assert_eq!(reduce16(&a), big + 2.0);
    }
}
