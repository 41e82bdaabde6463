//! AVX2 activation quantization to Q8_0, Q8_1 and Q8_K, byte-identical to
//! `minfer_gguf::quants::quantize_act_row`:
//!
//! - Q8_0/Q8_1 (llama.cpp's x86 rule): d = max|x| / 127, q = round-half-even(x · (127 /
//!   max|x|)), saturating `as i8` (NaN → 0).
//! - Q8_K: iscale = -127 / (the first value of largest magnitude), q = min(127,
//!   round-half-even(iscale · x)), d = 1 / iscale.
//!
//! `max|x|` uses `max_ps(|x|, acc)`, which returns `acc` when |x| is NaN: the reference's
//! `f32::max` and `>` comparisons skip NaN the same way. The scale fields are written with the
//! reference's scalar f16 conversion.

use std::arch::x86_64::*;

use minfer_gguf::quants::f32_to_f16;

/// 8 floats from `x[i..i + 8]` (bounds-checked).
#[inline]
#[target_feature(enable = "avx2")]
fn load8(x: &[f32], i: usize) -> __m256 {
    let x = &x[i..i + 8];
    // SAFETY: `x` has 8 readable f32; loadu has no alignment requirement.
    unsafe { _mm256_loadu_ps(x.as_ptr()) }
}

#[inline]
#[target_feature(enable = "avx2")]
fn abs_ps(v: __m256) -> __m256 {
    _mm256_andnot_ps(_mm256_set1_ps(-0.0), v)
}

/// max |x| over `x` (a multiple of 8 elements), NaN skipped.
#[inline]
#[target_feature(enable = "avx2")]
fn abs_max(x: &[f32]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for i in (0..x.len()).step_by(8) {
        acc = _mm256_max_ps(abs_ps(load8(x, i)), acc);
    }
    let m = _mm_max_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps::<1>(acc));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let m = _mm_max_ss(m, _mm_shuffle_ps::<0b01>(m, m));
    _mm_cvtss_f32(m)
}

/// Integer-valued floats to i32 as Rust's saturating `as i8` would give them: NaN → 0,
/// clamped to -128..=127.
#[inline]
#[target_feature(enable = "avx2")]
fn to_i8_range(r: __m256) -> __m256i {
    let r = _mm256_and_ps(r, _mm256_cmp_ps::<_CMP_ORD_Q>(r, r));
    let r = _mm256_min_ps(
        _mm256_max_ps(r, _mm256_set1_ps(-128.0)),
        _mm256_set1_ps(127.0),
    );
    _mm256_cvttps_epi32(r)
}

/// round-half-to-even.
#[inline]
#[target_feature(enable = "avx2")]
fn round_even(v: __m256) -> __m256 {
    _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v)
}

/// Four vectors of 8 i32 in -128..=127 packed to 32 bytes in element order.
#[inline]
#[target_feature(enable = "avx2")]
fn pack_i8(v: [__m256i; 4]) -> __m256i {
    let p01 = _mm256_packs_epi32(v[0], v[1]);
    let p23 = _mm256_packs_epi32(v[2], v[3]);
    let p = _mm256_packs_epi16(p01, p23);
    // packs works within 128-bit lanes: 4-byte groups come out as v0 v1 v2 v3 | v0 v1 v2 v3.
    _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}

#[inline]
#[target_feature(enable = "avx2")]
fn store32(out: &mut [u8], v: __m256i) {
    let out = &mut out[..32];
    // SAFETY: `out` has 32 writable bytes; storeu has no alignment requirement.
    unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), v) }
}

/// Σ of 32 signed bytes.
#[inline]
#[target_feature(enable = "avx2")]
fn sum_i8(q: __m256i) -> i32 {
    let pairs = _mm256_maddubs_epi16(_mm256_set1_epi8(1), q);
    super::hsum_i32(super::widen_pairs(pairs))
}

/// The Q8_0 activation rule for one 32-element block: writes qs, returns (d, Σq).
#[inline]
#[target_feature(enable = "avx2")]
fn quant_8bit(x: &[f32], qs: &mut [u8]) -> (f32, i32) {
    let amax = abs_max(&x[..32]);
    let d = amax / 127.0;
    let id = if amax == 0.0 { 0.0 } else { 127.0 / amax };
    let idv = _mm256_set1_ps(id);
    let q: [__m256i; 4] =
        std::array::from_fn(|k| to_i8_range(round_even(_mm256_mul_ps(load8(x, 8 * k), idv))));
    let packed = pack_i8(q);
    store32(qs, packed);
    (d, sum_i8(packed))
}

#[target_feature(enable = "avx2")]
pub(super) fn quant_q8_0(x: &[f32], out: &mut [u8]) {
    for (x, b) in x.chunks_exact(32).zip(out.chunks_exact_mut(34)) {
        let (d, _) = quant_8bit(x, &mut b[2..34]);
        b[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
    }
}

#[target_feature(enable = "avx2")]
pub(super) fn quant_q8_1(x: &[f32], out: &mut [u8]) {
    for (x, b) in x.chunks_exact(32).zip(out.chunks_exact_mut(36)) {
        let (d, sum) = quant_8bit(x, &mut b[4..36]);
        b[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        b[2..4].copy_from_slice(&f32_to_f16(sum as f32 * d).to_le_bytes());
    }
}

#[target_feature(enable = "avx2")]
pub(super) fn quant_q8_k(x: &[f32], out: &mut [u8]) {
    for (x, b) in x.chunks_exact(256).zip(out.chunks_exact_mut(292)) {
        b.fill(0);
        let amax = abs_max(x);
        if amax == 0.0 {
            continue;
        }
        // The first element of largest magnitude decides the sign of the scale.
        let target = _mm256_set1_ps(amax);
        let mut max = 0.0f32;
        for i in (0..256).step_by(8) {
            let hits = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(abs_ps(load8(x, i)), target));
            if hits != 0 {
                max = x[i + hits.trailing_zeros() as usize];
                break;
            }
        }
        let iscale = -127.0 / max;
        let sv = _mm256_set1_ps(iscale);
        // |iscale · x| <= 127·(1 + 2^-24)^2 < 127.5, so after rounding every q is in
        // -127..=127 (or NaN → 0) and the clamp of `to_i8_range` never bites.
        for c in 0..8 {
            let q: [__m256i; 4] = std::array::from_fn(|k| {
                let v = _mm256_mul_ps(load8(x, 32 * c + 8 * k), sv);
                to_i8_range(round_even(v))
            });
            store32(&mut b[4 + 32 * c..], pack_i8(q));
        }
        b[0..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
        for j in 0..16 {
            let s: i32 = b[4 + 16 * j..20 + 16 * j]
                .iter()
                .map(|&v| v as i8 as i32)
                .sum();
            b[260 + 2 * j..262 + 2 * j].copy_from_slice(&(s as i16).to_le_bytes());
        }
    }
}
