//! What the AVX-512 kernels of packed rows (`avx512_*_x16.rs`, one row per lane) share.

use std::arch::x86_64::*;

/// Σ of the 32 signed activation bytes `aq` (a Q8_0 / Q8_1 block's quants), exact: one
/// `vpdpbusd` against ones, then the 8 partial sums.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
pub(super) fn block_sum(aq: __m256i) -> i32 {
    let s8 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(1), aq);
    let s4 = _mm_add_epi32(
        _mm256_castsi256_si128(s8),
        _mm256_extracti128_si256::<1>(s8),
    );
    let s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
    _mm_cvtsi128_si32(s2) + _mm_extract_epi32::<1>(s2)
}

/// The reference's combination of the 4 block lanes, (0 + 2) + (1 + 3), per row, into `out`
/// for each activation row.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
pub(super) fn finish<const N: usize>(lanes: &[[__m512; 4]; N], out: &mut [[f32; 16]; N]) {
    for (l, out) in lanes.iter().zip(out) {
        let total = _mm512_add_ps(_mm512_add_ps(l[0], l[2]), _mm512_add_ps(l[1], l[3]));
        // SAFETY: `out` holds 16 f32.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), total) };
    }
}

/// The i32 at `p` (4 bytes, unaligned) in every lane: 4 activation bytes for `vpdpbusd`, or
/// two i16 block sums for `vpdpwssd`.
///
/// # Safety
/// `p` must point at 4 readable bytes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
pub(super) unsafe fn bcast4(p: *const u8) -> __m512i {
    // SAFETY: the caller's.
    _mm512_set1_epi32(unsafe { p.cast::<i32>().read_unaligned() })
}

/// The 16 f16 at `p` (one per row of the group) as f32; the conversion is exact.
///
/// # Safety
/// `p` must point at 32 readable bytes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
pub(super) unsafe fn f16x16(p: *const u8) -> __m512 {
    // SAFETY: the caller's.
    _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(p.cast()) })
}

/// The f32 at `p` (a Q8_K block's d) in every lane.
///
/// # Safety
/// `p` must point at 4 readable bytes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
pub(super) unsafe fn f32_lanes(p: *const u8) -> __m512 {
    // SAFETY: the caller's.
    _mm512_set1_ps(unsafe { p.cast::<f32>().read_unaligned() })
}

/// Of the Q8_0 activation block at `p`: Σ of its quants ([`block_sum`]) and its d in every
/// lane, which the kernels that bias their weights to unsigned need once a block.
///
/// # Safety
/// `p` must point at a whole Q8_0 block (34 readable bytes).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
pub(super) unsafe fn q8_0_sum(p: *const u8) -> (i32, __m512) {
    // SAFETY: the caller's; the block's 32 quants at 2 and its d at 0.
    let (aq, da) = unsafe { (_mm256_loadu_si256(p.add(2).cast()), f16_lanes(p)) };
    (block_sum(aq), da)
}

/// The f16 at `p` (an activation block's scale) in every lane; the conversion is exact.
///
/// # Safety
/// `p` must point at 2 readable bytes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
pub(super) unsafe fn f16_lanes(p: *const u8) -> __m512 {
    // SAFETY: the caller's.
    _mm512_cvtph_ps(_mm256_set1_epi16(unsafe {
        p.cast::<i16>().read_unaligned()
    }))
}
