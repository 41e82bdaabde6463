//! AVX2 float dots (F32, F16, BF16 weights with F32 activations), reproducing the reference
//! order of `minfer_gguf::quants`: products in f32, element i added in f64 to lane i % 16, the
//! 16 lanes combined by the fixed halving tree. Four 4-wide f64 accumulators are lanes
//! 0..4, 4..8, 8..12, 12..16; a tail shorter than 16 elements is added lane by lane in scalar.

use std::arch::x86_64::*;

use minfer_gguf::quants::FLOAT_DOT_LANES;

use super::{f32_at, load16, load32};

const LANES: usize = FLOAT_DOT_LANES;
const _: () = assert!(LANES == 16, "the AVX2 float dots hold exactly 16 f64 lanes");

/// Runs the lane-parallel f64 accumulation over `n` elements. `chunk(i)` gives the f32
/// products of elements i..i+8 (i a multiple of 8); `one(i)` the product of element i.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn lane_dot(n: usize, chunk: impl Fn(usize) -> __m256, one: impl Fn(usize) -> f32) -> f32 {
    let mut acc = [_mm256_setzero_pd(); 4];
    let full = n / LANES * LANES;
    let mut i = 0;
    while i < full {
        let p0 = chunk(i);
        let p1 = chunk(i + 8);
        let parts = [
            _mm256_castps256_ps128(p0),
            _mm256_extractf128_ps::<1>(p0),
            _mm256_castps256_ps128(p1),
            _mm256_extractf128_ps::<1>(p1),
        ];
        for (a, p) in acc.iter_mut().zip(parts) {
            *a = _mm256_add_pd(*a, _mm256_cvtps_pd(p));
        }
        i += LANES;
    }
    let mut lanes = [0.0f64; LANES];
    for (k, a) in acc.iter().enumerate() {
        let mut four = [0.0f64; 4];
        // SAFETY: `four` has room for 4 f64; storeu has no alignment requirement.
        unsafe { _mm256_storeu_pd(four.as_mut_ptr(), *a) };
        lanes[4 * k..4 * k + 4].copy_from_slice(&four);
    }
    for (lane, e) in (full..n).enumerate() {
        lanes[lane] += one(e) as f64;
    }
    let mut width = LANES / 2;
    while width > 0 {
        for k in 0..width {
            lanes[k] += lanes[k + width];
        }
        width /= 2;
    }
    lanes[0] as f32
}

/// 8 f32 activations starting at element `i`.
#[inline]
#[target_feature(enable = "avx2")]
fn act8(a: &[u8], i: usize) -> __m256 {
    _mm256_castsi256_ps(load32(&a[4 * i..]))
}

#[target_feature(enable = "avx2,f16c")]
pub(super) fn dot_f32(w: &[u8], a: &[u8]) -> f32 {
    lane_dot(
        w.len() / 4,
        |i| _mm256_mul_ps(_mm256_castsi256_ps(load32(&w[4 * i..])), act8(a, i)),
        |i| f32_at(w, 4 * i) * f32_at(a, 4 * i),
    )
}

#[target_feature(enable = "avx2,f16c")]
pub(super) fn dot_f16(w: &[u8], a: &[u8]) -> f32 {
    lane_dot(
        w.len() / 2,
        |i| _mm256_mul_ps(_mm256_cvtph_ps(load16(&w[2 * i..])), act8(a, i)),
        |i| {
            let h = u16::from_le_bytes([w[2 * i], w[2 * i + 1]]);
            minfer_gguf::quants::f16_to_f32(h) * f32_at(a, 4 * i)
        },
    )
}

#[target_feature(enable = "avx2,f16c")]
pub(super) fn dot_bf16(w: &[u8], a: &[u8]) -> f32 {
    lane_dot(
        w.len() / 2,
        |i| {
            // bf16 is the top half of an f32.
            let wide = _mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(load16(&w[2 * i..])));
            _mm256_mul_ps(_mm256_castsi256_ps(wide), act8(a, i))
        },
        |i| {
            let h = u16::from_le_bytes([w[2 * i], w[2 * i + 1]]);
            minfer_gguf::quants::bf16_to_f32(h) * f32_at(a, 4 * i)
        },
    )
}
