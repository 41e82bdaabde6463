//! NEON float dots (F32, BF16 weights with F32 activations) in the reference order: products
//! in f32, element i added in f64 to lane i % 16, the 16 lanes combined by the fixed halving
//! tree. Eight 2-wide f64 accumulators hold lanes (0,1), (2,3), ..., (14,15).

use std::arch::aarch64::*;

use minfer_gguf::quants::FLOAT_DOT_LANES;

use super::{f32_at, load16};

const LANES: usize = FLOAT_DOT_LANES;
const _: () = assert!(LANES == 16, "the NEON float dots hold exactly 16 f64 lanes");

/// `chunk(i)` gives the f32 products of elements i..i+4; `one(i)` the product of element i.
#[inline]
#[target_feature(enable = "neon")]
fn lane_dot(n: usize, chunk: impl Fn(usize) -> float32x4_t, one: impl Fn(usize) -> f32) -> f32 {
    let mut acc = [vdupq_n_f64(0.0); 8];
    let full = n / LANES * LANES;
    let mut i = 0;
    while i < full {
        for c in 0..4 {
            let p = chunk(i + 4 * c);
            acc[2 * c] = vaddq_f64(acc[2 * c], vcvt_f64_f32(vget_low_f32(p)));
            acc[2 * c + 1] = vaddq_f64(acc[2 * c + 1], vcvt_high_f64_f32(p));
        }
        i += LANES;
    }
    let mut lanes = [0.0f64; LANES];
    for (k, a) in acc.iter().enumerate() {
        lanes[2 * k] = vgetq_lane_f64::<0>(*a);
        lanes[2 * k + 1] = vgetq_lane_f64::<1>(*a);
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

/// 4 f32 from bytes `4i..4i + 16`.
#[inline]
#[target_feature(enable = "neon")]
fn f32x4(b: &[u8], i: usize) -> float32x4_t {
    vreinterpretq_f32_u8(load16(&b[4 * i..]))
}

#[target_feature(enable = "neon")]
pub(super) fn dot_f32(w: &[u8], a: &[u8]) -> f32 {
    lane_dot(
        w.len() / 4,
        |i| vmulq_f32(f32x4(w, i), f32x4(a, i)),
        |i| f32_at(w, 4 * i) * f32_at(a, 4 * i),
    )
}

#[target_feature(enable = "neon")]
pub(super) fn dot_bf16(w: &[u8], a: &[u8]) -> f32 {
    lane_dot(
        w.len() / 2,
        |i| {
            let b = &w[2 * i..2 * i + 8];
            // SAFETY: `b` has 8 readable bytes (4 u16); vld1 has no alignment requirement.
            let h = unsafe { vld1_u16(b.as_ptr().cast()) };
            // bf16 is the top half of an f32.
            let wide = vshll_n_u16::<16>(h);
            vmulq_f32(vreinterpretq_f32_u32(wide), f32x4(a, i))
        },
        |i| {
            let h = u16::from_le_bytes([w[2 * i], w[2 * i + 1]]);
            minfer_gguf::quants::bf16_to_f32(h) * f32_at(a, 4 * i)
        },
    )
}
