//! Quantization of f32 with an importance matrix: one weight per column, the mean squared
//! activation llama-imatrix measured for it. Byte-identical to ggml-quants.c's
//! `quantize_row_*_impl` paths that `llama-quantize --imatrix` takes (`quantize_q4_0` ..
//! `quantize_q6_K`, `quantize_iq4_nl`/`_xs` given `quant_weights`); see `kquants_quantize` for
//! why the arithmetic order is spelled out.
//!
//! Every type weights an element by qw * sqrt(sigma2 + x^2), sigma2 being a mean square of
//! the block or row (the exact scope and factor differ per type, as in ggml), except Q6_K,
//! which takes qw as is. The K-quants also fit their per-block scales by weighted least
//! squares (`make_qp_quants`, or `make_qx_quants` for Q3_K) where the plain quantizers round
//! against the largest.

use super::iq_quantize::{quant_iq4_nl_with, quant_iq4_xs_with};
use super::kquants_quantize::{
    f16_round, finish_q3_k, finish_q6_k, make_qx_quants, nearest_int, pack_2bit, requant_scale_min,
    write_q4_k, write_q5_k, GROUP_MAX_EPS,
};
use super::{f16_to_f32, QK_K};

/// qw * sqrt(sigma2 + x^2) for each element.
fn weights<const N: usize>(x: &[f32], qw: &[f32], sigma2: f32) -> [f32; N] {
    std::array::from_fn(|i| qw[i] * (sigma2 + x[i] * x[i]).sqrt())
}

fn sum_sq(x: &[f32]) -> f32 {
    let mut s = 0.0f32;
    for &v in x {
        s += v * v;
    }
    s
}

fn sum(x: &[f32]) -> f32 {
    let mut s = 0.0f32;
    for &v in x {
        s += v;
    }
    s
}

/// Asymmetric quants l in 0..=nmax with a scale and a min, weighted squared error
/// (`make_qkx3_quants` with weights, no MAD): the fit of nmax/(max - min), then `nstep + 1`
/// scales `rmin + rdelta * is` around it solved by weighted least squares, the lowest error
/// kept. Returns (scale, -min).
fn make_qkx3_quants(
    nmax: i32,
    x: &[f32],
    w: &[f32],
    l_out: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
) -> (f32, f32) {
    let n = x.len();
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = w[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max <= min {
        l_out.fill(0);
        return (0.0, -min);
    }
    let nmaxf = nmax as f32;
    let mut iscale = nmaxf / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best = 0.0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax) as u8;
        l_out[i] = l;
        let diff = scale * l as f32 + min - x[i];
        best += w[i] * (diff * diff);
    }
    if nstep < 1 {
        return (scale, -min);
    }
    let mut laux = [0u8; 32];
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmaxf) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = l as u8;
            let lf = l as f32;
            sum_l += w[i] * lf;
            sum_l2 += w[i] * lf * lf;
            sum_xl += w[i] * lf * x[i];
        }
        let big_d = sum_w * sum_l2 - sum_l * sum_l;
        if big_d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / big_d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / big_d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur = 0.0f32;
            for i in 0..n {
                let diff = this_scale * laux[i] as f32 + this_min - x[i];
                cur += w[i] * (diff * diff);
            }
            if cur < best {
                l_out[..n].copy_from_slice(&laux[..n]);
                best = cur;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// Unsigned quants of non-negative values (the block scales of Q2_K/Q4_K/Q5_K) in
/// 0..=nmax with one scale (`make_qp_quants`): the best of nine scales near nmax/max by
/// weighted squared error, then up to five passes moving single quants while the weighted
/// fit improves. `l` holds what C's `uint8_t` holds (a negative quant wraps).
fn make_qp_quants(nmax: i32, x: &[f32], l: &mut [u8], qw: &[f32]) -> f32 {
    let n = x.len();
    let mut max = 0.0f32;
    for &v in x {
        max = if max > v { max } else { v };
    }
    if max < GROUP_MAX_EPS {
        l[..n].fill(0);
        return 0.0;
    }
    let nmaxf = nmax as f32;
    let mut iscale = nmaxf / max;
    for i in 0..n {
        l[i] = nearest_int(iscale * x[i]) as u8;
    }
    let scale = 1.0 / iscale;
    let mut best_mse = 0.0f32;
    for i in 0..n {
        let diff = x[i] - scale * l[i] as f32;
        best_mse += qw[i] * diff * diff;
    }
    for is in -4i32..=4 {
        if is == 0 {
            continue;
        }
        let iscale_is = (0.1f32 * is as f32 + nmaxf) / max;
        let scale_is = 1.0 / iscale_is;
        let mut mse = 0.0f32;
        for i in 0..n {
            let q = nearest_int(iscale_is * x[i]).min(nmax);
            let diff = x[i] - scale_is * q as f32;
            mse += qw[i] * diff * diff;
        }
        if mse < best_mse {
            best_mse = mse;
            iscale = iscale_is;
        }
    }
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for i in 0..n {
        let q = nearest_int(iscale * x[i]).min(nmax);
        l[i] = q as u8;
        let qf = q as f32;
        sumlx += qw[i] * x[i] * qf;
        suml2 += qw[i] * qf * qf;
    }
    for _ in 0..5 {
        let mut changed = 0;
        for i in 0..n {
            let w = qw[i];
            let li = l[i] as f32;
            let mut slx = sumlx - w * x[i] * li;
            let mut sl2 = suml2 - w * li * li;
            if slx > 0.0 && sl2 > 0.0 {
                let new_l = nearest_int(x[i] * sl2 / slx).min(nmax);
                if new_l != l[i] as i32 {
                    let nf = new_l as f32;
                    slx += w * x[i] * nf;
                    sl2 += w * nf * nf;
                    if slx * slx * suml2 > sumlx * sumlx * sl2 {
                        l[i] = new_l as u8;
                        sumlx = slx;
                        suml2 = sl2;
                        changed += 1;
                    }
                }
            }
        }
        if changed == 0 {
            break;
        }
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

fn q2_k(x: &[f32], qw: &[f32], b: &mut [u8]) {
    let sigma2 = sum_sq(x) / QK_K as f32;
    let mut l = [0u8; QK_K];
    let (mut scales, mut mins, mut sw) = ([0.0f32; 16], [0.0f32; 16], [0.0f32; 16]);
    for j in 0..16 {
        let r = 16 * j..16 * j + 16;
        let w: [f32; 16] = weights(&x[r.clone()], &qw[r.clone()], sigma2);
        sw[j] = sum(&w);
        (scales[j], mins[j]) = make_qkx3_quants(3, &x[r.clone()], &w, &mut l[r], -0.9, 0.05, 36);
    }
    let (mut ls, mut lm) = ([0u8; 16], [0u8; 16]);
    let d = f16_round(make_qp_quants(15, &scales, &mut ls, &sw));
    let dmin = f16_round(make_qp_quants(15, &mins, &mut lm, &sw));
    let (df, dminf) = (f16_to_f32(d), f16_to_f32(dmin));
    let sc: [u8; 16] = std::array::from_fn(|j| ls[j] | (lm[j] << 4));
    for j in 0..16 {
        let dj = df * (sc[j] & 0xf) as f32;
        if dj == 0.0 {
            continue;
        }
        let m = dminf * (sc[j] >> 4) as f32;
        for i in 0..16 {
            l[16 * j + i] = nearest_int((x[16 * j + i] + m) / dj).clamp(0, 3) as u8;
        }
    }
    b[0..16].copy_from_slice(&sc);
    pack_2bit(&l, &mut b[16..80]);
    b[80..82].copy_from_slice(&d.to_le_bytes());
    b[82..84].copy_from_slice(&dmin.to_le_bytes());
}

fn q3_k(x: &[f32], qw: &[f32], b: &mut [u8]) {
    let sigma2 = 2.0 * sum_sq(x) / QK_K as f32;
    let mut l = [0i8; QK_K];
    let (mut scales, mut sw) = ([0.0f32; 16], [0.0f32; 16]);
    for j in 0..16 {
        let r = 16 * j..16 * j + 16;
        let w: [f32; 16] = weights(&x[r.clone()], &qw[r.clone()], sigma2);
        sw[j] = sum(&w);
        scales[j] = make_qx_quants(4, &x[r.clone()], Some(&w), &mut l[r]);
    }
    let mut ls = [0i8; 16];
    let d_block = make_qx_quants(32, &scales, Some(&sw), &mut ls);
    let mut sb = [0u8; 12];
    for j in 0..16 {
        let q = ls[j] as i32;
        if j < 8 {
            sb[j] = (q & 0xf) as u8;
        } else {
            sb[j - 8] |= ((q & 0xf) << 4) as u8;
        }
        sb[j % 4 + 8] |= ((q >> 4) << (2 * (j / 4))) as u8;
    }
    finish_q3_k(x, &sb, f16_round(d_block), &mut l, b);
}

/// The sub-block fits of Q4_K/Q5_K with weights, then the 6-bit scales and mins fitted by
/// `make_qp_quants`. Q5_K clamps them to 63; Q4_K stores them as they come, as ggml does.
fn scale_min_k(
    x: &[f32],
    qw: &[f32],
    nmax: i32,
    clamp63: bool,
    l: &mut [u8; QK_K],
) -> (u16, u16, [u8; 12]) {
    let sigma2 = 2.0 * sum_sq(x) / QK_K as f32;
    let (mut scales, mut mins, mut sw) = ([0.0f32; 8], [0.0f32; 8], [0.0f32; 8]);
    for j in 0..8 {
        let r = 32 * j..32 * j + 32;
        let w: [f32; 32] = weights(&x[r.clone()], &qw[r.clone()], sigma2);
        sw[j] = sum(&w);
        (scales[j], mins[j]) = make_qkx3_quants(nmax, &x[r.clone()], &w, &mut l[r], -0.9, 0.05, 36);
    }
    let (mut ls, mut lm) = ([0u8; 8], [0u8; 8]);
    let d_block = make_qp_quants(63, &scales, &mut ls, &sw);
    let m_block = make_qp_quants(63, &mins, &mut lm, &sw);
    let mut s = [0u8; 12];
    for j in 0..8 {
        let (ls, lm) = if clamp63 {
            (ls[j].min(63), lm[j].min(63))
        } else {
            (ls[j], lm[j])
        };
        if j < 4 {
            s[j] = ls;
            s[j + 4] = lm;
        } else {
            s[j + 4] = (ls & 0xf) | ((lm & 0xf) << 4);
            s[j - 4] |= (ls >> 4) << 6;
            s[j] |= (lm >> 4) << 6;
        }
    }
    let (d, dmin) = (f16_round(d_block), f16_round(m_block));
    requant_scale_min(x, &s, d, dmin, nmax, l);
    (d, dmin, s)
}

fn q4_k(x: &[f32], qw: &[f32], b: &mut [u8]) {
    let mut l = [0u8; QK_K];
    let (d, dmin, s) = scale_min_k(x, qw, 15, false, &mut l);
    write_q4_k(d, dmin, &s, &l, b);
}

fn q5_k(x: &[f32], qw: &[f32], b: &mut [u8]) {
    let mut l = [0u8; QK_K];
    let (d, dmin, s) = scale_min_k(x, qw, 31, true, &mut l);
    write_q5_k(d, dmin, &s, &l, b);
}

fn q6_k(x: &[f32], qw: &[f32], b: &mut [u8]) {
    let mut l = [0i8; QK_K];
    let mut scales = [0.0f32; 16];
    let (mut max_scale, mut max_abs) = (0.0f32, 0.0f32);
    for (ib, sc) in scales.iter_mut().enumerate() {
        let r = 16 * ib..16 * ib + 16;
        let s = make_qx_quants(32, &x[r.clone()], Some(&qw[r.clone()]), &mut l[r]);
        *sc = s;
        if s.abs() > max_abs {
            max_abs = s.abs();
            max_scale = s;
        }
    }
    finish_q6_k(x, &scales, max_scale, max_abs, &mut l, b);
}

/// The 5th bits of 32 quants as Q5_0/Q5_1 store them: bit j of the u32 is element j's.
fn high_bits(l: impl Fn(usize) -> u8) -> [u8; 4] {
    let mut qh = 0u32;
    for j in 0..32 {
        qh |= (((l(j) & 0x10) >> 4) as u32) << j;
    }
    qh.to_le_bytes()
}

/// The legacy 32-element types with weights; sigma2 is the mean square of the whole row.
fn legacy_row(ty: crate::GgmlType, x: &[f32], qw: &[f32], dst: &mut [u8]) {
    use crate::GgmlType as T;
    let sigma2 = sum_sq(x) / x.len() as f32;
    let ts = ty.type_size() as usize;
    for ((xb, qb), b) in x
        .chunks_exact(32)
        .zip(qw.chunks_exact(32))
        .zip(dst.chunks_exact_mut(ts))
    {
        let w: [f32; 32] = weights(xb, qb, sigma2);
        match ty {
            T::Q4_0 | T::Q5_0 => {
                let nmax = if ty == T::Q4_0 { 8 } else { 16 };
                let mut l = [0i8; 32];
                let d = make_qx_quants(nmax, xb, Some(&w), &mut l);
                b[0..2].copy_from_slice(&f16_round(d).to_le_bytes());
                let lu = |j: usize| l[j] as u8;
                let qs = if ty == T::Q4_0 {
                    &mut b[2..18]
                } else {
                    b[2..6].copy_from_slice(&high_bits(lu));
                    &mut b[6..22]
                };
                for (j, q) in qs.iter_mut().enumerate() {
                    *q = (lu(j) & 0xf) | ((lu(j + 16) & 0xf) << 4);
                }
            }
            _ => {
                let nmax = if ty == T::Q4_1 { 15 } else { 31 };
                let mut l = [0u8; 32];
                let (d, min) = make_qkx3_quants(nmax, xb, &w, &mut l, -0.9, 0.05, 36);
                b[0..2].copy_from_slice(&f16_round(d).to_le_bytes());
                b[2..4].copy_from_slice(&f16_round(-min).to_le_bytes());
                let qs = if ty == T::Q4_1 {
                    &mut b[4..20]
                } else {
                    b[4..8].copy_from_slice(&high_bits(|j| l[j]));
                    &mut b[8..24]
                };
                for (j, q) in qs.iter_mut().enumerate() {
                    *q = (l[j] & 0xf) | ((l[j + 16] & 0xf) << 4);
                }
            }
        }
    }
}

/// Quantizes one row with importance weights `qw` (one per element of the row; the caller
/// checked the lengths). Returns false for types ggml quantizes without looking at the
/// weights (the caller uses the plain quantizer).
pub(super) fn quantize_row_weighted(
    ty: crate::GgmlType,
    x: &[f32],
    qw: &[f32],
    dst: &mut [u8],
) -> bool {
    use crate::GgmlType as T;
    let per_block: fn(&[f32], &[f32], &mut [u8]) = match ty {
        T::Q4_0 | T::Q4_1 | T::Q5_0 | T::Q5_1 => {
            legacy_row(ty, x, qw, dst);
            return true;
        }
        T::Q2K => q2_k,
        T::Q3K => q3_k,
        T::Q4K => q4_k,
        T::Q5K => q5_k,
        T::Q6K => q6_k,
        T::Iq4Nl => |x, qw, b| quant_iq4_nl_with(x, Some(qw), b),
        T::Iq4Xs => |x, qw, b| quant_iq4_xs_with(x, Some(qw), b),
        _ => return false,
    };
    let bs = ty.block_size() as usize;
    let ts = ty.type_size() as usize;
    for ((xb, qb), b) in x
        .chunks_exact(bs)
        .zip(qw.chunks_exact(bs))
        .zip(dst.chunks_exact_mut(ts))
    {
        per_block(xb, qb, b);
    }
    true
}
