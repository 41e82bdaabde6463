//! The non-linear 4-bit types: IQ4_NL (32-element blocks, dotted with Q8_0) and IQ4_XS
//! (256-element super-blocks with 6-bit sub-block scales, dotted with Q8_K).
//! Their nibbles index a fixed table of 16 signed values instead of being used directly.

use super::{rd_f16, rd_f32, QK_K};

/// The 16 values an IQ4 nibble stands for.
pub const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// 32 table values from 16 bytes: element j is the low nibble of byte j, element j+16 the high.
fn values32(qs: &[u8]) -> [i8; 32] {
    std::array::from_fn(|e| {
        let byte = qs[e % 16];
        let nib = if e < 16 { byte & 0x0f } else { byte >> 4 };
        KVALUES_IQ4NL[nib as usize]
    })
}

fn int_dot(w: &[i8], a: &[u8]) -> i32 {
    w.iter()
        .zip(a)
        .map(|(&w, &a)| w as i32 * a as i8 as i32)
        .sum()
}

// ---- IQ4_NL: d f16 | qs[16] ----

pub(super) fn dequant_iq4_nl(b: &[u8], out: &mut [f32]) {
    let d = rd_f16(b, 0);
    for (o, v) in out.iter_mut().zip(values32(&b[2..18])) {
        *o = d * v as f32;
    }
}

pub(super) fn dot_iq4_nl_q8_0(w: &[u8], a: &[u8]) -> f32 {
    let s = int_dot(&values32(&w[2..18]), &a[2..34]);
    (rd_f16(w, 0) * rd_f16(a, 0)) * s as f32
}

// ---- IQ4_XS: d f16 | scales_h u16 | scales_l[4] | qs[128] ----

/// Sub-block s (32 elements) scale: nibble s%2 of scales_l[s/2], plus bits 2s..2s+2 of
/// scales_h as its top two bits; minus 32.
fn iq4_xs_scales(b: &[u8]) -> [i32; 8] {
    let scales_h = u16::from_le_bytes([b[2], b[3]]);
    std::array::from_fn(|s| {
        let lo = (b[4 + s / 2] >> (4 * (s % 2))) & 0x0f;
        let hi = ((scales_h >> (2 * s)) & 3) as u8;
        (lo | (hi << 4)) as i32 - 32
    })
}

pub(super) fn dequant_iq4_xs(b: &[u8], out: &mut [f32]) {
    let d = rd_f16(b, 0);
    let scales = iq4_xs_scales(b);
    for (s, o) in out.chunks_exact_mut(32).enumerate() {
        let dl = d * scales[s] as f32;
        for (o, v) in o.iter_mut().zip(values32(&b[8 + 16 * s..8 + 16 * s + 16])) {
            *o = dl * v as f32;
        }
    }
}

pub(super) fn dot_iq4_xs_q8_k(w: &[u8], a: &[u8]) -> f32 {
    let scales = iq4_xs_scales(w);
    let aq = &a[4..4 + QK_K];
    let isum: i32 = (0..8)
        .map(|s| {
            let v = values32(&w[8 + 16 * s..8 + 16 * s + 16]);
            scales[s] * int_dot(&v, &aq[32 * s..32 * s + 32])
        })
        .sum();
    rd_f16(w, 0) * rd_f32(a, 0) * isum as f32
}
