//! AVX-512 dots of Q4_K and Q6_K with Q8_K activations, 64 elements per vector.
//! Integer sums per super-block are exact: `vpmaddubsw` pairs unsigned quants (at most 63)
//! with signed activation bytes (a pair is at most 2·63·128 = 16128, no saturation), and
//! VNNI's `vpdpwssd` multiplies each pair by its sub-block scale into i32 lanes. The f32 part
//! repeats the reference expression, and super-block values accumulate in the reference's 4
//! block lanes (`BlockSum`). The other K-quant types run the AVX2 kernels: a Q5_K kernel built
//! like Q4_K's (fifth bits by mask) was slower than AVX2's on the Sapphire Rapids host
//! (199-213 vs 175-184 ns per 4096-element row) and was removed.

use std::arch::x86_64::*;

use super::avx512_dispatch::{hsum_i32x16, join256, load64};
use super::{f16_at, f32_at, hsum_i32, load16, load32};
use crate::simd::BlockSum;

/// Q8_K activation block: d f32 | qs i8[256] | bsums i16[16].
const Q8K: usize = 292;

/// Indices for `_mm512_permutexvar_epi16`: i16 lane k picks scale `first + k / run` (a run of
/// `run` equal scales per sub-block).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
fn spread_index(first: usize, run: usize) -> __m512i {
    let idx: [i16; 32] = std::array::from_fn(|k| (first + k / run) as i16);
    // SAFETY: `idx` is 64 readable bytes; loadu has no alignment requirement.
    unsafe { _mm512_loadu_si512(idx.as_ptr().cast()) }
}

/// The 8 six-bit scales and 8 six-bit mins of Q4_K/Q5_K, one per byte, from their 12 packed
/// bytes with word operations. Layout (`quants::unpack_scale_min_k4`): bytes 0..4 hold scales
/// 0..4 in their low 6 bits and the top 2 bits of scales 4..8 in bits 6..8; bytes 4..8 the
/// same for the mins; bytes 8..12 the low 4 bits of scales 4..8 (low nibble) and of mins 4..8
/// (high nibble).
#[inline]
pub(super) fn scales_mins_k4(s: &[u8]) -> (u64, u64) {
    let word = |i: usize| {
        let mut v = [0u8; 4];
        v.copy_from_slice(&s[i..i + 4]);
        u32::from_le_bytes(v)
    };
    let (a, b, c) = (word(0), word(4), word(8));
    let six = 0x3f3f_3f3f;
    let four = 0x0f0f_0f0f;
    // Bits 6..8 of each byte, moved to bits 4..6.
    let top2 = |x: u32| (x >> 2) & 0x3030_3030;
    let scales = (a & six) as u64 | (((c & four) | top2(a)) as u64) << 32;
    let mins = (b & six) as u64 | ((((c >> 4) & four) | top2(b)) as u64) << 32;
    (scales, mins)
}

/// The low and high nibbles of 32 bytes: elements of sub-blocks 2j and 2j + 1 of a Q4_K/Q5_K
/// super-block, in element order.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
fn nibble_halves(q: __m256i) -> __m512i {
    let m = _mm256_set1_epi8(0x0f);
    join256(
        _mm256_and_si256(q, m),
        _mm256_and_si256(_mm256_srli_epi16::<4>(q), m),
    )
}

/// The Q4_K dot (kept apart from its block layout so a Q5_K could share it): `quants(wb, j)`
/// gives the unsigned quants (at most 31) of sub-blocks 2j and 2j + 1.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
fn dot_scale_min(
    w: &[u8],
    a: &[u8],
    block: usize,
    quants: impl Fn(&[u8], usize) -> __m512i,
) -> f32 {
    let mut sum = BlockSum::new();
    let spread: [__m512i; 4] = std::array::from_fn(|j| spread_index(2 * j, 16));
    for (wb, ab) in w.chunks_exact(block).zip(a.chunks_exact(Q8K)) {
        let (sc, mn) = scales_mins_k4(&wb[4..16]);
        let scales = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc as i64)));
        let aq = &ab[4..260];
        let mut acc = _mm512_setzero_si512();
        for j in 0..4 {
            let p = _mm512_maddubs_epi16(quants(wb, j), load64(&aq[64 * j..]));
            let s = _mm512_permutexvar_epi16(spread[j], scales);
            acc = _mm512_dpwssd_epi32(acc, p, s);
        }
        // A 32-element sub-block covers two 16-element bsums: each min twice.
        let mins = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(mn as i64));
        let mins = _mm256_set_m128i(
            _mm_unpackhi_epi16(mins, mins),
            _mm_unpacklo_epi16(mins, mins),
        );
        let mprod = _mm256_madd_epi16(load32(&ab[260..292]), mins);
        let isum = hsum_i32x16(acc);
        let msum = hsum_i32(mprod);
        let ad = f32_at(ab, 0);
        let d = f16_at(wb, 0) * ad;
        let dmin = f16_at(wb, 2) * ad;
        sum.add(d * isum as f32 - dmin * msum as f32);
    }
    sum.total()
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
pub(super) fn dot_q4_k(w: &[u8], a: &[u8]) -> f32 {
    dot_scale_min(w, a, 144, |wb, j| nibble_halves(load32(&wb[16 + 32 * j..])))
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
pub(super) fn dot_q6_k(w: &[u8], a: &[u8]) -> f32 {
    let mut sum = BlockSum::new();
    let m = _mm512_set1_epi8(0x0f);
    let three = _mm512_set1_epi8(3);
    let bias = _mm512_set1_epi8(32);
    let spread: [__m512i; 4] = std::array::from_fn(|k| spread_index(4 * k, 8));
    for (wb, ab) in w.chunks_exact(210).zip(a.chunks_exact(Q8K)) {
        let scales = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(load16(&wb[192..208])));
        let aq = &ab[4..260];
        let mut acc = _mm512_setzero_si512();
        for h in 0..2 {
            // Elements 128h + 32i + l: nibble i / 2 of ql[64h + 32(i % 2) + l], high bits
            // 2i..2i+2 of qh[32h + l]. Vector `half` holds i = 2·half and 2·half + 1.
            let ql = load64(&wb[64 * h..]);
            let qh = _mm512_broadcast_i64x4(load32(&wb[128 + 32 * h..]));
            for half in 0..2 {
                let low = if half == 0 {
                    _mm512_and_si512(ql, m)
                } else {
                    _mm512_and_si512(_mm512_srli_epi16::<4>(ql), m)
                };
                // Shift by 2i in the low 256 bits, 2i + 2 in the high ones.
                let shift = _mm512_mask_blend_epi16(
                    0xffff_0000,
                    _mm512_set1_epi16(4 * half as i16),
                    _mm512_set1_epi16(4 * half as i16 + 2),
                );
                let high = _mm512_and_si512(_mm512_srlv_epi16(qh, shift), three);
                let u = _mm512_or_si512(low, _mm512_slli_epi16::<4>(high));
                let act = load64(&aq[128 * h + 64 * half..]);
                // Σ (u - 32)·a per pair: both pair sums fit i16, and so does their difference
                // (at most 16128 + 8192).
                let p = _mm512_sub_epi16(
                    _mm512_maddubs_epi16(u, act),
                    _mm512_maddubs_epi16(bias, act),
                );
                let s = _mm512_permutexvar_epi16(spread[2 * h + half], scales);
                acc = _mm512_dpwssd_epi32(acc, p, s);
            }
        }
        let isum = hsum_i32x16(acc);
        sum.add(f16_at(wb, 208) * f32_at(ab, 0) * isum as f32);
    }
    sum.total()
}

#[cfg(test)]
mod tests {
    /// The word-wise unpacking agrees with the reference's byte-wise one on random 12-byte
    /// strings and on all-ones and all-zeros. (Control: `top2` shifting by 4 instead of 2
    /// made it fail.)
    #[test]
    fn scales_mins_k4_match_the_reference_unpacking() {
        let mut state = 0x0bad_5eed_1234_5678u64;
        let mut cases: Vec<[u8; 12]> = vec![[0; 12], [0xff; 12]];
        for _ in 0..10_000 {
            let mut s = [0u8; 12];
            for b in &mut s {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                *b = (state >> 24) as u8;
            }
            cases.push(s);
        }
        for s in cases {
            let (sc, mn) = super::scales_mins_k4(&s);
            let (want_sc, want_mn) = minfer_gguf::quants::unpack_scale_min_k4(&s);
            assert_eq!(sc.to_le_bytes(), want_sc, "{s:?}");
            assert_eq!(mn.to_le_bytes(), want_mn, "{s:?}");
        }
    }
}
