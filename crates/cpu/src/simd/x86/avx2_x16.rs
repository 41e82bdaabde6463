//! What the AVX2 kernels of packed rows (`avx2_*_x16.rs`) share. They read the same groups
//! as the AVX-512 ones (`ops::matmul::packed`: 16 rows, a row's 4 bytes of a quad at 4r of
//! each 64), as two 256-bit halves: rows 0..8 in the first 32 bytes of every 64, rows 8..16
//! in the second, i32 / f32 lane r of a half being row 8h + r.
//!
//! AVX2 has no `vpdpbusd`: 4 unsigned × signed byte products summed into an i32 lane are
//! `vpmaddubsw` (pairs into i16, saturating) then `vpmaddwd` against ones (or against a
//! scale, which multiplies the sum on the way). Each kernel keeps its pairs below the
//! saturation bound (stated at each use) and sums several `vpmaddubsw` results in i16 first
//! while their total stays below 32767, so every integer is the exact one of the reference.
//! The float steps are the AVX-512 kernels' (the reference's order, never fused), on 8 lanes.
//!
//! FMA is not enabled: these are [`crate::simd::Isa::Avx2`] kernels, which need AVX2 and
//! F16C only (`cpu_features::avx2_f16c`), and no step of theirs may fuse.

use std::arch::x86_64::*;

use super::x16::fact;
use crate::simd::ActFacts;

/// The i32 at `p` (4 bytes, unaligned) in every lane: 4 activation bytes for `vpmaddubsw`.
///
/// # Safety
/// `p` must point at 4 readable bytes.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn bcast4(p: *const u8) -> __m256i {
    // SAFETY: the caller's.
    _mm256_set1_epi32(unsafe { p.cast::<i32>().read_unaligned() })
}

/// The 8 bytes at `p` (unaligned) in every 64-bit lane: 8 activation bytes for
/// `vpmaddubsw`, 4 of them for each of two i32 lanes (the prompt forms' layout of 4 rows ×
/// 8 elements a vector).
///
/// # Safety
/// `p` must point at 8 readable bytes.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn bcast8(p: *const u8) -> __m256i {
    // SAFETY: the caller's.
    _mm256_set1_epi64x(unsafe { p.cast::<i64>().read_unaligned() })
}

/// 32 bytes at `p` (unaligned).
///
/// # Safety
/// `p` must point at 32 readable bytes.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn load(p: *const u8) -> __m256i {
    // SAFETY: the caller's.
    unsafe { _mm256_loadu_si256(p.cast()) }
}

/// The 8 f16 at `p` (one per row of a half) as f32; the conversion is exact.
///
/// # Safety
/// `p` must point at 16 readable bytes.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn f16x8(p: *const u8) -> __m256 {
    // SAFETY: the caller's.
    _mm256_cvtph_ps(unsafe { _mm_loadu_si128(p.cast()) })
}

/// The f16 at `p` (an activation block's scale) in every lane; the conversion is exact.
///
/// # Safety
/// `p` must point at 2 readable bytes.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn f16_lanes(p: *const u8) -> __m256 {
    // SAFETY: the caller's.
    _mm256_cvtph_ps(_mm_set1_epi16(unsafe { p.cast::<i16>().read_unaligned() }))
}

/// The d (an f32 at 0) of each Q8_K activation block at `ap`, in every lane.
///
/// # Safety
/// Each of `ap` must point at 4 readable bytes.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn q8k_d<const N: usize>(ap: &[*const u8; N]) -> [__m256; N] {
    let mut da = [_mm256_setzero_ps(); N];
    for (da, p) in da.iter_mut().zip(ap) {
        // SAFETY: the caller's.
        *da = _mm256_set1_ps(unsafe { p.cast::<f32>().read_unaligned() });
    }
    da
}

/// Of each Q8_0 activation block at `ap`: Σ of its quants ([`block_sum`]) and its d in every
/// lane, which the kernels that bias their weights to unsigned need once a block.
///
/// # Safety
/// Each of `ap` must point at a whole Q8_0 block (34 readable bytes).
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn q8_0_sums<const N: usize>(ap: &[*const u8; N]) -> ([i32; N], [__m256; N]) {
    let mut sa = [0i32; N];
    let mut da = [_mm256_setzero_ps(); N];
    for ((sa, da), p) in sa.iter_mut().zip(&mut da).zip(ap) {
        // SAFETY: the caller's; the block's d at 0, its 32 quants at 2.
        unsafe {
            *sa = block_sum(p.add(2));
            *da = f16_lanes(*p);
        }
    }
    (sa, da)
}

/// [`q8_0_sums`] of block `b` of each activation row, read from the rows' `facts` (`x16`):
/// its Σ q, and its d in every lane.
///
/// # Safety
/// `b` must be a block of the `Blocks` whose `check_facts` accepted `facts`.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn q8_0_facts<const N: usize>(
    facts: &[ActFacts<'_>; N],
    b: usize,
) -> ([i32; N], [__m256; N]) {
    let mut sa = [0i32; N];
    let mut da = [_mm256_setzero_ps(); N];
    for ((sa, da), f) in sa.iter_mut().zip(&mut da).zip(facts) {
        // SAFETY: the caller's.
        let (d, s) = unsafe { fact(f, b) };
        *sa = s;
        *da = _mm256_set1_ps(d);
    }
    (sa, da)
}

/// Block `b`'s Σ q and d of each activation row: read from the rows' `facts` with `FACTS`
/// ([`q8_0_facts`]), else derived from its bytes at `ap` ([`q8_0_sums`]).
///
/// # Safety
/// With `FACTS`, `Blocks::check_facts` must have accepted `facts` for the blocks `b` is one
/// of; else each of `ap` must point at a whole Q8_0 block.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn q8_0_block<const N: usize, const FACTS: bool>(
    facts: &[ActFacts<'_>; N],
    b: usize,
    ap: &[*const u8; N],
) -> ([i32; N], [__m256; N]) {
    // SAFETY: the caller's.
    unsafe {
        if FACTS {
            q8_0_facts(facts, b)
        } else {
            q8_0_sums(ap)
        }
    }
}

/// `ap` made opaque to the optimiser, once per half by the kernels of several activation
/// rows: otherwise it shares the activation broadcasts of both halves by spilling them to
/// the stack, which measured 5-30 % slower with four rows (`benches/matmul.rs`,
/// docs/PERFORMANCE.md Session 24).
#[inline(always)]
pub(super) fn per_half<const N: usize>(ap: [*const u8; N]) -> [*const u8; N] {
    std::hint::black_box(ap)
}

/// Pairs of i16 lanes summed into 8 i32 lanes (exact).
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) fn widen(p: __m256i) -> __m256i {
    _mm256_madd_epi16(p, _mm256_set1_epi16(1))
}

/// Σ of the 32 signed activation bytes at `p` (a Q8_0 / Q8_1 block's quants), exact: biased
/// to unsigned (a ^ 0x80 = a + 128) and summed by `vpsadbw` against zero, less 32 · 128.
///
/// # Safety
/// `p` must point at 32 readable bytes.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn block_sum(p: *const u8) -> i32 {
    // SAFETY: the caller's.
    let u = _mm256_xor_si256(unsafe { load(p) }, _mm256_set1_epi8(-128));
    let s4 = _mm256_sad_epu8(u, _mm256_setzero_si256());
    let s2 = _mm_add_epi64(
        _mm256_castsi256_si128(s4),
        _mm256_extracti128_si256::<1>(s4),
    );
    let s1 = _mm_add_epi64(s2, _mm_unpackhi_epi64(s2, s2));
    _mm_cvtsi128_si32(s1) - 32 * 128
}

/// The reference's combination of the 4 block lanes, (0 + 2) + (1 + 3), per row of both
/// halves, into `out` for each activation row t (rows 0..8 from `lanes[t][0]`, 8..16 from
/// `lanes[t][1]`).
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) fn finish<const N: usize>(lanes: &[[[__m256; 4]; 2]; N], out: &mut [[f32; 16]; N]) {
    for (lanes, out) in lanes.iter().zip(out) {
        for (h, l) in lanes.iter().enumerate() {
            let total = _mm256_add_ps(_mm256_add_ps(l[0], l[2]), _mm256_add_ps(l[1], l[3]));
            // SAFETY: `out` holds 16 f32, 8 of them from 8h.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(8 * h), total) };
        }
    }
}

/// `vpshufb` indices giving each i32 lane, within its 128-bit half, bytes `lo` and `hi` of
/// itself at byte positions `at` and `at + 2` (the others 0): a byte of a packed word as an
/// i16 pair, zero-extended (`at` = 0) or in the high bytes for an arithmetic shift (`at` = 1).
pub(super) const fn lane_bytes(lo: u8, hi: u8, at: usize) -> [u8; 32] {
    let mut idx = [0x80u8; 32];
    let mut lane = 0;
    while lane < 8 {
        idx[4 * lane + at] = 4 * (lane % 4) as u8 + lo;
        idx[4 * lane + at + 2] = 4 * (lane % 4) as u8 + hi;
        lane += 1;
    }
    idx
}

/// A 32-byte table (one of [`lane_bytes`]'s) as a vector.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) fn table(t: &[u8; 32]) -> __m256i {
    // SAFETY: `t` is 32 readable bytes.
    unsafe { load(t.as_ptr()) }
}
