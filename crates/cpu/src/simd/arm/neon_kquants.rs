//! NEON dots of the 256-element types with Q8_K activations: exact integer sums per
//! super-block (16-element sub-blocks map onto one 16-byte vector each), then the reference's
//! f32 expression, super-block values accumulated in the reference's 4 block lanes.

use crate::simd::BlockSum;
use std::arch::aarch64::*;

use minfer_gguf::quants::unpack_scale_min_k4;

use super::{f16_at, f32_at, iq4_table, load16, load16s, Dot16};

/// Q8_K activation block: d f32 | qs i8[256] | bsums i16[16].
const Q8K: usize = 292;

fn bsum(ab: &[u8], j: usize) -> i32 {
    i16::from_le_bytes([ab[260 + 2 * j], ab[261 + 2 * j]]) as i32
}

/// Bits `shift..shift + 2` of every byte.
#[inline]
#[target_feature(enable = "neon")]
fn two_bits(q: uint8x16_t, shift: i8) -> uint8x16_t {
    vandq_u8(vshlq_u8(q, vdupq_n_s8(-shift)), vdupq_n_u8(3))
}

/// Exact Σ q·a of one 16-element sub-block (q as unsigned or signed bytes in -128..=127).
#[inline]
#[target_feature(enable = "neon")]
fn sub16<D: Dot16>(q: uint8x16_t, a: &[u8]) -> int32x4_t {
    D::dot16(vreinterpretq_s8_u8(q), load16s(a))
}

#[target_feature(enable = "neon")]
pub(super) fn dot_q2_k<D: Dot16>(w: &[u8], a: &[u8]) -> f32 {
    let mut sum = BlockSum::new();
    for (wb, ab) in w.chunks_exact(84).zip(a.chunks_exact(Q8K)) {
        let sc = &wb[0..16];
        let aq = &ab[4..260];
        let mut acc = vdupq_n_s32(0);
        for k in 0..2 {
            let q = [load16(&wb[16 + 32 * k..]), load16(&wb[32 + 32 * k..])];
            for j in 0..4 {
                for (half, &qv) in q.iter().enumerate() {
                    let s = 8 * k + 2 * j + half;
                    let d = sub16::<D>(two_bits(qv, 2 * j as i8), &aq[16 * s..]);
                    acc = vmlaq_n_s32(acc, d, (sc[s] & 0x0f) as i32);
                }
            }
        }
        let isum = vaddvq_s32(acc);
        let summs: i32 = (0..16).map(|s| bsum(ab, s) * (sc[s] >> 4) as i32).sum();
        let ad = f32_at(ab, 0);
        let dall = ad * f16_at(wb, 80);
        let dmin = ad * f16_at(wb, 82);
        sum.add(dall * isum as f32 - dmin * summs as f32);
    }
    sum.total()
}

/// The 16 six-bit Q3_K scales minus 32 (low nibbles in bytes 0..8, top bits in bytes 8..12).
fn q3_k_scales(s: &[u8]) -> [i32; 16] {
    std::array::from_fn(|i| {
        let lo = if i < 8 { s[i] & 0x0f } else { s[i - 8] >> 4 };
        let hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
        (lo | (hi << 4)) as i32 - 32
    })
}

#[target_feature(enable = "neon")]
pub(super) fn dot_q3_k<D: Dot16>(w: &[u8], a: &[u8]) -> f32 {
    let mut sum = BlockSum::new();
    for (wb, ab) in w.chunks_exact(110).zip(a.chunks_exact(Q8K)) {
        let scales = q3_k_scales(&wb[96..108]);
        let hmask = [load16(&wb[0..]), load16(&wb[16..])];
        let aq = &ab[4..260];
        let mut acc = vdupq_n_s32(0);
        for k in 0..2 {
            let q = [load16(&wb[32 + 32 * k..]), load16(&wb[48 + 32 * k..])];
            for j in 0..4 {
                let bit = vdupq_n_u8(1 << (4 * k + j));
                for half in 0..2 {
                    let low = two_bits(q[half], 2 * j as i8);
                    // Elements whose hmask bit is clear are 4 lower: q in -4..=3.
                    let minus4 = vbicq_u8(vdupq_n_u8(4), vtstq_u8(hmask[half], bit));
                    let s = 8 * k + 2 * j + half;
                    let d = sub16::<D>(vsubq_u8(low, minus4), &aq[16 * s..]);
                    acc = vmlaq_n_s32(acc, d, scales[s]);
                }
            }
        }
        let isum = vaddvq_s32(acc);
        sum.add(f16_at(wb, 108) * f32_at(ab, 0) * isum as f32);
    }
    sum.total()
}

/// Shared by Q4_K and Q5_K: `quants(j, half)` gives the unsigned quants of elements
/// 64j + 16·half .. (sub-block 2j, halves 0-1) and 64j + 32 + 16·(half - 2) .. (sub-block 2j+1,
/// halves 2-3).
#[inline]
#[target_feature(enable = "neon")]
fn dot_scale_min<D: Dot16>(
    w: &[u8],
    a: &[u8],
    block: usize,
    quants: impl Fn(&[u8], usize) -> [uint8x16_t; 4],
) -> f32 {
    let mut sum = BlockSum::new();
    for (wb, ab) in w.chunks_exact(block).zip(a.chunks_exact(Q8K)) {
        let (sc, mn) = unpack_scale_min_k4(&wb[4..16]);
        let aq = &ab[4..260];
        let mut acc = vdupq_n_s32(0);
        for j in 0..4 {
            let q = quants(wb, j);
            let d_lo = vaddq_s32(
                sub16::<D>(q[0], &aq[64 * j..]),
                sub16::<D>(q[1], &aq[64 * j + 16..]),
            );
            let d_hi = vaddq_s32(
                sub16::<D>(q[2], &aq[64 * j + 32..]),
                sub16::<D>(q[3], &aq[64 * j + 48..]),
            );
            acc = vmlaq_n_s32(acc, d_lo, sc[2 * j] as i32);
            acc = vmlaq_n_s32(acc, d_hi, sc[2 * j + 1] as i32);
        }
        let isum = vaddvq_s32(acc);
        // A 32-element sub-block covers two 16-element bsums.
        let msum: i32 = (0..16).map(|j| bsum(ab, j) * mn[j / 2] as i32).sum();
        let ad = f32_at(ab, 0);
        let d = f16_at(wb, 0) * ad;
        let dmin = f16_at(wb, 2) * ad;
        sum.add(d * isum as f32 - dmin * msum as f32);
    }
    sum.total()
}

#[target_feature(enable = "neon")]
pub(super) fn dot_q4_k<D: Dot16>(w: &[u8], a: &[u8]) -> f32 {
    dot_scale_min::<D>(w, a, 144, |wb, j| {
        let q0 = load16(&wb[16 + 32 * j..]);
        let q1 = load16(&wb[32 + 32 * j..]);
        let m = vdupq_n_u8(0x0f);
        [
            vandq_u8(q0, m),
            vandq_u8(q1, m),
            vshrq_n_u8::<4>(q0),
            vshrq_n_u8::<4>(q1),
        ]
    })
}

#[target_feature(enable = "neon")]
pub(super) fn dot_q5_k<D: Dot16>(w: &[u8], a: &[u8]) -> f32 {
    dot_scale_min::<D>(w, a, 176, |wb, j| {
        let qh = [load16(&wb[16..]), load16(&wb[32..])];
        let q0 = load16(&wb[48 + 32 * j..]);
        let q1 = load16(&wb[64 + 32 * j..]);
        let m = vdupq_n_u8(0x0f);
        let b4 = vdupq_n_u8(0x10);
        let high = |v: uint8x16_t, bit: usize| vandq_u8(vtstq_u8(v, vdupq_n_u8(1 << bit)), b4);
        [
            vorrq_u8(vandq_u8(q0, m), high(qh[0], 2 * j)),
            vorrq_u8(vandq_u8(q1, m), high(qh[1], 2 * j)),
            vorrq_u8(vshrq_n_u8::<4>(q0), high(qh[0], 2 * j + 1)),
            vorrq_u8(vshrq_n_u8::<4>(q1), high(qh[1], 2 * j + 1)),
        ]
    })
}

#[target_feature(enable = "neon")]
pub(super) fn dot_q6_k<D: Dot16>(w: &[u8], a: &[u8]) -> f32 {
    let mut sum = BlockSum::new();
    for (wb, ab) in w.chunks_exact(210).zip(a.chunks_exact(Q8K)) {
        let aq = &ab[4..260];
        let m = vdupq_n_u8(0x0f);
        let mut acc = vdupq_n_s32(0);
        for h in 0..2 {
            let ql: [uint8x16_t; 4] = std::array::from_fn(|c| load16(&wb[64 * h + 16 * c..]));
            let qh = [load16(&wb[128 + 32 * h..]), load16(&wb[144 + 32 * h..])];
            for i in 0..4 {
                for half in 0..2 {
                    // Low nibbles of ql[64h + 32(i % 2) + l] for i < 2, high ones for i >= 2.
                    let src = ql[2 * (i % 2) + half];
                    let low = if i < 2 {
                        vandq_u8(src, m)
                    } else {
                        vshrq_n_u8::<4>(src)
                    };
                    let high = vshlq_n_u8::<4>(two_bits(qh[half], 2 * i as i8));
                    // q - 32 lies in -32..=31.
                    let q = vsubq_u8(vorrq_u8(low, high), vdupq_n_u8(32));
                    let s = 8 * h + 2 * i + half;
                    let d = sub16::<D>(q, &aq[16 * s..]);
                    acc = vmlaq_n_s32(acc, d, wb[192 + s] as i8 as i32);
                }
            }
        }
        let isum = vaddvq_s32(acc);
        sum.add(f16_at(wb, 208) * f32_at(ab, 0) * isum as f32);
    }
    sum.total()
}

#[target_feature(enable = "neon")]
pub(super) fn dot_q8_k<D: Dot16>(w: &[u8], a: &[u8]) -> f32 {
    let mut sum = BlockSum::new();
    for (wb, ab) in w.chunks_exact(Q8K).zip(a.chunks_exact(Q8K)) {
        let mut acc = vdupq_n_s32(0);
        for c in 0..16 {
            let d = D::dot16(load16s(&wb[4 + 16 * c..]), load16s(&ab[4 + 16 * c..]));
            acc = vaddq_s32(acc, d);
        }
        let isum = vaddvq_s32(acc);
        sum.add(f32_at(wb, 0) * f32_at(ab, 0) * isum as f32);
    }
    sum.total()
}

/// The 8 IQ4_XS sub-block scales minus 32: low nibbles in scales_l, top two bits in scales_h.
fn iq4_xs_scales(b: &[u8]) -> [i32; 8] {
    let scales_h = u16::from_le_bytes([b[2], b[3]]);
    std::array::from_fn(|s| {
        let lo = (b[4 + s / 2] >> (4 * (s % 2))) & 0x0f;
        let hi = ((scales_h >> (2 * s)) & 3) as u8;
        (lo | (hi << 4)) as i32 - 32
    })
}

#[target_feature(enable = "neon")]
pub(super) fn dot_iq4_xs<D: Dot16>(w: &[u8], a: &[u8]) -> f32 {
    let table = iq4_table();
    let mut sum = BlockSum::new();
    for (wb, ab) in w.chunks_exact(136).zip(a.chunks_exact(Q8K)) {
        let scales = iq4_xs_scales(wb);
        let aq = &ab[4..260];
        let mut acc = vdupq_n_s32(0);
        for (s, &scale) in scales.iter().enumerate() {
            let x = load16(&wb[8 + 16 * s..]);
            let lo = vqtbl1q_s8(table, vandq_u8(x, vdupq_n_u8(0x0f)));
            let hi = vqtbl1q_s8(table, vshrq_n_u8::<4>(x));
            let d = vaddq_s32(
                D::dot16(lo, load16s(&aq[32 * s..])),
                D::dot16(hi, load16s(&aq[32 * s + 16..])),
            );
            acc = vmlaq_n_s32(acc, d, scale);
        }
        let isum = vaddvq_s32(acc);
        sum.add(f16_at(wb, 0) * f32_at(ab, 0) * isum as f32);
    }
    sum.total()
}
