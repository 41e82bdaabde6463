//! The 32-element "legacy" types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1.
//!
//! In every 4/5-bit type byte j of `qs` holds element j in its low nibble and element j+16 in
//! its high nibble; Q5 types keep each element's fifth bit in the u32 `qh` (bit j = element j).

use super::{rd_f16, wr_f16};

const QK: usize = 32;
const HALF: usize = QK / 2;

#[inline]
fn rd_u32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// The 4-bit values (0..=15) of a block, in element order.
#[inline]
fn nibbles(qs: &[u8]) -> [u8; QK] {
    let mut q = [0u8; QK];
    for j in 0..HALF {
        q[j] = qs[j] & 0x0f;
        q[j + HALF] = qs[j] >> 4;
    }
    q
}

/// The 5-bit values (0..=31) of a block, in element order.
#[inline]
fn five_bits(qh: u32, qs: &[u8]) -> [u8; QK] {
    let mut q = nibbles(qs);
    for (j, v) in q.iter_mut().enumerate() {
        *v |= (((qh >> j) & 1) as u8) << 4;
    }
    q
}

#[inline]
fn int8s(qs: &[u8]) -> impl Iterator<Item = i8> + '_ {
    qs.iter().map(|&v| v as i8)
}

// ---- dequantization (gguf-py order: d * q, or d * q + m) ----

pub(super) fn dequant_q4_0(b: &[u8], out: &mut [f32]) {
    let d = rd_f16(b, 0);
    for (o, q) in out.iter_mut().zip(nibbles(&b[2..18])) {
        *o = d * (q as i32 - 8) as f32;
    }
}

pub(super) fn dequant_q4_1(b: &[u8], out: &mut [f32]) {
    let (d, m) = (rd_f16(b, 0), rd_f16(b, 2));
    for (o, q) in out.iter_mut().zip(nibbles(&b[4..20])) {
        *o = d * q as f32 + m;
    }
}

pub(super) fn dequant_q5_0(b: &[u8], out: &mut [f32]) {
    let d = rd_f16(b, 0);
    for (o, q) in out.iter_mut().zip(five_bits(rd_u32(b, 2), &b[6..22])) {
        *o = d * (q as i32 - 16) as f32;
    }
}

pub(super) fn dequant_q5_1(b: &[u8], out: &mut [f32]) {
    let (d, m) = (rd_f16(b, 0), rd_f16(b, 2));
    for (o, q) in out.iter_mut().zip(five_bits(rd_u32(b, 4), &b[8..24])) {
        *o = d * q as f32 + m;
    }
}

pub(super) fn dequant_q8_0(b: &[u8], out: &mut [f32]) {
    let d = rd_f16(b, 0);
    for (o, q) in out.iter_mut().zip(int8s(&b[2..34])) {
        *o = q as f32 * d;
    }
}

/// Q8_1 is an activation format; its dequantization is d * q (s is a derived sum).
pub(super) fn dequant_q8_1(b: &[u8], out: &mut [f32]) {
    let d = rd_f16(b, 0);
    for (o, q) in out.iter_mut().zip(int8s(&b[4..36])) {
        *o = d * q as f32;
    }
}

// ---- quantization (gguf-py's numpy arithmetic, element for element) ----

/// The value of largest magnitude, first one on ties (numpy `argmax(abs(x))`, which also keeps
/// the sign of a leading -0.0 in an all-zero block).
fn signed_absmax(x: &[f32]) -> f32 {
    let mut best = x[0];
    for &v in &x[1..] {
        if v.abs() > best.abs() {
            best = v;
        }
    }
    best
}

fn min_max(x: &[f32]) -> (f32, f32) {
    x.iter()
        .fold((x[0], x[0]), |(lo, hi), &v| (lo.min(v), hi.max(v)))
}

#[inline]
fn recip_or_zero(d: f32) -> f32 {
    if d == 0.0 {
        0.0
    } else {
        1.0 / d
    }
}

/// `np.trunc(v).astype(np.uint8).clip(0, max)` for the in-range values the quantizers produce.
#[inline]
fn trunc_clip(v: f32, max: u8) -> u8 {
    (v.trunc() as u8).min(max)
}

fn pack_nibbles(q: &[u8; QK], qs: &mut [u8]) {
    for j in 0..HALF {
        qs[j] = (q[j] & 0x0f) | (q[j + HALF] << 4);
    }
}

fn pack_high_bits(q: &[u8; QK]) -> [u8; 4] {
    let mut qh = 0u32;
    for (j, &v) in q.iter().enumerate() {
        qh |= ((v as u32 >> 4) & 1) << j;
    }
    qh.to_le_bytes()
}

pub(super) fn quant_q4_0(x: &[f32], b: &mut [u8]) {
    let d = signed_absmax(x) / -8.0;
    let id = recip_or_zero(d);
    let q: [u8; QK] = std::array::from_fn(|j| trunc_clip(x[j] * id + 8.5, 15));
    wr_f16(b, 0, d);
    pack_nibbles(&q, &mut b[2..18]);
}

pub(super) fn quant_q4_1(x: &[f32], b: &mut [u8]) {
    let (min, max) = min_max(x);
    let d = (max - min) / 15.0;
    let id = recip_or_zero(d);
    let q: [u8; QK] = std::array::from_fn(|j| trunc_clip((x[j] - min) * id + 0.5, 15));
    wr_f16(b, 0, d);
    wr_f16(b, 2, min);
    pack_nibbles(&q, &mut b[4..20]);
}

pub(super) fn quant_q5_0(x: &[f32], b: &mut [u8]) {
    let d = signed_absmax(x) / -16.0;
    let id = recip_or_zero(d);
    let q: [u8; QK] = std::array::from_fn(|j| trunc_clip(x[j] * id + 16.5, 31));
    wr_f16(b, 0, d);
    b[2..6].copy_from_slice(&pack_high_bits(&q));
    pack_nibbles(&q, &mut b[6..22]);
}

pub(super) fn quant_q5_1(x: &[f32], b: &mut [u8]) {
    let (min, max) = min_max(x);
    let d = (max - min) / 31.0;
    let id = recip_or_zero(d);
    let q: [u8; QK] = std::array::from_fn(|j| trunc_clip((x[j] - min) * id + 0.5, 31));
    wr_f16(b, 0, d);
    wr_f16(b, 2, min);
    b[4..8].copy_from_slice(&pack_high_bits(&q));
    pack_nibbles(&q, &mut b[8..24]);
}

/// d = max|x| / 127 and q = round-half-away(x / d): shared by Q8_0 and Q8_1.
fn quant_8bit(x: &[f32], qs: &mut [u8]) -> (f32, i32) {
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = recip_or_zero(d);
    let mut sum = 0i32;
    for (o, &v) in qs.iter_mut().zip(x) {
        let q = (v * id).round() as i8;
        sum += q as i32;
        *o = q as u8;
    }
    (d, sum)
}

/// The activation rule of llama.cpp's x86 SIMD builds (`quantize_row_q8_0`/`_q8_1` in
/// `arch/x86/quants.c`): d = max|x| / 127 as above, but q = round-half-even(x · (127 / max|x|)),
/// the multiplier computed from the max directly rather than as 1 / d.
fn quant_8bit_act(x: &[f32], qs: &mut [u8]) -> (f32, i32) {
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if amax == 0.0 { 0.0 } else { 127.0 / amax };
    let mut sum = 0i32;
    for (o, &v) in qs.iter_mut().zip(x) {
        let q = (v * id).round_ties_even() as i8;
        sum += q as i32;
        *o = q as u8;
    }
    (d, sum)
}

/// Q8_0 activations, llama.cpp x86 rule ([`quant_8bit_act`]).
pub(super) fn quant_q8_0_act(x: &[f32], b: &mut [u8]) {
    let (d, _) = quant_8bit_act(x, &mut b[2..34]);
    wr_f16(b, 0, d);
}

/// Q8_1 activations, llama.cpp x86 rule; s = f16(sum(q) * d) as in the weight rule.
pub(super) fn quant_q8_1_act(x: &[f32], b: &mut [u8]) {
    let (d, sum) = quant_8bit_act(x, &mut b[4..36]);
    wr_f16(b, 0, d);
    wr_f16(b, 2, sum as f32 * d);
}

pub(super) fn quant_q8_0(x: &[f32], b: &mut [u8]) {
    let (d, _) = quant_8bit(x, &mut b[2..34]);
    wr_f16(b, 0, d);
}

/// llama.cpp's `quantize_row_q8_1_ref`: Q8_0's rule plus s = f16(sum(q) * d) with the f32 d.
pub(super) fn quant_q8_1(x: &[f32], b: &mut [u8]) {
    let (d, sum) = quant_8bit(x, &mut b[4..36]);
    wr_f16(b, 0, d);
    wr_f16(b, 2, sum as f32 * d);
}

// ---- dot products: integer sum per block, then scaled (llama.cpp's reference order) ----

fn isum<A: Copy + Into<i32>>(w: impl Iterator<Item = A>, a: &[u8]) -> i32 {
    w.zip(int8s(a)).map(|(w, a)| w.into() * a as i32).sum()
}

pub(super) fn dot_q4_0_q8_0(w: &[u8], a: &[u8]) -> f32 {
    let s = isum(nibbles(&w[2..18]).iter().map(|&q| q as i32 - 8), &a[2..34]);
    s as f32 * rd_f16(w, 0) * rd_f16(a, 0)
}

pub(super) fn dot_q4_1_q8_1(w: &[u8], a: &[u8]) -> f32 {
    let s = isum(nibbles(&w[4..20]).into_iter(), &a[4..36]);
    (rd_f16(w, 0) * rd_f16(a, 0)) * s as f32 + rd_f16(w, 2) * rd_f16(a, 2)
}

pub(super) fn dot_q5_0_q8_0(w: &[u8], a: &[u8]) -> f32 {
    let q = five_bits(rd_u32(w, 2), &w[6..22]);
    let s = isum(q.iter().map(|&q| q as i32 - 16), &a[2..34]);
    (rd_f16(w, 0) * rd_f16(a, 0)) * s as f32
}

pub(super) fn dot_q5_1_q8_1(w: &[u8], a: &[u8]) -> f32 {
    let s = isum(five_bits(rd_u32(w, 4), &w[8..24]).into_iter(), &a[4..36]);
    (rd_f16(w, 0) * rd_f16(a, 0)) * s as f32 + rd_f16(w, 2) * rd_f16(a, 2)
}

pub(super) fn dot_q8_0_q8_0(w: &[u8], a: &[u8]) -> f32 {
    let s = isum(int8s(&w[2..34]), &a[2..34]);
    s as f32 * (rd_f16(w, 0) * rd_f16(a, 0))
}

/// Q8_1 weights (not a llama.cpp weight type, kept for completeness): the plain 8-bit dot;
/// the stored sums are not needed.
pub(super) fn dot_q8_1_q8_1(w: &[u8], a: &[u8]) -> f32 {
    let s = isum(int8s(&w[4..36]), &a[4..36]);
    s as f32 * (rd_f16(w, 0) * rd_f16(a, 0))
}

#[cfg(test)]
mod tests {
    use super::super::{dequantize_row, quantize_row, vec_dot};
    use crate::GgmlType;

    /// Activation rule (llama.cpp x86): amax = 127 gives a multiplier of exactly 1, so
    /// q = round-half-even(x): 0.5 -> 0, 1.5 -> 2, 2.5 -> 2, -2.5 -> -2, where the weight
    /// rule rounds half away (1, 2, 3, -3). Control: `.round()` in `quant_8bit_act` fails it.
    #[test]
    fn q8_act_rounds_half_to_even() {
        let mut x = [0.0f32; 32];
        x[..6].copy_from_slice(&[127.0, 0.5, 1.5, 2.5, -2.5, 0.49]);
        let mut act = [0u8; 34];
        let mut w = [0u8; 34];
        crate::quants::quantize_act_row(GgmlType::Q8_0, &x, &mut act).unwrap();
        crate::quants::quantize_row(GgmlType::Q8_0, &x, &mut w).unwrap();
        assert_eq!(&act[2..8], &[127u8, 0, 2, 2, 0xfe, 0]);
        assert_eq!(&w[2..8], &[127u8, 1, 2, 3, 0xfd, 0]);
        assert_eq!(&act[..2], &w[..2]);
        let mut a1 = [0u8; 36];
        crate::quants::quantize_act_row(GgmlType::Q8_1, &x, &mut a1).unwrap();
        // s = sum(q) * d = 127 + 0 + 2 + 2 - 2 = 129.
        assert_eq!(
            crate::quants::f16_to_f32(u16::from_le_bytes([a1[2], a1[3]])),
            129.0
        );
    }

    /// Q8_1 has no gguf-py oracle: a block worked out by hand. amax = 127 gives d = 1, so
    /// q = round-half-away(x); sum(q) = 127 + 1 - 1 + 2 - 3 + 0 = 126, s = 126 * 1.
    #[test]
    fn q8_1_hand_computed_block() {
        let mut x = [0.0f32; 32];
        x[..6].copy_from_slice(&[127.0, 0.5, -0.5, 1.5, -2.5, 0.49]);
        let mut b = [0u8; 36];
        quantize_row(GgmlType::Q8_1, &x, &mut b).unwrap();
        assert_eq!(&b[0..2], &0x3c00u16.to_le_bytes()); // d = 1.0
        assert_eq!(
            u16::from_le_bytes([b[2], b[3]]),
            super::super::f32_to_f16(126.0)
        );
        assert_eq!(&b[4..10], &[127u8, 1, 0xff, 2, 0xfd, 0]);
        assert!(b[10..].iter().all(|&v| v == 0));
        let mut y = [0.0f32; 32];
        dequantize_row(GgmlType::Q8_1, &b, &mut y).unwrap();
        assert_eq!(&y[..6], &[127.0, 1.0, -1.0, 2.0, -3.0, 0.0]);
    }

    /// Q8_1 shares Q8_0's rule (d, qs); only the s field is extra.
    #[test]
    fn q8_1_agrees_with_q8_0_and_its_sum() {
        let x: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 23) as f32 - 11.3) * 0.17)
            .collect();
        let (mut a, mut b) = ([0u8; 68], [0u8; 72]);
        quantize_row(GgmlType::Q8_0, &x, &mut a).unwrap();
        quantize_row(GgmlType::Q8_1, &x, &mut b).unwrap();
        for blk in 0..2 {
            let (qa, qb) = (&a[blk * 34..][..34], &b[blk * 36..][..36]);
            assert_eq!(&qa[..2], &qb[..2]);
            assert_eq!(&qa[2..], &qb[4..]);
            let d = super::rd_f16(qb, 0);
            let sum: i32 = qb[4..].iter().map(|&v| v as i8 as i32).sum();
            // s was rounded from sum * (f32 d), so it is within an f16 half-ulp of sum * d.
            let s = super::rd_f16(qb, 2);
            assert!((s - sum as f32 * d).abs() <= (sum as f32 * d).abs() * 2f32.powi(-11));
        }
    }

    #[test]
    fn q4_0_dot_of_a_hand_built_block() {
        // d = 0.5, all nibbles 9 -> every weight 0.5; activation d = 2, q = 1 -> every a = 2.
        let mut w = [0x99u8; 18];
        w[..2].copy_from_slice(&0x3800u16.to_le_bytes());
        let mut a = [1u8; 34];
        a[..2].copy_from_slice(&0x4000u16.to_le_bytes());
        assert_eq!(vec_dot(GgmlType::Q4_0, 32, &w, &a).unwrap(), 32.0);
    }
}
