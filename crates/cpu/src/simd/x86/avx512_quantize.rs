//! AVX-512 activation quantization to Q8_0, Q8_1 and Q8_K, byte-identical to
//! `minfer_gguf::quants::quantize_act_row`, 16 floats per vector; the rules are those of the AVX2
//! quantizers (`avx2_quantize.rs`):
//!
//! - Q8_0/Q8_1 (llama.cpp's x86 activation rule): d = max|x| / 127, q = round-half-even(x ·
//!   (127 / max|x|)), saturating `as i8` (NaN → 0).
//! - Q8_K: iscale = -127 / (the first value of largest magnitude), q = min(127,
//!   round-half-even(iscale · x)), d = 1 / iscale; a 16-element bsum is one vector's sum.
//!
//! `max|x|` uses `max_ps(|x|, acc)`, which returns `acc` when |x| is NaN, skipping NaN like the
//! reference; a maximum is the same in any order. Scale fields are written with the
//! reference's scalar f16 conversion.

use std::arch::x86_64::*;

use minfer_gguf::quants::f32_to_f16;

/// 16 floats from `x[i..i + 16]` (bounds-checked).
#[inline]
#[target_feature(enable = "avx512f")]
fn load16f(x: &[f32], i: usize) -> __m512 {
    let x = &x[i..i + 16];
    // SAFETY: `x` has 16 readable f32; loadu has no alignment requirement.
    unsafe { _mm512_loadu_ps(x.as_ptr()) }
}

#[inline]
#[target_feature(enable = "avx512f")]
fn abs_ps(v: __m512) -> __m512 {
    _mm512_castsi512_ps(_mm512_and_si512(
        _mm512_castps_si512(v),
        _mm512_set1_epi32(0x7fff_ffff),
    ))
}

/// max |x| over `x` (a multiple of 16 elements), NaN skipped.
#[inline]
#[target_feature(enable = "avx512f")]
fn abs_max(x: &[f32]) -> f32 {
    let mut acc = _mm512_setzero_ps();
    for i in (0..x.len()).step_by(16) {
        acc = _mm512_max_ps(abs_ps(load16f(x, i)), acc);
    }
    // No lane of `acc` is NaN, so the order of the reduction does not matter.
    _mm512_reduce_max_ps(acc)
}

/// Integer-valued floats to i32 as Rust's saturating `as i8` would give them: NaN → 0,
/// clamped to -128..=127.
#[inline]
#[target_feature(enable = "avx512f")]
fn to_i8_range(r: __m512) -> __m512i {
    let ordered = _mm512_cmp_ps_mask::<_CMP_ORD_Q>(r, r);
    let r = _mm512_maskz_mov_ps(ordered, r);
    let r = _mm512_min_ps(
        _mm512_max_ps(r, _mm512_set1_ps(-128.0)),
        _mm512_set1_ps(127.0),
    );
    _mm512_cvttps_epi32(r)
}

/// round-half-to-even.
#[inline]
#[target_feature(enable = "avx512f")]
fn round_even(v: __m512) -> __m512 {
    _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v)
}

/// 16 i32 in -128..=127 narrowed to bytes, stored at the start of `out`.
#[inline]
#[target_feature(enable = "avx512f")]
fn store_i8(out: &mut [u8], q: __m512i) {
    let out = &mut out[..16];
    let bytes = _mm512_cvtepi32_epi8(q);
    // SAFETY: `out` has 16 writable bytes; storeu has no alignment requirement.
    unsafe { _mm_storeu_si128(out.as_mut_ptr().cast(), bytes) }
}

/// The Q8_0 activation rule for one 32-element block: writes qs, returns (d, Σq).
#[inline]
#[target_feature(enable = "avx512f")]
fn quant_8bit(x: &[f32], qs: &mut [u8]) -> (f32, i32) {
    let amax = abs_max(&x[..32]);
    let d = amax / 127.0;
    let id = if amax == 0.0 { 0.0 } else { 127.0 / amax };
    let idv = _mm512_set1_ps(id);
    let q0 = to_i8_range(round_even(_mm512_mul_ps(load16f(x, 0), idv)));
    let q1 = to_i8_range(round_even(_mm512_mul_ps(load16f(x, 16), idv)));
    store_i8(qs, q0);
    store_i8(&mut qs[16..], q1);
    (d, _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1)))
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
pub(super) fn quant_q8_0(x: &[f32], out: &mut [u8]) {
    for (x, b) in x.chunks_exact(32).zip(out.chunks_exact_mut(34)) {
        let (d, _) = quant_8bit(x, &mut b[2..34]);
        b[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
pub(super) fn quant_q8_1(x: &[f32], out: &mut [u8]) {
    for (x, b) in x.chunks_exact(32).zip(out.chunks_exact_mut(36)) {
        let (d, sum) = quant_8bit(x, &mut b[4..36]);
        b[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        b[2..4].copy_from_slice(&f32_to_f16(sum as f32 * d).to_le_bytes());
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
pub(super) fn quant_q8_k(x: &[f32], out: &mut [u8]) {
    for (x, b) in x.chunks_exact(256).zip(out.chunks_exact_mut(292)) {
        let amax = abs_max(x);
        if amax == 0.0 {
            b.fill(0);
            continue;
        }
        // The first element of largest magnitude decides the sign of the scale.
        let target = _mm512_set1_ps(amax);
        let mut max = 0.0f32;
        for i in (0..256).step_by(16) {
            let hits = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(abs_ps(load16f(x, i)), target);
            if hits != 0 {
                max = x[i + hits.trailing_zeros() as usize];
                break;
            }
        }
        let iscale = -127.0 / max;
        let sv = _mm512_set1_ps(iscale);
        b[0..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
        // |iscale · x| <= 127·(1 + 2^-24)^2 < 127.5, so after rounding every q is in
        // -127..=127 (or NaN → 0) and the clamp of `to_i8_range` never bites.
        for j in 0..16 {
            let v = _mm512_mul_ps(load16f(x, 16 * j), sv);
            let r = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v);
            let q = to_i8_range(r);
            store_i8(&mut b[4 + 16 * j..], q);
            let s = _mm512_reduce_add_epi32(q) as i16;
            b[260 + 2 * j..262 + 2 * j].copy_from_slice(&s.to_le_bytes());
        }
    }
}
