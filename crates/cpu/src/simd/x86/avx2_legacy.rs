//! AVX2 dots of the 32-element types with Q8_0 / Q8_1 activations. Each block's integer sum
//! is exact; the f32 part repeats the reference expression of `minfer_gguf::quants` (same
//! operands, same association) and blocks add one after another into an f32 sum.

use std::arch::x86_64::*;

use super::{bits_to_bytes, dot_i8_any, f16_at, hsum_i32, iq4_table, load32, nibbles32};
use super::{pairs_small_w, widen_pairs};

/// Q8_0 activation block: d f16 | qs i8[32].
const Q8_0: usize = 34;
/// Q8_1 activation block: d f16 | s f16 | qs i8[32].
const Q8_1: usize = 36;

/// Σ w·a for signed weights in -127..=127.
#[inline]
#[target_feature(enable = "avx2")]
fn isum_small(w: __m256i, a: &[u8]) -> i32 {
    hsum_i32(widen_pairs(pairs_small_w(w, load32(a))))
}

/// Σ q·a for unsigned weights in 0..=31 (pairs at most 2·31·128: no saturation).
#[inline]
#[target_feature(enable = "avx2")]
fn isum_unsigned(q: __m256i, a: &[u8]) -> i32 {
    hsum_i32(widen_pairs(_mm256_maddubs_epi16(q, load32(a))))
}

/// The 5-bit quants of a Q5 block: nibbles plus bit j of `qh` as bit 4 of element j.
#[inline]
#[target_feature(enable = "avx2")]
fn five_bits(qh: &[u8], qs: &[u8]) -> __m256i {
    let qh = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    let high = _mm256_and_si256(bits_to_bytes(qh), _mm256_set1_epi8(0x10));
    _mm256_or_si256(nibbles32(qs), high)
}

#[target_feature(enable = "avx2,f16c")]
pub(super) fn dot_q4_0(w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    for (wb, ab) in w.chunks_exact(18).zip(a.chunks_exact(Q8_0)) {
        let q = _mm256_sub_epi8(nibbles32(&wb[2..]), _mm256_set1_epi8(8));
        let s = isum_small(q, &ab[2..]);
        sum += s as f32 * f16_at(wb, 0) * f16_at(ab, 0);
    }
    sum
}

#[target_feature(enable = "avx2,f16c")]
pub(super) fn dot_q4_1(w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    for (wb, ab) in w.chunks_exact(20).zip(a.chunks_exact(Q8_1)) {
        let s = isum_unsigned(nibbles32(&wb[4..]), &ab[4..]);
        sum += (f16_at(wb, 0) * f16_at(ab, 0)) * s as f32 + f16_at(wb, 2) * f16_at(ab, 2);
    }
    sum
}

#[target_feature(enable = "avx2,f16c")]
pub(super) fn dot_q5_0(w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    for (wb, ab) in w.chunks_exact(22).zip(a.chunks_exact(Q8_0)) {
        let q = _mm256_sub_epi8(five_bits(&wb[2..6], &wb[6..]), _mm256_set1_epi8(16));
        let s = isum_small(q, &ab[2..]);
        sum += (f16_at(wb, 0) * f16_at(ab, 0)) * s as f32;
    }
    sum
}

#[target_feature(enable = "avx2,f16c")]
pub(super) fn dot_q5_1(w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    for (wb, ab) in w.chunks_exact(24).zip(a.chunks_exact(Q8_1)) {
        let s = isum_unsigned(five_bits(&wb[4..8], &wb[8..]), &ab[4..]);
        sum += (f16_at(wb, 0) * f16_at(ab, 0)) * s as f32 + f16_at(wb, 2) * f16_at(ab, 2);
    }
    sum
}

#[target_feature(enable = "avx2,f16c")]
pub(super) fn dot_q8_0(w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    for (wb, ab) in w.chunks_exact(34).zip(a.chunks_exact(Q8_0)) {
        // Weights from a file may hold -128: the widening dot is exact for every byte.
        let s = hsum_i32(dot_i8_any(&wb[2..], &ab[2..]));
        sum += s as f32 * (f16_at(wb, 0) * f16_at(ab, 0));
    }
    sum
}

#[target_feature(enable = "avx2,f16c")]
pub(super) fn dot_iq4_nl(w: &[u8], a: &[u8]) -> f32 {
    let table = iq4_table();
    let mut sum = 0.0f32;
    for (wb, ab) in w.chunks_exact(18).zip(a.chunks_exact(Q8_0)) {
        // Table values lie in -127..=113.
        let v = _mm256_shuffle_epi8(table, nibbles32(&wb[2..]));
        let s = isum_small(v, &ab[2..]);
        sum += (f16_at(wb, 0) * f16_at(ab, 0)) * s as f32;
    }
    sum
}
