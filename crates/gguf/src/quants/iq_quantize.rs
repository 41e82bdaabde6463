//! Quantization of f32 into IQ4_NL and IQ4_XS, byte-identical to llama.cpp's
//! `quantize_iq4_nl` / `quantize_iq4_xs` without an importance matrix (see
//! `kquants_quantize` for why the arithmetic order matters).

use super::kquants_quantize::{f16_round, nearest_int, signed_max, GROUP_MAX_EPS};
use super::{KVALUES_IQ4NL, QK_K};

/// The nearest of the 16 IQ4 values to `x` (ggml's `best_index_int8`: bisection, ties to
/// the upper neighbour).
fn best_index_iq4(x: f32) -> u8 {
    let val = &KVALUES_IQ4NL;
    if x <= val[0] as f32 {
        return 0;
    }
    if x >= val[15] as f32 {
        return 15;
    }
    let (mut ml, mut mu) = (0usize, 15usize);
    while mu - ml > 1 {
        let mav = (ml + mu) / 2;
        if x < val[mav] as f32 {
            mu = mav;
        } else {
            ml = mav;
        }
    }
    if x - (val[mu - 1] as f32) < val[mu] as f32 - x {
        (mu - 1) as u8
    } else {
        mu as u8
    }
}

/// One 32-element IQ4 group (`quantize_row_iq4_nl_impl`'s inner loop, 7 tries each side)
/// with weights `w` (x^2 without an importance matrix): its scale, with the indices written
/// to `l`.
fn iq4_group(xb: &[f32], w: &[f32], l: &mut [u8]) -> f32 {
    const NTRY: i32 = 7;
    let v0 = KVALUES_IQ4NL[0] as f32;
    let (max, amax) = signed_max(xb);
    if amax < GROUP_MAX_EPS {
        return 0.0;
    }
    let mut d = -max / v0;
    let mut id = 1.0 / d;
    let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
    for (j, &x) in xb.iter().enumerate() {
        let li = best_index_iq4(id * x);
        l[j] = li;
        let q = KVALUES_IQ4NL[li as usize] as f32;
        sumqx += w[j] * q * x;
        sumq2 += w[j] * q * q;
    }
    d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
    let mut best = d * sumqx;
    for itry in -NTRY..=NTRY {
        id = (itry + KVALUES_IQ4NL[0] as i32) as f32 / max;
        sumqx = 0.0;
        sumq2 = 0.0;
        for (j, &x) in xb.iter().enumerate() {
            let q = KVALUES_IQ4NL[best_index_iq4(id * x) as usize] as f32;
            sumqx += w[j] * q * x;
            sumq2 += w[j] * q * q;
        }
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    d
}

fn pack_iq4(l: &[u8], q4: &mut [u8]) {
    for i in 0..l.len() / 32 {
        for j in 0..16 {
            q4[16 * i + j] = l[32 * i + j] | (l[32 * i + 16 + j] << 4);
        }
    }
}

/// The weights of one IQ4 group: qw * sqrt(sigma2 + x^2) with an importance matrix, where
/// sigma2 is 2/n of the super-block's sum of squares, else x^2.
fn iq4_weights(x_super: &[f32], xb: &[f32], qw: Option<&[f32]>) -> [f32; 32] {
    match qw {
        None => std::array::from_fn(|j| xb[j] * xb[j]),
        Some(qw) => {
            let mut sigma2 = 0.0f32;
            for &v in x_super {
                sigma2 += v * v;
            }
            sigma2 *= 2.0 / x_super.len() as f32;
            std::array::from_fn(|j| qw[j] * (sigma2 + xb[j] * xb[j]).sqrt())
        }
    }
}

pub(super) fn quant_iq4_nl(x: &[f32], b: &mut [u8]) {
    quant_iq4_nl_with(x, None, b);
}

/// IQ4_NL with optional importance weights for the block's 32 columns.
pub(super) fn quant_iq4_nl_with(x: &[f32], qw: Option<&[f32]>, b: &mut [u8]) {
    let mut l = [0u8; 32];
    let d = iq4_group(x, &iq4_weights(x, x, qw), &mut l);
    b[0..2].copy_from_slice(&f16_round(d).to_le_bytes());
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    for (o, &v) in l.iter_mut().zip(x) {
        *o = best_index_iq4(id * v);
    }
    pack_iq4(&l, &mut b[2..18]);
}

pub(super) fn quant_iq4_xs(x: &[f32], b: &mut [u8]) {
    quant_iq4_xs_with(x, None, b);
}

/// IQ4_XS with optional importance weights for the block's 256 columns.
pub(super) fn quant_iq4_xs_with(x: &[f32], qw: Option<&[f32]>, b: &mut [u8]) {
    let mut l = [0u8; QK_K];
    let mut scales = [0.0f32; 8];
    let (mut max_scale, mut amax_scale) = (0.0f32, 0.0f32);
    for ib in 0..8 {
        let xb = &x[32 * ib..32 * ib + 32];
        let w = iq4_weights(x, xb, qw.map(|q| &q[32 * ib..32 * ib + 32]));
        let d = iq4_group(xb, &w, &mut l[32 * ib..32 * ib + 32]);
        scales[ib] = d;
        if d.abs() > amax_scale {
            amax_scale = d.abs();
            max_scale = d;
        }
    }
    let d = -max_scale / 32.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let (mut scales_h, mut scales_l) = (0u16, [0u8; 4]);
    for ib in 0..8 {
        let q = nearest_int(id * scales[ib]).clamp(-32, 31);
        let dl = d * q as f32;
        let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
        for j in 0..32 {
            l[32 * ib + j] = best_index_iq4(idl * x[32 * ib + j]);
        }
        let q = (q + 32) as u8;
        if ib % 2 == 0 {
            scales_l[ib / 2] = q & 0xf;
        } else {
            scales_l[ib / 2] |= (q & 0xf) << 4;
        }
        scales_h |= ((q >> 4) as u16) << (2 * ib);
    }
    b[0..2].copy_from_slice(&f16_round(d).to_le_bytes());
    b[2..4].copy_from_slice(&scales_h.to_le_bytes());
    b[4..8].copy_from_slice(&scales_l);
    pack_iq4(&l, &mut b[8..136]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_index_picks_the_nearest_value_ties_up() {
        assert_eq!(best_index_iq4(-200.0), 0);
        assert_eq!(best_index_iq4(200.0), 15);
        assert_eq!(best_index_iq4(1.0), 8);
        // Midway between 1 and 13 is 7: a tie goes to the upper neighbour (13).
        assert_eq!(best_index_iq4(7.0), 9);
        assert_eq!(best_index_iq4(6.9), 8);
    }
}
