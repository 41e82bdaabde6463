//! x86-64 kernels. AVX2 kernels need AVX2 and F16C; FMA is deliberately unused because a
//! fused multiply-add rounds once where the reference rounds twice.
//!
//! Soundness: the kernels are `#[target_feature]` functions. The only way to reach them is
//! [`avx2_dot`] / [`avx2_quant`], which hand out their safe wrappers only after
//! [`avx2_supported`] has confirmed the features ([`crate::cpu_features`]).

use std::arch::x86_64::*;

use minfer_gguf::GgmlType;

use super::{Dot4Fn, DotFn, QuantFn, X16Fns};

/// Safe entry points (`TileFn`) over unsafe tile kernels: `$name => $kernel` each, for the
/// tile table of an instruction set. Only handed out by that set's `*_tile` lookup after its
/// `*_supported()` check returned true; each kernel checks every length it reads through
/// (`check`).
macro_rules! tile_wrappers {
    ($($name:ident => $kernel:ident),* $(,)?) => {
        $(fn $name(
            w: &[u8],
            acts: &[u8],
            arb: usize,
            side: TileSlice,
            range: Range<usize>,
            state: &mut TileAcc,
        ) {
            // SAFETY: see the macro's docs: the CPU supports the kernel's instruction set.
            unsafe { $kernel(w, acts, arb, side, range, state) }
        })*
    };
}

/// The lookup `$lookup` of one instruction set's kernels of rows packed 16 at a time
/// (`ops::matmul::packed`): for a type `$ty`, safe wrappers of `$module::$kernel` for one
/// activation row and for four, and where `+ facts $fmodule::$fkernel` follows, of that
/// kernel too (the form reading the activations' per-block facts, [`crate::simd::ActFacts`]),
/// and where `+ wide $wmodule` follows, of that module's prompt form (`$wmodule::expand`,
/// `$wmodule::dots`, its `WIDE_BLOCK`, `FACTS` and `FROM`: [`crate::simd::X16Wide`]),
/// handed out only after `$supported()` held (None before, and for the types not listed).
/// That check is what makes the wrappers sound: the kernels need that set's features.
macro_rules! packed_lookup {
    (@facts) => {
        None
    };
    (@facts $fm:ident::$ff:ident) => {{
        fn one(g: &[u8], a: &[u8], f: crate::simd::ActFacts<'_>, out: &mut [f32; 16]) {
            // SAFETY: only handed out after the features were confirmed (see the macro's
            // docs).
            unsafe { $fm::$ff::<1>(g, [a], [f], std::array::from_mut(out)) }
        }
        fn four(
            g: &[u8],
            a: [&[u8]; 4],
            f: [crate::simd::ActFacts<'_>; 4],
            out: &mut [[f32; 16]; 4],
        ) {
            // SAFETY: as above.
            unsafe { $fm::$ff::<4>(g, a, f, out) }
        }
        Some(crate::simd::X16FactsFns { one, four })
    }};
    (@wide) => {
        None
    };
    (@wide $wm:ident) => {{
        fn expand(g: &[u8], e: &mut [u8]) {
            // SAFETY: only handed out after the features were confirmed (see the macro's
            // docs).
            unsafe { $wm::expand(g, e) }
        }
        fn four(
            e: &[u8],
            a: [&[u8]; 4],
            f: [crate::simd::ActFacts<'_>; 4],
            out: &mut [[f32; 16]; 4],
        ) {
            // SAFETY: as above.
            unsafe { $wm::dots::<4>(e, a, f, out) }
        }
        Some(crate::simd::X16Wide {
            block_bytes: $wm::WIDE_BLOCK,
            facts: $wm::FACTS,
            from: $wm::FROM,
            expand,
            four,
        })
    }};
    (
        $(#[$doc:meta])*
        $vis:vis fn $lookup:ident if $supported:ident {
            $($ty:ident => $m:ident::$f:ident $(+ facts $fm:ident::$ff:ident)?
                $(+ wide $wm:ident)?),* $(,)?
        }
    ) => {
        $(#[$doc])*
        $vis fn $lookup(ty: GgmlType) -> Option<X16Fns> {
            if !$supported() {
                return None;
            }
            match ty {
                $(GgmlType::$ty => {
                    fn one(g: &[u8], a: &[u8], out: &mut [f32; 16]) {
                        // SAFETY: only handed out after the features were confirmed (see
                        // the macro's docs).
                        unsafe { $m::$f::<1>(g, [a], std::array::from_mut(out)) }
                    }
                    fn four(g: &[u8], a: [&[u8]; 4], out: &mut [[f32; 16]; 4]) {
                        // SAFETY: as above.
                        unsafe { $m::$f::<4>(g, a, out) }
                    }
                    let facts = packed_lookup!(@facts $($fm::$ff)?);
                    let wide = packed_lookup!(@wide $($wm)?);
                    Some(X16Fns { one, four, facts, wide })
                })*
                _ => None,
            }
        }
    };
}

/// The two entry points of a packed kernel whose weights are biased to unsigned (`x16`): `$plain`
/// (each activation block's d and Σ q derived from its bytes) and `$facts` (read from the
/// rows' [`crate::simd::ActFacts`]), both over the file's body `$body::<N, $($pre,)* FACTS>`
/// with the target features `$feat` (`$cpu`: the features named for the safety contract).
macro_rules! x16_entries {
    ($(#[$doc:meta])* $plain:ident, $facts:ident, $feat:literal, $cpu:literal,
     $body:ident $(, $pre:literal)*) => {
        $(#[$doc])*
        ///
        /// # Safety
        #[doc = $cpu]
        #[target_feature(enable = $feat)]
        pub(crate) unsafe fn $plain<const N: usize>(g: &[u8], a: [&[u8]; N], out: &mut Dots<N>) {
            // SAFETY: the features the body uses are this function's.
            unsafe { $body::<N, $($pre,)* false>(g, a, [NO_FACTS; N], out) }
        }

        #[doc = concat!("[`", stringify!($plain), "`]'s dots, each activation block's d and Σ q")]
        /// read from the rows' `facts`.
        ///
        /// # Safety
        #[doc = concat!("As [`", stringify!($plain), "`].")]
        #[target_feature(enable = $feat)]
        pub(crate) unsafe fn $facts<const N: usize>(
            g: &[u8],
            a: [&[u8]; N],
            facts: [ActFacts<'_>; N],
            out: &mut Dots<N>,
        ) {
            // SAFETY: the features the body uses are this function's.
            unsafe { $body::<N, $($pre,)* true>(g, a, facts, out) }
        }
    };
}

mod avx2_float;
mod avx2_kquants;
mod avx2_legacy;
mod avx2_q40_x16;
mod avx2_q41_x16;
mod avx2_q4k_wide;
mod avx2_q4k_x16;
mod avx2_q50_wide;
mod avx2_q50_x16;
mod avx2_q6k_wide;
mod avx2_q6k_x16;
mod avx2_q80_x16;
mod avx2_quantize;
mod avx2_side;
mod avx2_x16;
mod avx512_dispatch;
mod avx512_kquants;
mod avx512_legacy;
mod avx512_q40_x16;
mod avx512_q41_x16;
mod avx512_q4k_side;
mod avx512_q4k_tile;
mod avx512_q4k_x16;
mod avx512_q50_x16;
mod avx512_q6k_x16;
mod avx512_q80_x16;
mod avx512_quantize;
mod avx512_side_kernels;
mod avx512_tile_pairs;
mod avx512_tiles;
mod avx512_x16;
mod x16;

pub(super) use avx512_dispatch::{
    avx512_dot, avx512_dot4, avx512_packed, avx512_quant, avx512_side, avx512_supported,
};
mod avx2_tiles;

pub(super) use avx2_tiles::avx2_tile;
pub(super) use avx512_tile_pairs::avx512_tile_pair;
pub(super) use avx512_tiles::avx512_tile;

pub(super) fn avx2_supported() -> bool {
    crate::cpu_features::avx2_f16c()
}

/// Declares safe wrappers around AVX2 kernels. Calling one is sound only where
/// [`avx2_supported`] holds, which [`avx2_dot`] and [`avx2_quant`] check before returning them.
macro_rules! avx2_wrappers {
    (dot: $($name:ident => $kernel:path),* ; quant: $($qname:ident => $qkernel:path),* $(,)?) => {
        $(fn $name(w: &[u8], a: &[u8]) -> f32 {
            // SAFETY: only handed out by `avx2_dot` after `avx2_supported()` returned true.
            unsafe { $kernel(w, a) }
        })*
        $(fn $qname(x: &[f32], out: &mut [u8]) {
            // SAFETY: only handed out by `avx2_quant` after `avx2_supported()` returned true.
            unsafe { $qkernel(x, out) }
        })*
    };
}

avx2_wrappers! {
    dot:
    dot_f32 => avx2_float::dot_f32,
    dot_f16 => avx2_float::dot_f16,
    dot_bf16 => avx2_float::dot_bf16,
    dot_q4_0 => avx2_legacy::dot_q4_0,
    dot_q4_1 => avx2_legacy::dot_q4_1,
    dot_q5_0 => avx2_legacy::dot_q5_0,
    dot_q5_1 => avx2_legacy::dot_q5_1,
    dot_q8_0 => avx2_legacy::dot_q8_0,
    dot_iq4_nl => avx2_legacy::dot_iq4_nl,
    dot_q2_k => avx2_kquants::dot_q2_k,
    dot_q3_k => avx2_kquants::dot_q3_k,
    dot_q4_k => avx2_kquants::dot_q4_k,
    dot_q5_k => avx2_kquants::dot_q5_k,
    dot_q6_k => avx2_kquants::dot_q6_k,
    dot_q8_k => avx2_kquants::dot_q8_k,
    dot_iq4_xs => avx2_kquants::dot_iq4_xs;
    quant:
    quant_q8_0 => avx2_quantize::quant_q8_0,
    quant_q8_1 => avx2_quantize::quant_q8_1,
    quant_q8_k => avx2_quantize::quant_q8_k,
}

/// The AVX2 dot kernel for weights of `ty` (None: no kernel, or no AVX2 on this machine).
pub(super) fn avx2_dot(ty: GgmlType) -> Option<DotFn> {
    if !avx2_supported() {
        return None;
    }
    use GgmlType as T;
    Some(match ty {
        T::F32 => dot_f32,
        T::F16 => dot_f16,
        T::Bf16 => dot_bf16,
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

fn dot4_q5_0(w: &[u8], a: [&[u8]; 4]) -> [f32; 4] {
    // SAFETY: only handed out by `avx2_dot4` after `avx2_supported()` returned true.
    unsafe { avx2_legacy::dot_q5_0_x4(w, a) }
}

fn side_q5_0(w: &[u8], a: &[u8], d: &[f32], sums: &[i32], out: &mut [f32]) {
    // SAFETY: only handed out by `avx2_side` after `avx2_supported()` returned true.
    unsafe { avx2_legacy::dot_q5_0_side_rows(w, a, d, sums, out) }
}

fn side_q4_1(w: &[u8], a: &[u8], d: &[f32], sums: &[i32], out: &mut [f32]) {
    // SAFETY: only handed out by `avx2_side` after `avx2_supported()` returned true.
    unsafe { avx2_side::dot_q4_1_side_rows(w, a, d, sums, out) }
}

fn side_q8_0(w: &[u8], a: &[u8], d: &[f32], sums: &[i32], out: &mut [f32]) {
    // SAFETY: only handed out by `avx2_side` after `avx2_supported()` returned true.
    unsafe { avx2_legacy::dot_q8_0_side_rows(w, a, d, sums, out) }
}

/// The AVX2 side kernel (activation facts from the side table) for `ty`, where one exists.
pub(super) fn avx2_side(ty: GgmlType) -> Option<super::RowSideFn> {
    if !avx2_supported() {
        return None;
    }
    match ty {
        GgmlType::Q4_1 => Some(side_q4_1),
        GgmlType::Q5_0 => Some(side_q5_0),
        GgmlType::Q8_0 => Some(side_q8_0),
        _ => None,
    }
}

/// The AVX2 kernel dotting one weight row of `ty` with 4 activation rows, where one exists.
pub(super) fn avx2_dot4(ty: GgmlType) -> Option<Dot4Fn> {
    if !avx2_supported() {
        return None;
    }
    match ty {
        GgmlType::Q5_0 => Some(dot4_q5_0),
        _ => None,
    }
}

packed_lookup! {
    /// The AVX2 kernels of rows packed 16 at a time (`ops::matmul::packed`) for `ty`, one
    /// row and four at a time: the same layouts and bits as the AVX-512 ones (None: no
    /// kernel, or no AVX2 here).
    pub(super) fn avx2_packed if avx2_supported {
        Q4K => avx2_q4k_x16::dot_q4k_x16 + wide avx2_q4k_wide,
        Q6K => avx2_q6k_x16::dot_q6k_x16 + wide avx2_q6k_wide,
        Q4_0 => avx2_q40_x16::dot_q40_x16 + facts avx2_q40_x16::dot_q40_x16_facts,
        Q8_0 => avx2_q80_x16::dot_q80_x16 + facts avx2_q80_x16::dot_q80_x16_facts,
        Q5_0 => avx2_q50_x16::dot_q50_x16 + facts avx2_q50_x16::dot_q50_x16_facts
            + wide avx2_q50_wide,
        Q4_1 => avx2_q41_x16::dot_q41_x16,
    }
}

/// The AVX2 activation quantizer for `ty` (None: no kernel, or no AVX2 on this machine).
pub(super) fn avx2_quant(ty: GgmlType) -> Option<QuantFn> {
    if !avx2_supported() {
        return None;
    }
    match ty {
        GgmlType::Q8_0 => Some(quant_q8_0),
        GgmlType::Q8_1 => Some(quant_q8_1),
        GgmlType::Q8K => Some(quant_q8_k),
        _ => None,
    }
}

/// The bytes per row of the `rows` consecutive weight rows of `block`-byte blocks that a side
/// kernel's `w` holds (None for no rows); panics, naming the type, when `w` does not split so.
fn side_row_bytes(w: &[u8], rows: usize, block: usize, ty: &str) -> Option<usize> {
    let wrb = w.len().checked_div(rows)?;
    assert!(
        wrb * rows == w.len() && wrb.is_multiple_of(block),
        "{} weight bytes do not split into {rows} rows of {ty} blocks",
        w.len()
    );
    Some(wrb)
}

// ---- helpers shared by the AVX2 kernels ----

/// How far ahead of the bytes being dotted the kernels prefetch weights (bytes). The hardware
/// prefetchers do not cross 4 KiB pages, so every page of a streamed matrix would start with
/// demand misses; a software prefetch this far ahead starts the next page early. 1 KiB: the
/// best of 0 / 384 / 768 / 1024 / 1536 / 2048 / 4096 in `benches/decode_matvec.rs` runs
/// (docs/PERFORMANCE.md, "Decode profile and kernels").
pub(crate) const PREFETCH_AHEAD: usize = 1024;

/// 32 bytes from the start of `b` (bounds-checked).
#[inline]
#[target_feature(enable = "avx2")]
fn load32(b: &[u8]) -> __m256i {
    let b = &b[..32];
    // SAFETY: `b` has 32 readable bytes; loadu has no alignment requirement.
    unsafe { _mm256_loadu_si256(b.as_ptr().cast()) }
}

/// 16 bytes from the start of `b` (bounds-checked).
#[inline]
#[target_feature(enable = "avx2")]
fn load16(b: &[u8]) -> __m128i {
    let b = &b[..16];
    // SAFETY: `b` has 16 readable bytes; loadu has no alignment requirement.
    unsafe { _mm_loadu_si128(b.as_ptr().cast()) }
}

/// The f16 at `b[off..off + 2]` as f32 (exact, like `quants::f16_to_f32`).
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn f16_at(b: &[u8], off: usize) -> f32 {
    let bits = u16::from_le_bytes([b[off], b[off + 1]]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

#[inline]
fn f32_at(b: &[u8], off: usize) -> f32 {
    f32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// Sum of the 8 i32 lanes (wrapping, like the exact sums it is used for, which never wrap).
#[inline]
#[target_feature(enable = "avx2")]
fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// Exact Σ w·a of 32 signed bytes in pairs, as 16 i16 lanes, for weights in -127..=127 and any
/// activation: |a| is the unsigned operand and a's sign moves onto w, so a pair is at most
/// 2·128·127 = 32512 and `maddubs` never saturates. (With w = -128 the sign flip would wrap.)
#[inline]
#[target_feature(enable = "avx2")]
fn pairs_small_w(w: __m256i, a: __m256i) -> __m256i {
    _mm256_maddubs_epi16(_mm256_abs_epi8(a), _mm256_sign_epi8(w, a))
}

/// Exact Σ w·a of 32 signed bytes as 8 i32 lanes, for any bytes (both may be -128):
/// widened to i16 first.
#[inline]
#[target_feature(enable = "avx2")]
fn dot_i8_any(w: &[u8], a: &[u8]) -> __m256i {
    let w0 = _mm256_cvtepi8_epi16(load16(w));
    let w1 = _mm256_cvtepi8_epi16(load16(&w[16..]));
    let a0 = _mm256_cvtepi8_epi16(load16(a));
    let a1 = _mm256_cvtepi8_epi16(load16(&a[16..]));
    _mm256_add_epi32(_mm256_madd_epi16(w0, a0), _mm256_madd_epi16(w1, a1))
}

/// Pairs of i16 lanes summed into 8 i32 lanes.
#[inline]
#[target_feature(enable = "avx2")]
fn widen_pairs(p: __m256i) -> __m256i {
    _mm256_madd_epi16(p, _mm256_set1_epi16(1))
}

/// Byte j (0..32) is 0xff when bit j of `bits` is set, else 0.
#[inline]
#[target_feature(enable = "avx2")]
fn bits_to_bytes(bits: u32) -> __m256i {
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(bits as i32),
        _mm256_set_epi64x(
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
            0x0101_0101_0101_0101,
            0,
        ),
    );
    let mask = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    _mm256_cmpeq_epi8(_mm256_and_si256(spread, mask), mask)
}

/// 16 packed bytes to 32 nibbles in element order: low nibbles (elements 0..16), then high
/// nibbles (elements 16..32): the layout of every 32-element 4-bit block.
#[inline]
#[target_feature(enable = "avx2")]
fn nibbles32(qs: &[u8]) -> __m256i {
    // Both halves by one broadcast load (no shuffle), the high one shifted by a per-lane count.
    let both = _mm256_broadcastsi128_si256(load16(qs));
    let shifted = _mm256_srlv_epi64(both, _mm256_set_epi64x(4, 4, 0, 0));
    _mm256_and_si256(shifted, _mm256_set1_epi8(0x0f))
}

/// The IQ4 value table in both 128-bit lanes, for `_mm256_shuffle_epi8` lookups.
#[inline]
#[target_feature(enable = "avx2")]
fn iq4_table() -> __m256i {
    let t = &minfer_gguf::quants::KVALUES_IQ4NL;
    let bytes: [u8; 16] = std::array::from_fn(|i| t[i] as u8);
    let lane = load16(&bytes);
    _mm256_set_m128i(lane, lane)
}
