//! AVX2 dots of the 256-element types (K-quants, IQ4_XS, Q8_K) with Q8_K activations.
//! Integer sums per super-block are exact (pairs of byte products in i16 never saturate, the
//! sub-block scales multiply in i32); the f32 part repeats the reference expression, and
//! super-blocks add one after another into an f32 sum.

use std::arch::x86_64::*;

use minfer_gguf::quants::unpack_scale_min_k4;

use super::{dot_i8_any, f16_at, f32_at, hsum_i32, iq4_table, load16, load32, pairs_small_w};

/// Q8_K activation block: d f32 | qs i8[256] | bsums i16[16].
const Q8K: usize = 292;

/// Per-pair i16 sums of 32 elements (two 16-element sub-blocks) times their two scales,
/// as 8 i32 lanes.
#[inline]
#[target_feature(enable = "avx2")]
fn scale_pairs(p: __m256i, lo_scale: i16, hi_scale: i16) -> __m256i {
    let s = _mm256_set_m128i(_mm_set1_epi16(hi_scale), _mm_set1_epi16(lo_scale));
    _mm256_madd_epi16(p, s)
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

/// Σ bsums[j] · m[j] over the 16 activation sub-block sums and 16 small multipliers.
#[inline]
#[target_feature(enable = "avx2")]
fn bsum_dot(ab: &[u8], m: &[u8; 16]) -> i32 {
    let bsums = load32(&ab[260..292]);
    hsum_i32(_mm256_madd_epi16(bsums, _mm256_cvtepu8_epi16(load16(m))))
}

#[target_feature(enable = "avx2,f16c")]
pub(super) fn dot_q2_k(w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    for (wb, ab) in w.chunks_exact(84).zip(a.chunks_exact(Q8K)) {
        let sc = &wb[0..16];
        let aq = &ab[4..260];
        let mut acc = _mm256_setzero_si256();
        for k in 0..2 {
            let q2 = load32(&wb[16 + 32 * k..]);
            for j in 0..4 {
                let q = two_bits(q2, 2 * j as i32);
                let p = _mm256_maddubs_epi16(q, load32(&aq[128 * k + 32 * j..]));
                let s = 8 * k + 2 * j;
                let p = scale_pairs(p, (sc[s] & 0x0f) as i16, (sc[s + 1] & 0x0f) as i16);
                acc = _mm256_add_epi32(acc, p);
            }
        }
        let isum = hsum_i32(acc);
        let mins: [u8; 16] = std::array::from_fn(|s| sc[s] >> 4);
        let summs = bsum_dot(ab, &mins);
        let ad = f32_at(ab, 0);
        let dall = ad * f16_at(wb, 80);
        let dmin = ad * f16_at(wb, 82);
        sum += dall * isum as f32 - dmin * summs as f32;
    }
    sum
}

/// The 16 six-bit Q3_K scales minus 32 (low nibbles in bytes 0..8, top bits in bytes 8..12).
fn q3_k_scales(s: &[u8]) -> [i16; 16] {
    std::array::from_fn(|i| {
        let lo = if i < 8 { s[i] & 0x0f } else { s[i - 8] >> 4 };
        let hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
        (lo | (hi << 4)) as i16 - 32
    })
}

#[target_feature(enable = "avx2,f16c")]
pub(super) fn dot_q3_k(w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    for (wb, ab) in w.chunks_exact(110).zip(a.chunks_exact(Q8K)) {
        let scales = q3_k_scales(&wb[96..108]);
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
                let s = 8 * k + 2 * j;
                acc = _mm256_add_epi32(acc, scale_pairs(p, scales[s], scales[s + 1]));
            }
        }
        let isum = hsum_i32(acc);
        sum += f16_at(wb, 108) * f32_at(ab, 0) * isum as f32;
    }
    sum
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
    let mut sum = 0.0f32;
    for (wb, ab) in w.chunks_exact(block).zip(a.chunks_exact(Q8K)) {
        let (sc, mn) = unpack_scale_min_k4(&wb[4..16]);
        let aq = &ab[4..260];
        let mut acc = _mm256_setzero_si256();
        for j in 0..4 {
            let (lo, hi) = quants(wb, j);
            // Quants are at most 31: pairs stay far below i16 saturation.
            let p_lo = _mm256_maddubs_epi16(lo, load32(&aq[64 * j..]));
            let p_hi = _mm256_maddubs_epi16(hi, load32(&aq[64 * j + 32..]));
            let p_lo = _mm256_madd_epi16(p_lo, _mm256_set1_epi16(sc[2 * j] as i16));
            let p_hi = _mm256_madd_epi16(p_hi, _mm256_set1_epi16(sc[2 * j + 1] as i16));
            acc = _mm256_add_epi32(acc, _mm256_add_epi32(p_lo, p_hi));
        }
        let isum = hsum_i32(acc);
        // A 32-element sub-block covers two 16-element bsums.
        let mins: [u8; 16] = std::array::from_fn(|j| mn[j / 2]);
        let msum = bsum_dot(ab, &mins);
        let ad = f32_at(ab, 0);
        let d = f16_at(wb, 0) * ad;
        let dmin = f16_at(wb, 2) * ad;
        sum += d * isum as f32 - dmin * msum as f32;
    }
    sum
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
    let mut sum = 0.0f32;
    for (wb, ab) in w.chunks_exact(210).zip(a.chunks_exact(Q8K)) {
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
                // q - 32 lies in -32..=31.
                let q = _mm256_sub_epi8(_mm256_or_si256(low, high), _mm256_set1_epi8(32));
                let p = pairs_small_w(q, load32(&aq[128 * h + 32 * i..]));
                let s = 192 + 8 * h + 2 * i;
                let p = scale_pairs(p, wb[s] as i8 as i16, wb[s + 1] as i8 as i16);
                acc = _mm256_add_epi32(acc, p);
            }
        }
        let isum = hsum_i32(acc);
        sum += f16_at(wb, 208) * f32_at(ab, 0) * isum as f32;
    }
    sum
}

#[target_feature(enable = "avx2,f16c")]
pub(super) fn dot_q8_k(w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    for (wb, ab) in w.chunks_exact(Q8K).zip(a.chunks_exact(Q8K)) {
        let mut acc = _mm256_setzero_si256();
        for c in 0..8 {
            acc = _mm256_add_epi32(acc, dot_i8_any(&wb[4 + 32 * c..], &ab[4 + 32 * c..]));
        }
        let isum = hsum_i32(acc);
        sum += f32_at(wb, 0) * f32_at(ab, 0) * isum as f32;
    }
    sum
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
    let mut sum = 0.0f32;
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
        sum += f16_at(wb, 0) * f32_at(ab, 0) * isum as f32;
    }
    sum
}
