//! NEON dots of the 32-element types with Q8_0 / Q8_1 activations: exact integer block sums,
//! then the reference's f32 expression per block, accumulated in its 4 block lanes.

use crate::simd::BlockSum;
use std::arch::aarch64::*;

use super::{bits_to_bytes16, dot32, f16_at, iq4_table, load16s, nibbles32, Dot16};

/// Q8_0 activation block: d f16 | qs i8[32].
const Q8_0: usize = 34;
/// Q8_1 activation block: d f16 | s f16 | qs i8[32].
const Q8_1: usize = 36;

#[inline]
#[target_feature(enable = "neon")]
fn signed(v: (uint8x16_t, uint8x16_t)) -> (int8x16_t, int8x16_t) {
    (vreinterpretq_s8_u8(v.0), vreinterpretq_s8_u8(v.1))
}

/// The nibbles of a 4-bit block minus `offset`, as signed bytes.
#[inline]
#[target_feature(enable = "neon")]
fn offset(v: (uint8x16_t, uint8x16_t), offset: u8) -> (int8x16_t, int8x16_t) {
    let o = vdupq_n_u8(offset);
    signed((vsubq_u8(v.0, o), vsubq_u8(v.1, o)))
}

/// The 5-bit quants of a Q5 block: nibbles plus bit j of `qh` as bit 4 of element j.
#[inline]
#[target_feature(enable = "neon")]
fn five_bits(qh: &[u8], qs: &[u8]) -> (uint8x16_t, uint8x16_t) {
    let (lo, hi) = nibbles32(qs);
    let b4 = vdupq_n_u8(0x10);
    let h0 = vandq_u8(bits_to_bytes16(qh[0], qh[1]), b4);
    let h1 = vandq_u8(bits_to_bytes16(qh[2], qh[3]), b4);
    (vorrq_u8(lo, h0), vorrq_u8(hi, h1))
}

#[target_feature(enable = "neon")]
pub(super) fn dot_q4_0<D: Dot16>(w: &[u8], a: &[u8]) -> f32 {
    let mut sum = BlockSum::new();
    for (wb, ab) in w.chunks_exact(18).zip(a.chunks_exact(Q8_0)) {
        let s = dot32::<D>(offset(nibbles32(&wb[2..]), 8), &ab[2..]);
        sum.add(s as f32 * f16_at(wb, 0) * f16_at(ab, 0));
    }
    sum.total()
}

#[target_feature(enable = "neon")]
pub(super) fn dot_q4_1<D: Dot16>(w: &[u8], a: &[u8]) -> f32 {
    let mut sum = BlockSum::new();
    for (wb, ab) in w.chunks_exact(20).zip(a.chunks_exact(Q8_1)) {
        let s = dot32::<D>(signed(nibbles32(&wb[4..])), &ab[4..]);
        sum.add((f16_at(wb, 0) * f16_at(ab, 0)) * s as f32 + f16_at(wb, 2) * f16_at(ab, 2));
    }
    sum.total()
}

#[target_feature(enable = "neon")]
pub(super) fn dot_q5_0<D: Dot16>(w: &[u8], a: &[u8]) -> f32 {
    let mut sum = BlockSum::new();
    for (wb, ab) in w.chunks_exact(22).zip(a.chunks_exact(Q8_0)) {
        let s = dot32::<D>(offset(five_bits(&wb[2..6], &wb[6..]), 16), &ab[2..]);
        sum.add((f16_at(wb, 0) * f16_at(ab, 0)) * s as f32);
    }
    sum.total()
}

#[target_feature(enable = "neon")]
pub(super) fn dot_q5_1<D: Dot16>(w: &[u8], a: &[u8]) -> f32 {
    let mut sum = BlockSum::new();
    for (wb, ab) in w.chunks_exact(24).zip(a.chunks_exact(Q8_1)) {
        let s = dot32::<D>(signed(five_bits(&wb[4..8], &wb[8..])), &ab[4..]);
        sum.add((f16_at(wb, 0) * f16_at(ab, 0)) * s as f32 + f16_at(wb, 2) * f16_at(ab, 2));
    }
    sum.total()
}

#[target_feature(enable = "neon")]
pub(super) fn dot_q8_0<D: Dot16>(w: &[u8], a: &[u8]) -> f32 {
    let mut sum = BlockSum::new();
    for (wb, ab) in w.chunks_exact(34).zip(a.chunks_exact(Q8_0)) {
        let s = dot32::<D>((load16s(&wb[2..]), load16s(&wb[18..])), &ab[2..]);
        sum.add(s as f32 * (f16_at(wb, 0) * f16_at(ab, 0)));
    }
    sum.total()
}

#[target_feature(enable = "neon")]
pub(super) fn dot_iq4_nl<D: Dot16>(w: &[u8], a: &[u8]) -> f32 {
    let table = iq4_table();
    let mut sum = BlockSum::new();
    for (wb, ab) in w.chunks_exact(18).zip(a.chunks_exact(Q8_0)) {
        let (lo, hi) = nibbles32(&wb[2..]);
        let v = (vqtbl1q_s8(table, lo), vqtbl1q_s8(table, hi));
        let s = dot32::<D>(v, &ab[2..]);
        sum.add((f16_at(wb, 0) * f16_at(ab, 0)) * s as f32);
    }
    sum.total()
}
