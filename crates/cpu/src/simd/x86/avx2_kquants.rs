//! AVX2 dots of the 256-element types (K-quants, IQ4_XS, Q8_K) with Q8_K activations.
//! Integer sums per super-block are exact (pairs of byte products in i16 never saturate, the
//! sub-block scales multiply in i32); the f32 part repeats the reference expression, and
//! super-block values accumulate in the reference's 4 block lanes (`BlockSum`).

use crate::simd::BlockSum;
use std::arch::x86_64::*;

use super::{
    dot_i8_any, f16_at, f32_at, hsum_i32, iq4_table, load16, load32, pairs_small_w, PREFETCH_AHEAD,
};

/// Q8_K activation block: d f32 | qs i8[256] | bsums i16[16].
const Q8K: usize = 292;

/// 16 i16 sub-block scales, each half of 8 broadcast to both 128-bit lanes, so that one byte
/// shuffle gives the scales of a 32-element pair of sub-blocks.
#[derive(Clone, Copy)]
struct Scales16([__m256i; 2]);

impl Scales16 {
    /// From 16 signed bytes.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn from_i8(v: __m128i) -> Scales16 {
        let lo = _mm_cvtepi8_epi16(v);
        let hi = _mm_cvtepi8_epi16(_mm_srli_si128::<8>(v));
        Scales16([
            _mm256_broadcastsi128_si256(lo),
            _mm256_broadcastsi128_si256(hi),
        ])
    }

    /// Per-pair i16 sums of sub-blocks s (low 128 bits) and s + 1 (high 128 bits), s even,
    /// times their scales, as 8 i32 lanes.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn times(self, p: __m256i, s: usize) -> __m256i {
        let k = s % 8;
        let idx = |k: usize| (((2 * k + 1) << 8) | (2 * k)) as i16;
        let pick = _mm256_set_m128i(_mm_set1_epi16(idx(k + 1)), _mm_set1_epi16(idx(k)));
        _mm256_madd_epi16(p, _mm256_shuffle_epi8(self.0[s / 8], pick))
    }
}

/// Prefetches the weight bytes [`PREFETCH_AHEAD`] past the start of super-block `wb` (the 4
/// lines a 144..210-byte super-block spans; past the row is fine: a prefetch never faults).
#[inline]
#[target_feature(enable = "avx2")]
fn prefetch_block(wb: &[u8]) {
    let p = wb.as_ptr().wrapping_add(PREFETCH_AHEAD);
    for l in 0..4 {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64 * l).cast());
    }
}

/// Bits `shift..shift + 2` of every byte.
#[inline]
#[target_feature(enable = "avx2")]
fn two_bits(q: __m256i, shift: i32) -> __m256i {
    let shifted = _mm256_srl_epi16(q, _mm_cvtsi32_si128(shift));
    _mm256_and_si256(shifted, _mm256_set1_epi8(3))
}

/// 0xff in every byte of `v` whose bit `bit` is set, else 0.
#[inline]
#[target_feature(enable = "avx2")]
fn bit_set(v: __m256i, bit: usize) -> __m256i {
    let m = _mm256_set1_epi8((1u8 << bit) as i8);
    _mm256_cmpeq_epi8(_mm256_and_si256(v, m), m)
}

#[target_feature(enable = "avx2,f16c")]
pub(super) fn dot_q2_k(w: &[u8], a: &[u8]) -> f32 {
    let mut sum = BlockSum::new();
    for (wb, ab) in w.chunks_exact(84).zip(a.chunks_exact(Q8K)) {
        let sc = load16(&wb[0..16]);
        let nib = _mm_set1_epi8(0x0f);
        let scales = Scales16::from_i8(_mm_and_si128(sc, nib));
        let aq = &ab[4..260];
        let mut acc = _mm256_setzero_si256();
        for k in 0..2 {
            let q2 = load32(&wb[16 + 32 * k..]);
            for j in 0..4 {
                let q = two_bits(q2, 2 * j as i32);
                let p = _mm256_maddubs_epi16(q, load32(&aq[128 * k + 32 * j..]));
                acc = _mm256_add_epi32(acc, scales.times(p, 8 * k + 2 * j));
            }
        }
        let mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(sc), nib));
        let mprod = _mm256_madd_epi16(load32(&ab[260..292]), mins);
        let (isum, summs) = hsum_pair(acc, mprod);
        let ad = f32_at(ab, 0);
        let dall = ad * f16_at(wb, 80);
        let dmin = ad * f16_at(wb, 82);
        sum.add(dall * isum as f32 - dmin * summs as f32);
    }
    sum.total()
}

/// The 16 six-bit Q3_K scales minus 32, as signed bytes (low nibbles in bytes 0..8, top
/// bits in bytes 8..12).
fn q3_k_scales(s: &[u8]) -> [u8; 16] {
    std::array::from_fn(|i| {
        let lo = if i < 8 { s[i] & 0x0f } else { s[i - 8] >> 4 };
        let hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
        ((lo | (hi << 4)) as i8 - 32) as u8
    })
}

#[target_feature(enable = "avx2,f16c")]
pub(super) fn dot_q3_k(w: &[u8], a: &[u8]) -> f32 {
    let mut sum = BlockSum::new();
    for (wb, ab) in w.chunks_exact(110).zip(a.chunks_exact(Q8K)) {
        let scales = Scales16::from_i8(load16(&q3_k_scales(&wb[96..108])));
        let hmask = load32(&wb[0..32]);
        let aq = &ab[4..260];
        let mut acc = _mm256_setzero_si256();
        for k in 0..2 {
            let q2 = load32(&wb[32 + 32 * k..]);
            for j in 0..4 {
                let low = two_bits(q2, 2 * j as i32);
                // Elements whose hmask bit is clear are 4 lower: q in -4..=3.
                let minus4 = _mm256_andnot_si256(bit_set(hmask, 4 * k + j), _mm256_set1_epi8(4));
                let q = _mm256_sub_epi8(low, minus4);
                let p = pairs_small_w(q, load32(&aq[128 * k + 32 * j..]));
                acc = _mm256_add_epi32(acc, scales.times(p, 8 * k + 2 * j));
            }
        }
        let isum = hsum_i32(acc);
        sum.add(f16_at(wb, 108) * f32_at(ab, 0) * isum as f32);
    }
    sum.total()
}

/// The 8 six-bit scales and 8 six-bit mins of Q4_K/Q5_K, one per byte, from their 12 packed
/// bytes with word operations (the layout `quants::unpack_scale_min_k4` documents): bytes
/// 0..4 hold scales 0..4 and the top bits of scales 4..8, bytes 4..8 the same for the mins,
/// bytes 8..12 the low nibbles of scales 4..8 and (high nibbles) mins 4..8.
#[inline]
fn scales_mins_k4(s: &[u8]) -> (u64, u64) {
    let word = |i: usize| u32::from_le_bytes([s[i], s[i + 1], s[i + 2], s[i + 3]]);
    let (x0, x1, x2) = (word(0), word(4), word(8));
    let low6 = 0x3f3f_3f3f;
    let nib = 0x0f0f_0f0f;
    // Bits 6..8 of every byte moved to bits 4..6 of the same byte.
    let top = |x: u32| ((x >> 6) & 0x0303_0303) << 4;
    let sc = (x0 & low6) as u64 | (((x2 & nib) | top(x0)) as u64) << 32;
    let mn = (x1 & low6) as u64 | ((((x2 >> 4) & nib) | top(x1)) as u64) << 32;
    (sc, mn)
}

/// Both sums of 8 i32 lanes at once.
#[inline]
#[target_feature(enable = "avx2")]
fn hsum_pair(a: __m256i, b: __m256i) -> (i32, i32) {
    let h = _mm256_hadd_epi32(a, b);
    let s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
    let s = _mm_hadd_epi32(s, s);
    (_mm_cvtsi128_si32(s), _mm_extract_epi32::<1>(s))
}

/// Shared by Q4_K and Q5_K: `quants(j)` gives the unsigned quants of sub-blocks 2j and 2j+1.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn dot_scale_min(
    w: &[u8],
    a: &[u8],
    block: usize,
    quants: impl Fn(&[u8], usize) -> (__m256i, __m256i),
) -> f32 {
    let mut sum = BlockSum::new();
    for (wb, ab) in w.chunks_exact(block).zip(a.chunks_exact(Q8K)) {
        prefetch_block(wb);
        let (sc, mn) = scales_mins_k4(&wb[4..16]);
        // The 8 scales as i16 in both 128-bit lanes; scale s is broadcast by a byte shuffle.
        let scales = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc as i64)));
        let aq = &ab[4..260];
        let mut acc = _mm256_setzero_si256();
        for j in 0..4 {
            let (lo, hi) = quants(wb, j);
            let pick = |s: usize| {
                let idx = (((2 * s + 1) << 8) | (2 * s)) as i16;
                _mm256_shuffle_epi8(scales, _mm256_set1_epi16(idx))
            };
            // Quants are at most 31: pairs stay far below i16 saturation.
            let p_lo = _mm256_maddubs_epi16(lo, load32(&aq[64 * j..]));
            let p_hi = _mm256_maddubs_epi16(hi, load32(&aq[64 * j + 32..]));
            let p_lo = _mm256_madd_epi16(p_lo, pick(2 * j));
            let p_hi = _mm256_madd_epi16(p_hi, pick(2 * j + 1));
            acc = _mm256_add_epi32(acc, _mm256_add_epi32(p_lo, p_hi));
        }
        // A 32-element sub-block covers two 16-element bsums: each min twice.
        let mins = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(mn as i64));
        let mins = _mm256_set_m128i(
            _mm_unpackhi_epi16(mins, mins),
            _mm_unpacklo_epi16(mins, mins),
        );
        let mprod = _mm256_madd_epi16(load32(&ab[260..292]), mins);
        let (isum, msum) = hsum_pair(acc, mprod);
        let ad = f32_at(ab, 0);
        let d = f16_at(wb, 0) * ad;
        let dmin = f16_at(wb, 2) * ad;
        sum.add(d * isum as f32 - dmin * msum as f32);
    }
    sum.total()
}

#[target_feature(enable = "avx2,f16c")]
pub(super) fn dot_q4_k(w: &[u8], a: &[u8]) -> f32 {
    dot_scale_min(w, a, 144, |wb, j| {
        let q = load32(&wb[16 + 32 * j..]);
        let m = _mm256_set1_epi8(0x0f);
        (
            _mm256_and_si256(q, m),
            _mm256_and_si256(_mm256_srli_epi16::<4>(q), m),
        )
    })
}

#[target_feature(enable = "avx2,f16c")]
pub(super) fn dot_q5_k(w: &[u8], a: &[u8]) -> f32 {
    dot_scale_min(w, a, 176, |wb, j| {
        let qh = load32(&wb[16..48]);
        let q = load32(&wb[48 + 32 * j..]);
        let m = _mm256_set1_epi8(0x0f);
        let b4 = _mm256_set1_epi8(0x10);
        let lo = _mm256_and_si256(q, m);
        let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), m);
        let lo_h = _mm256_and_si256(bit_set(qh, 2 * j), b4);
        let hi_h = _mm256_and_si256(bit_set(qh, 2 * j + 1), b4);
        (_mm256_or_si256(lo, lo_h), _mm256_or_si256(hi, hi_h))
    })
}

#[target_feature(enable = "avx2,f16c")]
pub(super) fn dot_q6_k(w: &[u8], a: &[u8]) -> f32 {
    let mut sum = BlockSum::new();
    for (wb, ab) in w.chunks_exact(210).zip(a.chunks_exact(Q8K)) {
        prefetch_block(wb);
        let scales = Scales16::from_i8(load16(&wb[192..208]));
        let aq = &ab[4..260];
        let m = _mm256_set1_epi8(0x0f);
        let mut acc = _mm256_setzero_si256();
        for h in 0..2 {
            let ql0 = load32(&wb[64 * h..]);
            let ql1 = load32(&wb[64 * h + 32..]);
            let qh = load32(&wb[128 + 32 * h..]);
            let lows = [
                _mm256_and_si256(ql0, m),
                _mm256_and_si256(ql1, m),
                _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m),
                _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m),
            ];
            for (i, low) in lows.into_iter().enumerate() {
                let high = _mm256_slli_epi16::<4>(two_bits(qh, 2 * i as i32));
                // Σ (q - 32)·a per pair as Σ q·a - Σ 32·a: q lies in 0..=63, so both are
                // exact maddubs pairs (|q·a + q·a| ≤ 16,128, |32·a + 32·a| ≤ 8,192) and so
                // is their difference (≤ 24,320), for any activation byte. One op fewer
                // than the sign trick on q - 32 (subtract, abs, sign).
                let av = load32(&aq[128 * h + 32 * i..]);
                let p = _mm256_sub_epi16(
                    _mm256_maddubs_epi16(_mm256_or_si256(low, high), av),
                    _mm256_maddubs_epi16(_mm256_set1_epi8(32), av),
                );
                acc = _mm256_add_epi32(acc, scales.times(p, 8 * h + 2 * i));
            }
        }
        let isum = hsum_i32(acc);
        sum.add(f16_at(wb, 208) * f32_at(ab, 0) * isum as f32);
    }
    sum.total()
}

#[target_feature(enable = "avx2,f16c")]
pub(super) fn dot_q8_k(w: &[u8], a: &[u8]) -> f32 {
    let mut sum = BlockSum::new();
    for (wb, ab) in w.chunks_exact(Q8K).zip(a.chunks_exact(Q8K)) {
        let mut acc = _mm256_setzero_si256();
        for c in 0..8 {
            acc = _mm256_add_epi32(acc, dot_i8_any(&wb[4 + 32 * c..], &ab[4 + 32 * c..]));
        }
        let isum = hsum_i32(acc);
        sum.add(f32_at(wb, 0) * f32_at(ab, 0) * isum as f32);
    }
    sum.total()
}

/// The 8 IQ4_XS sub-block scales minus 32: low nibbles in scales_l, top two bits in scales_h.
fn iq4_xs_scales(b: &[u8]) -> [i16; 8] {
    let scales_h = u16::from_le_bytes([b[2], b[3]]);
    std::array::from_fn(|s| {
        let lo = (b[4 + s / 2] >> (4 * (s % 2))) & 0x0f;
        let hi = ((scales_h >> (2 * s)) & 3) as u8;
        (lo | (hi << 4)) as i16 - 32
    })
}

#[target_feature(enable = "avx2,f16c")]
pub(super) fn dot_iq4_xs(w: &[u8], a: &[u8]) -> f32 {
    let table = iq4_table();
    let m = _mm256_set1_epi8(0x0f);
    let mut sum = BlockSum::new();
    for (wb, ab) in w.chunks_exact(136).zip(a.chunks_exact(Q8K)) {
        let scales = iq4_xs_scales(wb);
        let aq = &ab[4..260];
        let mut acc = _mm256_setzero_si256();
        for t in 0..4 {
            // 32 bytes = the 16 packed bytes of sub-blocks 2t and 2t+1.
            let x = load32(&wb[8 + 32 * t..]);
            let lo = _mm256_and_si256(x, m);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(x), m);
            let subs = [
                _mm256_permute2x128_si256::<0x20>(lo, hi),
                _mm256_permute2x128_si256::<0x31>(lo, hi),
            ];
            for (u, nib) in subs.into_iter().enumerate() {
                let s = 2 * t + u;
                // Table values lie in -127..=113.
                let v = _mm256_shuffle_epi8(table, nib);
                let p = pairs_small_w(v, load32(&aq[32 * s..]));
                let p = _mm256_madd_epi16(p, _mm256_set1_epi16(scales[s]));
                acc = _mm256_add_epi32(acc, p);
            }
        }
        let isum = hsum_i32(acc);
        sum.add(f16_at(wb, 0) * f32_at(ab, 0) * isum as f32);
    }
    sum.total()
}

#[cfg(test)]
mod tests {
    /// The word-wise unpacking agrees with the reference's byte-wise one on every bit
    /// pattern class (random 12-byte strings, plus all-ones and all-zeros).
    #[test]
    fn scales_mins_k4_match_the_reference_unpacking() {
        let mut state = 0x1234_5678_9abc_def0u64;
        let mut cases: Vec<[u8; 12]> = vec![[0; 12], [0xff; 12]];
        for _ in 0..10_000 {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let hi = state.to_le_bytes();
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let lo = state.to_le_bytes();
            cases.push(std::array::from_fn(
                |i| if i < 8 { hi[i] } else { lo[i - 8] },
            ));
        }
        for s in cases {
            let (sc, mn) = super::scales_mins_k4(&s);
            let (want_sc, want_mn) = minfer_gguf::quants::unpack_scale_min_k4(&s);
            assert_eq!(sc.to_le_bytes(), want_sc, "{s:?}");
            assert_eq!(mn.to_le_bytes(), want_mn, "{s:?}");
        }
    }
}
