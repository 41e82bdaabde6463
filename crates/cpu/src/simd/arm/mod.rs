//! aarch64 NEON kernels, generic over how 16 byte products are summed ([`Dot16`]): baseline
//! NEON ([`Widen`]: `vmull_s8` and pairwise widening adds) or the dot-product extension
//! ([`Sdot`]: one `sdot`, emitted with inline asm because `vdotq_s32` is not stable in Rust
//! yet). Both are exact for every byte, -128 included, so a block's integer total is the same
//! integer either way. No FMA anywhere: a fused multiply-add rounds once where the reference
//! rounds twice.
//!
//! Tested under `qemu-aarch64-static -cpu max` (docs/PERFORMANCE.md, "CPU dot kernels").
//!
//! Soundness: the kernels are `#[target_feature(enable = "neon")]` functions reached only
//! through [`neon_dot`] / [`neon_quant`] / [`dotprod_dot`], which hand out their safe wrappers
//! only after [`neon_supported`] (and [`dotprod_supported`] for the `Sdot` instances) has
//! confirmed the features at run time.

use std::arch::aarch64::*;

use minfer_gguf::GgmlType;

use super::{DotFn, QuantFn};

mod neon_float;
mod neon_kquants;
mod neon_legacy;
mod neon_quantize;

pub(super) fn neon_supported() -> bool {
    crate::cpu_features::neon()
}

pub(super) fn dotprod_supported() -> bool {
    crate::cpu_features::neon_dotprod()
}

/// Exact Σ w·a of 16 signed bytes (any values) as 4 i32 lanes (which products land in which
/// lane differs between impls; callers only use the lanes' total).
pub(super) trait Dot16 {
    fn dot16(w: int8x16_t, a: int8x16_t) -> int32x4_t;
}

/// Baseline NEON: widening multiplies and pairwise widening adds.
pub(super) struct Widen;

impl Dot16 for Widen {
    #[inline(always)]
    fn dot16(w: int8x16_t, a: int8x16_t) -> int32x4_t {
        // SAFETY: plain NEON arithmetic; called only from the `neon` kernels of this module
        // (NEON is also part of every aarch64 Rust target's baseline).
        unsafe {
            let lo = vmull_s8(vget_low_s8(w), vget_low_s8(a));
            let hi = vmull_high_s8(w, a);
            vpadalq_s16(vpaddlq_s16(lo), hi)
        }
    }
}

/// The dot-product extension: lane i = Σ_k w[4i+k]·a[4i+k] (k in 0..4), exact in i32.
/// Only instantiated in the kernels [`dotprod_dot`] hands out, after [`dotprod_supported`].
pub(super) struct Sdot;

impl Dot16 for Sdot {
    #[inline(always)]
    fn dot16(w: int8x16_t, a: int8x16_t) -> int32x4_t {
        // SAFETY: as for `Widen`; `sdot` only reads the three registers and writes `acc` (no
        // memory, stack or flags), and it exists on this core: `Sdot` kernels are reached
        // only through `dotprod_dot`, which checks `dotprod_supported()` first.
        // `.arch_extension` lets the assembler accept it in functions compiled without the
        // `dotprod` target feature.
        unsafe {
            let mut acc = vdupq_n_s32(0);
            std::arch::asm!(
                ".arch_extension dotprod",
                "sdot {acc:v}.4s, {w:v}.16b, {a:v}.16b",
                acc = inout(vreg) acc,
                w = in(vreg) w,
                a = in(vreg) a,
                options(pure, nomem, nostack, preserves_flags),
            );
            acc
        }
    }
}

/// Declares safe wrappers around NEON kernels. Calling one is sound only where
/// [`neon_supported`] holds, which [`neon_dot`] and [`neon_quant`] check before returning them.
macro_rules! neon_wrappers {
    (dot $dot16:ty: $($name:ident => $kmod:ident :: $kfn:ident),* $(,)?) => {
        $(fn $name(w: &[u8], a: &[u8]) -> f32 {
            // SAFETY: only handed out after `neon_supported()` (and, for `Sdot`,
            // `dotprod_supported()`) returned true.
            unsafe { $kmod::$kfn::<$dot16>(w, a) }
        })*
    };
    (float: $($fname:ident => $fkernel:path),* $(,)?) => {
        $(fn $fname(w: &[u8], a: &[u8]) -> f32 {
            // SAFETY: only handed out by `neon_dot` after `neon_supported()` returned true.
            unsafe { $fkernel(w, a) }
        })*
    };
    (quant: $($qname:ident => $qkernel:path),* $(,)?) => {
        $(fn $qname(x: &[f32], out: &mut [u8]) {
            // SAFETY: only handed out by `neon_quant` after `neon_supported()` returned true.
            unsafe { $qkernel(x, out) }
        })*
    };
}

neon_wrappers! {
    float:
    dot_f32 => neon_float::dot_f32,
    dot_bf16 => neon_float::dot_bf16,
}

/// One table of safe wrappers per [`Dot16`] impl (the integer kernels), and the lookup by type over it.
macro_rules! dot_table {
    ($module:ident, $dot16:ty) => {
        mod $module {
            use super::*;

            neon_wrappers! {
                dot $dot16:
                dot_q4_0 => neon_legacy::dot_q4_0,
                dot_q4_1 => neon_legacy::dot_q4_1,
                dot_q5_0 => neon_legacy::dot_q5_0,
                dot_q5_1 => neon_legacy::dot_q5_1,
                dot_q8_0 => neon_legacy::dot_q8_0,
                dot_iq4_nl => neon_legacy::dot_iq4_nl,
                dot_q2_k => neon_kquants::dot_q2_k,
                dot_q3_k => neon_kquants::dot_q3_k,
                dot_q4_k => neon_kquants::dot_q4_k,
                dot_q5_k => neon_kquants::dot_q5_k,
                dot_q6_k => neon_kquants::dot_q6_k,
                dot_q8_k => neon_kquants::dot_q8_k,
                dot_iq4_xs => neon_kquants::dot_iq4_xs,
            }

            /// The integer kernel for `ty`; the caller has checked the features `$dot16` needs.
            pub(super) fn lookup(ty: GgmlType) -> Option<DotFn> {
                use GgmlType as T;
                Some(match ty {
                    T::Q4_0 => dot_q4_0,
                    T::Q4_1 => dot_q4_1,
                    T::Q5_0 => dot_q5_0,
                    T::Q5_1 => dot_q5_1,
                    T::Q8_0 => dot_q8_0,
                    T::Iq4Nl => dot_iq4_nl,
                    T::Q2K => dot_q2_k,
                    T::Q3K => dot_q3_k,
                    T::Q4K => dot_q4_k,
                    T::Q5K => dot_q5_k,
                    T::Q6K => dot_q6_k,
                    T::Q8K => dot_q8_k,
                    T::Iq4Xs => dot_iq4_xs,
                    _ => return None,
                })
            }
        }
    };
}

dot_table!(widen_table, Widen);
dot_table!(sdot_table, Sdot);

neon_wrappers! {
    quant:
    quant_q8_0 => neon_quantize::quant_q8_0,
    quant_q8_1 => neon_quantize::quant_q8_1,
    quant_q8_k => neon_quantize::quant_q8_k,
}

/// The NEON dot kernel for weights of `ty` (None: no kernel, or no NEON on this machine).
/// F16 rows have none: Rust's f16 vector conversions are not stable yet.
pub(super) fn neon_dot(ty: GgmlType) -> Option<DotFn> {
    if !neon_supported() {
        return None;
    }
    match ty {
        GgmlType::F32 => Some(dot_f32),
        GgmlType::Bf16 => Some(dot_bf16),
        _ => widen_table::lookup(ty),
    }
}

/// The NEON + dot-product kernel for weights of `ty` (None: no kernel, or no dot-product
/// extension on this machine). The integer types of [`neon_dot`]; F32 and BF16 rows have no
/// byte products and run the NEON kernels (`Isa::NeonDotprod`'s subset).
pub(super) fn dotprod_dot(ty: GgmlType) -> Option<DotFn> {
    if !dotprod_supported() {
        return None;
    }
    sdot_table::lookup(ty)
}

/// The NEON activation quantizer for `ty` (None: no kernel, or no NEON on this machine).
pub(super) fn neon_quant(ty: GgmlType) -> Option<QuantFn> {
    if !neon_supported() {
        return None;
    }
    match ty {
        GgmlType::Q8_0 => Some(quant_q8_0),
        GgmlType::Q8_1 => Some(quant_q8_1),
        GgmlType::Q8K => Some(quant_q8_k),
        _ => None,
    }
}

// ---- helpers shared by the NEON kernels ----

/// 16 bytes from the start of `b` (bounds-checked).
#[inline]
#[target_feature(enable = "neon")]
fn load16(b: &[u8]) -> uint8x16_t {
    let b = &b[..16];
    // SAFETY: `b` has 16 readable bytes; vld1q has no alignment requirement.
    unsafe { vld1q_u8(b.as_ptr()) }
}

/// 16 signed bytes from the start of `b`.
#[inline]
#[target_feature(enable = "neon")]
fn load16s(b: &[u8]) -> int8x16_t {
    vreinterpretq_s8_u8(load16(b))
}

/// Exact Σ w·a of 32 elements: weights as two 16-byte vectors, activations from `a`.
#[inline]
#[target_feature(enable = "neon")]
fn dot32<D: Dot16>(w: (int8x16_t, int8x16_t), a: &[u8]) -> i32 {
    let s = vaddq_s32(D::dot16(w.0, load16s(a)), D::dot16(w.1, load16s(&a[16..])));
    vaddvq_s32(s)
}

/// 16 packed bytes to the 32 nibbles of a 4-bit block: (elements 0..16, elements 16..32).
#[inline]
#[target_feature(enable = "neon")]
fn nibbles32(qs: &[u8]) -> (uint8x16_t, uint8x16_t) {
    let q = load16(qs);
    (vandq_u8(q, vdupq_n_u8(0x0f)), vshrq_n_u8::<4>(q))
}

/// Byte j (0..16) of the result is 0xff when bit j of `bits` is set (bits of two bytes).
#[inline]
#[target_feature(enable = "neon")]
fn bits_to_bytes16(lo: u8, hi: u8) -> uint8x16_t {
    let rep = vcombine_u8(vdup_n_u8(lo), vdup_n_u8(hi));
    let mask = vreinterpretq_u8_u64(vdupq_n_u64(0x8040_2010_0804_0201));
    vtstq_u8(rep, mask)
}

/// The IQ4 value table, for `vqtbl1q_s8` lookups.
#[inline]
#[target_feature(enable = "neon")]
fn iq4_table() -> int8x16_t {
    let t = &minfer_gguf::quants::KVALUES_IQ4NL;
    let bytes: [u8; 16] = std::array::from_fn(|i| t[i] as u8);
    load16s(&bytes)
}

#[inline]
fn f16_at(b: &[u8], off: usize) -> f32 {
    minfer_gguf::quants::f16_to_f32(u16::from_le_bytes([b[off], b[off + 1]]))
}

#[inline]
fn f32_at(b: &[u8], off: usize) -> f32 {
    f32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}
