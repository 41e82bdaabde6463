//! The K-quants: 256-element super-blocks of 16- or 32-element sub-blocks with their own
//! integer scales (Q2_K..Q6_K), and Q8_K, the activation format they are dotted with.
//!
//! Each type first unpacks its integer quants and sub-block scales (shared by dequantization
//! and the dot product, so the fixtures that check dequantization check the unpacking too),
//! then applies the f32 scales in gguf-py's order.

use super::{rd_f16, rd_f32, QK_K};

type Ints = [i8; QK_K];

/// Unpacks the 8 six-bit scales and 8 six-bit mins of Q4_K/Q5_K from their 12 bytes:
/// bytes 0..4 hold scales 0..4 (+ top bits of scales 4..8), bytes 4..8 mins 0..4 (+ top bits
/// of mins 4..8), bytes 8..12 the low nibbles of scales 4..8 and (high nibble) mins 4..8.
pub fn unpack_scale_min_k4(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut mn = [0u8; 8];
    for j in 0..4 {
        sc[j] = s[j] & 63;
        mn[j] = s[j + 4] & 63;
        sc[j + 4] = (s[j + 8] & 0x0f) | ((s[j] >> 6) << 4);
        mn[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4);
    }
    (sc, mn)
}

// ---- Q2_K: scales[16] | qs[64] | d | dmin ----

/// Element e = 128k + 32j + l is bits 2j..2j+2 of qs[32k + l].
fn q2_k_ints(b: &[u8]) -> Ints {
    let qs = &b[16..80];
    std::array::from_fn(|e| {
        let (k, j, l) = (e / 128, (e % 128) / 32, e % 32);
        ((qs[32 * k + l] >> (2 * j)) & 3) as i8
    })
}

pub(super) fn dequant_q2_k(b: &[u8], out: &mut [f32]) {
    let (d, dmin) = (rd_f16(b, 80), rd_f16(b, 82));
    let q = q2_k_ints(b);
    for (sub, (o, q)) in out.chunks_exact_mut(16).zip(q.chunks_exact(16)).enumerate() {
        let sc = b[sub];
        let dl = d * (sc & 0x0f) as f32;
        let ml = dmin * (sc >> 4) as f32;
        for (o, &q) in o.iter_mut().zip(q) {
            *o = dl * q as f32 - ml;
        }
    }
}

// ---- Q3_K: hmask[32] | qs[64] | scales[12] | d ----

/// 16 six-bit scales: low nibbles in bytes 0..8 (scale i < 8: low nibble of byte i, else high
/// nibble of byte i-8), top two bits in bytes 8..12 (bits 2*(i/4).. of byte 8 + i%4); minus 32.
fn q3_k_scales(s: &[u8]) -> [i8; 16] {
    std::array::from_fn(|i| {
        let lo = if i < 8 { s[i] & 0x0f } else { s[i - 8] >> 4 };
        let hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
        (lo | (hi << 4)) as i8 - 32
    })
}

/// Two low bits as in Q2_K; element e subtracts 4 when bit e/32 of hmask[e % 32] is clear.
fn q3_k_ints(b: &[u8]) -> Ints {
    let (hmask, qs) = (&b[0..32], &b[32..96]);
    std::array::from_fn(|e| {
        let (k, j, l) = (e / 128, (e % 128) / 32, e % 32);
        let low = ((qs[32 * k + l] >> (2 * j)) & 3) as i8;
        let high_set = (hmask[l] >> (e / 32)) & 1 == 1;
        if high_set {
            low
        } else {
            low - 4
        }
    })
}

pub(super) fn dequant_q3_k(b: &[u8], out: &mut [f32]) {
    let d = rd_f16(b, 108);
    let scales = q3_k_scales(&b[96..108]);
    let q = q3_k_ints(b);
    for ((o, q), &sc) in out
        .chunks_exact_mut(16)
        .zip(q.chunks_exact(16))
        .zip(&scales)
    {
        let dl = d * sc as f32;
        for (o, &q) in o.iter_mut().zip(q) {
            *o = dl * q as f32;
        }
    }
}

// ---- Q4_K: d | dmin | scales[12] | qs[128];  Q5_K: ... | qh[32] | qs[128] ----

/// Sub-block s (32 elements) is the low (s even) or high (s odd) nibbles of qs[32*(s/2)..][..32].
fn q4_k_nibbles(qs: &[u8]) -> Ints {
    std::array::from_fn(|e| {
        let (s, l) = (e / 32, e % 32);
        ((qs[32 * (s / 2) + l] >> (4 * (s % 2))) & 0x0f) as i8
    })
}

fn q4_k_ints(b: &[u8]) -> Ints {
    q4_k_nibbles(&b[16..144])
}

/// Q4_K's nibbles plus a fifth bit: bit (e/32) of qh[e % 32].
fn q5_k_ints(b: &[u8]) -> Ints {
    let qh = &b[16..48];
    let mut q = q4_k_nibbles(&b[48..176]);
    for (e, v) in q.iter_mut().enumerate() {
        *v |= (((qh[e % 32] >> (e / 32)) & 1) << 4) as i8;
    }
    q
}

/// Shared by Q4_K and Q5_K: (d*sc) * q - (dmin*m) per 32-element sub-block.
fn dequant_scale_min(b: &[u8], q: &Ints, out: &mut [f32]) {
    let (d, dmin) = (rd_f16(b, 0), rd_f16(b, 2));
    let (sc, mn) = unpack_scale_min_k4(&b[4..16]);
    for (s, (o, q)) in out.chunks_exact_mut(32).zip(q.chunks_exact(32)).enumerate() {
        let dl = d * sc[s] as f32;
        let ml = dmin * mn[s] as f32;
        for (o, &q) in o.iter_mut().zip(q) {
            *o = dl * q as f32 - ml;
        }
    }
}

pub(super) fn dequant_q4_k(b: &[u8], out: &mut [f32]) {
    dequant_scale_min(b, &q4_k_ints(b), out);
}

pub(super) fn dequant_q5_k(b: &[u8], out: &mut [f32]) {
    dequant_scale_min(b, &q5_k_ints(b), out);
}

// ---- Q6_K: ql[128] | qh[64] | scales i8[16] | d ----

/// Element e = 128h + 64n + t: nibble n of ql[64h + t]; its two high bits are bits 2s..2s+2
/// of qh[32h + l] where e = 128h + 32s + l. Offset by -32.
fn q6_k_ints(b: &[u8]) -> Ints {
    let (ql, qh) = (&b[0..128], &b[128..192]);
    std::array::from_fn(|e| {
        let (h, r) = (e / 128, e % 128);
        let low = (ql[64 * h + r % 64] >> (4 * (r / 64))) & 0x0f;
        let high = (qh[32 * h + r % 32] >> (2 * (r / 32))) & 3;
        (low | (high << 4)) as i8 - 32
    })
}

pub(super) fn dequant_q6_k(b: &[u8], out: &mut [f32]) {
    let d = rd_f16(b, 208);
    let q = q6_k_ints(b);
    for (s, (o, q)) in out.chunks_exact_mut(16).zip(q.chunks_exact(16)).enumerate() {
        let dl = d * (b[192 + s] as i8) as f32;
        for (o, &q) in o.iter_mut().zip(q) {
            *o = dl * q as f32;
        }
    }
}

// ---- Q8_K: d f32 | qs i8[256] | bsums i16[16] ----

fn q8_k_ints(b: &[u8]) -> Ints {
    std::array::from_fn(|e| b[4 + e] as i8)
}

fn q8_k_bsum(b: &[u8], j: usize) -> i32 {
    i16::from_le_bytes([b[260 + 2 * j], b[261 + 2 * j]]) as i32
}

pub(super) fn dequant_q8_k(b: &[u8], out: &mut [f32]) {
    let d = rd_f32(b, 0);
    for (o, q) in out.iter_mut().zip(q8_k_ints(b)) {
        *o = d * q as f32;
    }
}

/// llama.cpp's `quantize_row_q8_K_ref`: iscale = -127 / (the value of largest magnitude, first
/// on ties), q = min(127, round-half-even(iscale * x)), d = 1 / iscale (f32), bsums = sums of
/// 16 consecutive q. An all-zero block stores d = 0 and zero quants and sums.
pub(super) fn quant_q8_k(x: &[f32], b: &mut [u8]) {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    b.fill(0);
    if amax == 0.0 {
        return;
    }
    let iscale = -127.0 / max;
    let mut q = [0i8; QK_K];
    for (q, &v) in q.iter_mut().zip(x) {
        // round_ties_even is ggml's `nearest_int` (the 1.5*2^23 trick) for |v| < 2^22.
        *q = ((iscale * v).round_ties_even() as i32).min(127) as i8;
    }
    b[0..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
    for (o, &q) in b[4..260].iter_mut().zip(&q) {
        *o = q as u8;
    }
    for (j, chunk) in q.chunks_exact(16).enumerate() {
        let s: i32 = chunk.iter().map(|&v| v as i32).sum();
        b[260 + 2 * j..262 + 2 * j].copy_from_slice(&(s as i16).to_le_bytes());
    }
}

// ---- dot products with Q8_K: exact integer sums per block, then the f32 scales ----

/// Σ scale[s] * Σ_{e in sub-block s} q[e] * a[e], sub-blocks of `sub` elements.
fn scaled_isum(q: &Ints, a: &Ints, sub: usize, scale: impl Fn(usize) -> i32) -> i32 {
    q.chunks_exact(sub)
        .zip(a.chunks_exact(sub))
        .enumerate()
        .map(|(s, (q, a))| {
            let dot: i32 = q.iter().zip(a).map(|(&q, &a)| q as i32 * a as i32).sum();
            scale(s) * dot
        })
        .sum()
}

pub(super) fn dot_q2_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
    let isum = scaled_isum(&q2_k_ints(w), &q8_k_ints(a), 16, |s| (w[s] & 0x0f) as i32);
    let summs: i32 = (0..16).map(|s| q8_k_bsum(a, s) * (w[s] >> 4) as i32).sum();
    let ad = rd_f32(a, 0);
    let dall = ad * rd_f16(w, 80);
    let dmin = ad * rd_f16(w, 82);
    dall * isum as f32 - dmin * summs as f32
}

pub(super) fn dot_q3_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
    let scales = q3_k_scales(&w[96..108]);
    let isum = scaled_isum(&q3_k_ints(w), &q8_k_ints(a), 16, |s| scales[s] as i32);
    rd_f16(w, 108) * rd_f32(a, 0) * isum as f32
}

fn dot_scale_min(w: &[u8], q: &Ints, a: &[u8]) -> f32 {
    let (sc, mn) = unpack_scale_min_k4(&w[4..16]);
    let isum = scaled_isum(q, &q8_k_ints(a), 32, |s| sc[s] as i32);
    // A 32-element sub-block covers two 16-element bsums.
    let msum: i32 = (0..16).map(|j| q8_k_bsum(a, j) * mn[j / 2] as i32).sum();
    let ad = rd_f32(a, 0);
    let d = rd_f16(w, 0) * ad;
    let dmin = rd_f16(w, 2) * ad;
    d * isum as f32 - dmin * msum as f32
}

pub(super) fn dot_q4_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
    dot_scale_min(w, &q4_k_ints(w), a)
}

pub(super) fn dot_q5_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
    dot_scale_min(w, &q5_k_ints(w), a)
}

pub(super) fn dot_q6_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
    let isum = scaled_isum(&q6_k_ints(w), &q8_k_ints(a), 16, |s| {
        (w[192 + s] as i8) as i32
    });
    rd_f16(w, 208) * rd_f32(a, 0) * isum as f32
}

/// Q8_K weights (an activation format; kept so every supported type has a dot).
pub(super) fn dot_q8_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
    let isum = scaled_isum(&q8_k_ints(w), &q8_k_ints(a), QK_K, |_| 1);
    rd_f32(w, 0) * rd_f32(a, 0) * isum as f32
}

#[cfg(test)]
mod tests {
    use super::super::{dequantize_row, quantize_row};
    use crate::GgmlType;

    /// Hand-computed Q8_K block: the value of largest magnitude is -127 (x[5], before the
    /// +127 at x[17]), so iscale = -127 / -127 = 1 and d = 1; rounding is half to even:
    /// 1.5 -> 2, 2.5 -> 2, -3.5 -> -4, 0.5 -> 0.
    #[test]
    fn q8_k_hand_computed_block() {
        let mut x = [0.0f32; 256];
        x[..6].copy_from_slice(&[1.5, 2.5, -3.5, 0.5, 0.0, -127.0]);
        x[17] = 127.0;
        let mut b = [0u8; 292];
        quantize_row(GgmlType::Q8K, &x, &mut b).unwrap();
        assert_eq!(f32::from_le_bytes(b[0..4].try_into().unwrap()), 1.0);
        let q: Vec<i8> = b[4..260].iter().map(|&v| v as i8).collect();
        assert_eq!(&q[..6], &[2, 2, -4, 0, 0, -127]);
        assert_eq!(q[17], 127);
        let bsum = |j: usize| i16::from_le_bytes([b[260 + 2 * j], b[261 + 2 * j]]);
        assert_eq!((bsum(0), bsum(1)), (-127, 127));
        assert!((2..16).all(|j| bsum(j) == 0));
        let mut y = [0.0f32; 256];
        dequantize_row(GgmlType::Q8K, &b, &mut y).unwrap();
        assert_eq!(&y[..6], &[2.0, 2.0, -4.0, 0.0, 0.0, -127.0]);
    }

    #[test]
    fn q8_k_zero_block_is_all_zero() {
        let mut b = [0xaau8; 292];
        quantize_row(GgmlType::Q8K, &[0.0; 256], &mut b).unwrap();
        assert!(b.iter().all(|&v| v == 0));
    }

    #[test]
    fn q8_k_quants_stay_in_range_and_bsums_match() {
        let x: Vec<f32> = (0..512)
            .map(|i| ((i * 7919 % 1013) as f32 - 506.0) * 0.013)
            .collect();
        let mut b = vec![0u8; 584];
        quantize_row(GgmlType::Q8K, &x, &mut b).unwrap();
        for blk in b.chunks_exact(292) {
            let q: Vec<i32> = blk[4..260].iter().map(|&v| v as i8 as i32).collect();
            assert!(q.iter().all(|&v| (-127..=127).contains(&v)));
            for j in 0..16 {
                let s: i32 = q[16 * j..16 * j + 16].iter().sum();
                assert_eq!(s, super::q8_k_bsum(blk, j));
            }
        }
    }
}
