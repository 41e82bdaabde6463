//! The dots of [`super::legacy`] and [`super::q6k`] with AVX2 + FMA, instruction for
//! instruction the structure they describe (maddubs + madd into eight i32 lanes, one `fma` per
//! block, `hsum_float_8`), so the same bits come out faster. `maddubs` saturates at ±32767;
//! the pairs here stay below it because activations come from ggml's quantizers (|q| <= 127)
//! and weights are at most 128 in magnitude (pairs <= 2 · 128 · 127). `tests` below checks
//! every function against its scalar reference.

use std::arch::x86_64::*;

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum(v: __m256) -> f32 {
    let r = _mm_add_ps(_mm256_extractf128_ps::<1>(v), _mm256_castps256_ps128(v));
    let r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    let r = _mm_add_ss(r, _mm_movehdup_ps(r));
    _mm_cvtss_f32(r)
}

/// The f16 at byte `at` as f32 (F16C, exact like any f16 -> f32 conversion).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn f16(b: &[u8], at: usize) -> f32 {
    let bits = u16::from_le_bytes([b[at], b[at + 1]]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

/// Signed bytes x times signed bytes y, four products per i32 lane, as f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn mul_sum_i8(x: __m256i, y: __m256i) -> __m256 {
    let ax = _mm256_sign_epi8(x, x);
    let sy = _mm256_sign_epi8(y, x);
    mul_sum_u8_i8(ax, sy)
}

/// Unsigned bytes u times signed bytes s, four products per i32 lane, as f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn mul_sum_u8_i8(u: __m256i, s: __m256i) -> __m256 {
    let p16 = _mm256_maddubs_epi16(u, s);
    _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load32(b: &[u8]) -> __m256i {
    let b = &b[..32];
    // SAFETY: 32 readable bytes; loadu has no alignment requirement.
    unsafe { _mm256_loadu_si256(b.as_ptr().cast()) }
}

/// 16 bytes of nibbles: low nibbles then high nibbles, 32 bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn nibbles(b: &[u8]) -> __m256i {
    let b = &b[..16];
    // SAFETY: 16 readable bytes.
    let t = unsafe { _mm_loadu_si128(b.as_ptr().cast()) };
    let both = _mm256_set_m128i(_mm_srli_epi16::<4>(t), t);
    _mm256_and_si256(both, _mm256_set1_epi8(0x0f))
}

/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q8_0(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (wb, ab) in w.chunks_exact(34).zip(a.chunks_exact(34)) {
        let d = _mm256_set1_ps(f16(wb, 0) * f16(ab, 0));
        let q = mul_sum_i8(load32(&wb[2..]), load32(&ab[2..]));
        acc = _mm256_fmadd_ps(d, q, acc);
    }
    hsum(acc)
}

/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q5_0(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let bit_mask = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe);
    let spread = _mm256_set_epi64x(
        0x0303_0303_0303_0303,
        0x0202_0202_0202_0202,
        0x0101_0101_0101_0101,
        0,
    );
    for (wb, ab) in w.chunks_exact(22).zip(a.chunks_exact(34)) {
        let d = _mm256_set1_ps(f16(wb, 0) * f16(ab, 0));
        let qh = i32::from_le_bytes([wb[2], wb[3], wb[4], wb[5]]);
        // Byte j = 0xff where bit j of qh is set.
        let bits = _mm256_shuffle_epi8(_mm256_set1_epi32(qh), spread);
        let bits = _mm256_cmpeq_epi8(_mm256_or_si256(bits, bit_mask), _mm256_set1_epi64x(-1));
        // Clear bit 5 -> subtract 16: OR 0xf0 where the bit is 0.
        let hi = _mm256_andnot_si256(bits, _mm256_set1_epi8(0xf0u8 as i8));
        let qx = _mm256_or_si256(nibbles(&wb[6..]), hi);
        let q = mul_sum_i8(qx, load32(&ab[2..]));
        acc = _mm256_fmadd_ps(d, q, acc);
    }
    hsum(acc)
}

/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q4_1(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut summs = 0f32;
    for (wb, ab) in w.chunks_exact(20).zip(a.chunks_exact(36)) {
        let d = _mm256_set1_ps(f16(wb, 0) * f16(ab, 0));
        summs = f16(wb, 2).mul_add(f16(ab, 2), summs);
        let q = mul_sum_u8_i8(nibbles(&wb[4..]), load32(&ab[4..]));
        acc = _mm256_fmadd_ps(d, q, acc);
    }
    hsum(acc) + summs
}

/// Per 32-byte chunk c of a 128-element half, the two scales of its 16-byte halves as 16 i16.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn chunk_scales(sc: &[u8], c: usize) -> __m256i {
    let (s0, s1) = (sc[2 * c] as i8 as i16, sc[2 * c + 1] as i8 as i16);
    _mm256_set_m128i(_mm_set1_epi16(s1), _mm_set1_epi16(s0))
}

/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q6_k(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let m15 = _mm256_set1_epi8(15);
    let m3 = _mm256_set1_epi8(3);
    for (wb, ab) in w.chunks_exact(210).zip(a.chunks_exact(292)) {
        let d = f32::from_le_bytes([ab[0], ab[1], ab[2], ab[3]]) * f16(wb, 208);
        let sc = &wb[192..208];
        // bsums[i] * scale[i], pairs summed into eight lanes, times 32.
        let bs = &ab[260..292];
        // SAFETY: 32 readable bytes each (16 i16 sums; 16 i8 scales).
        let bsums = unsafe { _mm256_loadu_si256(bs.as_ptr().cast()) };
        let sc16 = _mm256_cvtepi8_epi16(unsafe { _mm_loadu_si128(sc.as_ptr().cast()) });
        let sub = _mm256_slli_epi32::<5>(_mm256_madd_epi16(bsums, sc16));
        let mut sumi = _mm256_setzero_si256();
        for half in 0..2 {
            let ql = &wb[64 * half..];
            let qh = load32(&wb[128 + 32 * half..]);
            let q8 = &ab[4 + 128 * half..];
            let b1 = load32(ql);
            let b2 = load32(&ql[32..]);
            let h0 = _mm256_slli_epi16::<4>(_mm256_and_si256(qh, m3));
            let h1 = _mm256_slli_epi16::<2>(_mm256_and_si256(qh, _mm256_set1_epi8(12)));
            let h2 = _mm256_and_si256(qh, _mm256_set1_epi8(48));
            let h3 = _mm256_srli_epi16::<2>(_mm256_and_si256(qh, _mm256_set1_epi8(-64)));
            let q = [
                _mm256_or_si256(_mm256_and_si256(b1, m15), h0),
                _mm256_or_si256(_mm256_and_si256(b2, m15), h1),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(b1), m15), h2),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(b2), m15), h3),
            ];
            for (c, q) in q.into_iter().enumerate() {
                let p16 = _mm256_maddubs_epi16(q, load32(&q8[32 * c..]));
                let p32 = _mm256_madd_epi16(chunk_scales(sc, 4 * half + c), p16);
                sumi = _mm256_add_epi32(sumi, p32);
            }
        }
        let sumi = _mm256_sub_epi32(sumi, sub);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum(acc)
}

#[cfg(test)]
mod tests {
    use super::super::{legacy, q6k};
    use minfer_gguf::{quants, GgmlType};

    fn act(ty: GgmlType, k: usize, seed: u32) -> Vec<u8> {
        let mut s = seed.wrapping_mul(2_654_435_761).max(1);
        let x: Vec<f32> = (0..k)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s as f32 / u32::MAX as f32 - 0.5) * 8.0
            })
            .collect();
        let at = quants::vec_dot_type(ty);
        let mut out = vec![0u8; at.row_bytes(k as u64).unwrap() as usize];
        quants::quantize_act_row(at, &x, &mut out).unwrap();
        out
    }

    /// Every SIMD dot equals its scalar reference bit for bit (control: changing the SIMD
    /// accumulation to `_mm256_add_ps(_mm256_mul_ps(d, q), acc)` fails the Q8_0 case).
    #[test]
    fn avx2_dots_equal_scalar_references() {
        if !crate::cpu_features::avx2_fma_f16c() {
            eprintln!("SKIP: no AVX2/FMA/F16C");
            return;
        }
        type Pair = (fn(&[u8], &[u8]) -> f32, unsafe fn(&[u8], &[u8]) -> f32);
        let cases: [(GgmlType, Pair); 4] = [
            (GgmlType::Q8_0, (legacy::dot_q8_0, super::dot_q8_0)),
            (GgmlType::Q5_0, (legacy::dot_q5_0, super::dot_q5_0)),
            (GgmlType::Q4_1, (legacy::dot_q4_1, super::dot_q4_1)),
            (GgmlType::Q6K, (q6k::dot_q6_k, super::dot_q6_k)),
        ];
        let mut n = 0;
        for (ty, (scalar, simd)) in cases {
            for (i, k) in [256usize, 1280, 4864].into_iter().enumerate() {
                let blocks = k / ty.block_size() as usize;
                for seed in 0..20u32 {
                    let w = quants::random_blocks(ty, blocks, seed as u64 * 7 + i as u64);
                    let a = act(ty, k, seed + 100 * i as u32);
                    let want = scalar(&w, &a);
                    // SAFETY: AVX2, FMA and F16C were detected above.
                    let got = unsafe { simd(&w, &a) };
                    assert_eq!(got.to_bits(), want.to_bits(), "{ty} k {k} seed {seed}");
                    n += 1;
                }
            }
        }
        assert_eq!(n, 240);
    }
}
