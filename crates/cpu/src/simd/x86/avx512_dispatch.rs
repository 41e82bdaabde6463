//! AVX-512 kernels: one instruction set, AVX-512 F + BW + VL + VNNI (plus F16C), which every
//! AVX-512 core with VNNI has (Cascade Lake, Ice Lake, Sapphire Rapids and later; AMD Zen 4
//! and later). Cores with AVX-512 but no VNNI (Skylake-SP/X) run the AVX2 kernels.
//!
//! Byte products go through VNNI's `vpdpbusd` (unsigned x signed bytes, 4 products summed
//! into an i32 lane, never saturating) or `vpmaddubsw` + `vpdpwssd` where a 16-element
//! sub-block scale multiplies them; both are exact for the operand ranges noted at each use.
//! The float part repeats the reference's IEEE operations in its order, never fused (FMA
//! would round once where the reference rounds twice). AVX512-BF16's `vdpbf16ps` is
//! unusable for the same reason (it accumulates pairs with a different rounding), so BF16
//! rows, like F32 and F16 rows, run the AVX2 float dots: their speed is bound by the latency
//! of the reference's 16 f64 lane chains, which wider vectors do not shorten.
//!
//! Soundness: the kernels are `#[target_feature]` functions, reachable only through
//! [`avx512_dot`], [`avx512_dot4`] and [`avx512_quant`], which hand out their safe wrappers
//! after [`avx512_supported`] has confirmed the features ([`crate::cpu_features`]).

use std::arch::x86_64::*;

use minfer_gguf::GgmlType;

use super::load32;
use super::{
    avx512_kquants, avx512_legacy, avx512_q40_x16, avx512_q41_x16, avx512_q4k_side, avx512_q4k_x16,
    avx512_q50_x16, avx512_q6k_x16, avx512_q80_x16, avx512_quantize, avx512_side_kernels,
};
use crate::simd::{Dot4Fn, DotFn, QuantFn, RowSideFn, X16Fns};

pub(in crate::simd) fn avx512_supported() -> bool {
    // AVX2 + F16C too: on the way to an AVX-512 kernel the AVX2 helpers run.
    crate::cpu_features::avx512_vnni()
}

/// Declares safe wrappers around AVX-512 kernels. Calling one is sound only where
/// [`avx512_supported`] holds, which the functions handing them out check first.
macro_rules! avx512_wrappers {
    (dot: $($name:ident => $kernel:path),* ;
     dot4: $($name4:ident => $kernel4:path),* ;
     quant: $($qname:ident => $qkernel:path),* $(,)?) => {
        $(fn $name(w: &[u8], a: &[u8]) -> f32 {
            // SAFETY: only handed out by `avx512_dot` after `avx512_supported()` returned true.
            unsafe { $kernel(w, a) }
        })*
        $(fn $name4(w: &[u8], a: [&[u8]; 4]) -> [f32; 4] {
            // SAFETY: only handed out by `avx512_dot4` after `avx512_supported()` returned true.
            unsafe { $kernel4(w, a) }
        })*
        $(fn $qname(x: &[f32], out: &mut [u8]) {
            // SAFETY: only handed out by `avx512_quant` after `avx512_supported()` returned true.
            unsafe { $qkernel(x, out) }
        })*
    };
}

avx512_wrappers! {
    dot:
    dot_q4_0 => avx512_legacy::dot_q4_0,
    dot_q4_1 => avx512_legacy::dot_q4_1,
    dot_q5_0 => avx512_legacy::dot_q5_0,
    dot_q5_1 => avx512_legacy::dot_q5_1,
    dot_q8_0 => avx512_legacy::dot_q8_0,
    dot_iq4_nl => avx512_legacy::dot_iq4_nl,
    dot_q4_k => avx512_kquants::dot_q4_k,
    dot_q6_k => avx512_kquants::dot_q6_k;
    dot4:
    dot4_q4_0 => avx512_legacy::dot4_q4_0,
    dot4_q4_1 => avx512_legacy::dot4_q4_1,
    dot4_q5_0 => avx512_legacy::dot4_q5_0,
    dot4_q5_1 => avx512_legacy::dot4_q5_1,
    dot4_q8_0 => avx512_legacy::dot4_q8_0,
    dot4_iq4_nl => avx512_legacy::dot4_iq4_nl;
    quant:
    quant_q8_0 => avx512_quantize::quant_q8_0,
    quant_q8_1 => avx512_quantize::quant_q8_1,
    quant_q8_k => avx512_quantize::quant_q8_k,
}

/// The AVX-512 dot kernel for weights of `ty` (None: no AVX-512 kernel for it, or no
/// AVX-512 on this machine; the dispatcher then tries AVX2).
pub(in crate::simd) fn avx512_dot(ty: GgmlType) -> Option<DotFn> {
    if !avx512_supported() {
        return None;
    }
    use GgmlType as T;
    Some(match ty {
        T::Q4_0 => dot_q4_0,
        T::Q4_1 => dot_q4_1,
        T::Q5_0 => dot_q5_0,
        T::Q5_1 => dot_q5_1,
        T::Q8_0 => dot_q8_0,
        T::Iq4Nl => dot_iq4_nl,
        T::Q4K => dot_q4_k,
        T::Q6K => dot_q6_k,
        _ => return None,
    })
}

/// The AVX-512 kernel dotting one weight row of `ty` with 4 activation rows, where one exists.
pub(in crate::simd) fn avx512_dot4(ty: GgmlType) -> Option<Dot4Fn> {
    if !avx512_supported() {
        return None;
    }
    use GgmlType as T;
    Some(match ty {
        T::Q4_0 => dot4_q4_0,
        T::Q4_1 => dot4_q4_1,
        T::Q5_0 => dot4_q5_0,
        T::Q5_1 => dot4_q5_1,
        T::Q8_0 => dot4_q8_0,
        T::Iq4Nl => dot4_iq4_nl,
        _ => return None,
    })
}

fn side_q4_1(w: &[u8], a: &[u8], d: &[f32], sums: &[i32], out: &mut [f32]) {
    // SAFETY: only handed out by `avx512_side` after `avx512_supported()` returned true.
    unsafe { avx512_side_kernels::dot_q4_1_side_rows(w, a, d, sums, out) }
}

fn side_q4_0(w: &[u8], a: &[u8], d: &[f32], sums: &[i32], out: &mut [f32]) {
    // SAFETY: only handed out by `avx512_side` after `avx512_supported()` returned true.
    unsafe { avx512_side_kernels::dot_q4_0_side_rows(w, a, d, sums, out) }
}

fn side_q8_0(w: &[u8], a: &[u8], d: &[f32], sums: &[i32], out: &mut [f32]) {
    // SAFETY: only handed out by `avx512_side` after `avx512_supported()` returned true.
    unsafe { avx512_side_kernels::dot_q8_0_side_rows(w, a, d, sums, out) }
}

fn side_q4_k(w: &[u8], a: &[u8], d: &[f32], sums: &[i32], out: &mut [f32]) {
    // SAFETY: only handed out by `avx512_side` after `avx512_supported()` returned true.
    unsafe { avx512_q4k_side::dot_q4_k_side_rows(w, a, d, sums, out) }
}

/// The AVX-512 side kernel (activation facts from the side table) for `ty`, where one exists
/// (the AVX2 ones serve the other types on AVX-512 machines).
pub(in crate::simd) fn avx512_side(ty: GgmlType) -> Option<RowSideFn> {
    if !avx512_supported() {
        return None;
    }
    match ty {
        GgmlType::Q4_0 => Some(side_q4_0),
        GgmlType::Q4_1 => Some(side_q4_1),
        GgmlType::Q8_0 => Some(side_q8_0),
        GgmlType::Q4K => Some(side_q4_k),
        _ => None,
    }
}

/// The packed kernels of `ty`, one row and four at a time (None: no kernel, or no AVX-512
/// here): BITALG's where the core has it, chosen once here rather than per call.
pub(in crate::simd) fn avx512_packed(ty: GgmlType) -> Option<X16Fns> {
    bitalg_packed(ty).or_else(|| vnni_packed(ty))
}

fn bitalg_supported() -> bool {
    crate::cpu_features::avx512_bitalg()
}

packed_lookup! {
    /// The kernels that also need AVX-512 BITALG.
    fn bitalg_packed if bitalg_supported {
        Q5_0 => avx512_q50_x16::with_bitalg + facts avx512_q50_x16::with_bitalg_facts,
    }
}

packed_lookup! {
    /// The kernels of AVX-512 F/BW/VL/VNNI.
    fn vnni_packed if avx512_supported {
        Q4K => avx512_q4k_x16::dot_q4k_x16,
        Q6K => avx512_q6k_x16::dot_q6k_x16,
        Q4_0 => avx512_q40_x16::dot_q40_x16 + facts avx512_q40_x16::dot_q40_x16_facts,
        Q8_0 => avx512_q80_x16::dot_q80_x16 + facts avx512_q80_x16::dot_q80_x16_facts,
        Q5_0 => avx512_q50_x16::with_multiply + facts avx512_q50_x16::with_multiply_facts,
        Q4_1 => avx512_q41_x16::dot_q41_x16,
    }
}

/// The AVX-512 activation quantizer for `ty` (None: no kernel, or no AVX-512 here).
pub(in crate::simd) fn avx512_quant(ty: GgmlType) -> Option<QuantFn> {
    if !avx512_supported() {
        return None;
    }
    match ty {
        GgmlType::Q8_0 => Some(quant_q8_0),
        GgmlType::Q8_1 => Some(quant_q8_1),
        GgmlType::Q8K => Some(quant_q8_k),
        _ => None,
    }
}

// ---- helpers shared by the AVX-512 kernels ----

/// 64 bytes from the start of `b` (bounds-checked).
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) fn load64(b: &[u8]) -> __m512i {
    let b = &b[..64];
    // SAFETY: `b` has 64 readable bytes; loadu has no alignment requirement.
    unsafe { _mm512_loadu_si512(b.as_ptr().cast()) }
}

/// `lo` in the low 256 bits, `hi` in the high 256 bits.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) fn join256(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
}

/// The 32 bytes at `off` of two consecutive `stride`-byte blocks, as one vector.
#[inline]
#[target_feature(enable = "avx512f,avx2")]
pub(super) fn pair32(b: &[u8], stride: usize, off: usize) -> __m512i {
    join256(load32(&b[off..]), load32(&b[stride + off..]))
}

/// Σ of the 16 i32 lanes (wrapping, like the exact sums it is used for, which never wrap).
#[inline]
#[target_feature(enable = "avx512f,avx2")]
pub(super) fn hsum_i32x16(v: __m512i) -> i32 {
    let s = _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64::<1>(v));
    super::hsum_i32(s)
}
