//! Quantization of f32 into the K-quants (Q2_K..Q6_K) (the IQ4 types are in `iq_quantize`),
//! byte-identical to llama.cpp's quantizers without an importance matrix
//! (`quantize_row_q*_K_ref`, `quantize_iq4_nl`/`quantize_iq4_xs` with no weights in
//! `ggml-quants.c`), which is what `llama-quantize` writes when it is given no `--imatrix`.
//!
//! Why the arithmetic looks fussy: byte identity means the same f32 operations in the same
//! order. ggml-quants.c is built without `-march=native` (it is in ggml-base), so on x86-64
//! nothing is fused into an FMA; every `a * b + c` below rounds twice, as it does there, and
//! every integer that meets a float is converted at the same point as in C's usual
//! arithmetic conversions (`w * x * l` is `(w * x) * (l as f32)`).

use super::{f16_to_f32, f32_to_f16, QK_K};

/// ggml's all-zero threshold for a group's largest magnitude.
pub(super) const GROUP_MAX_EPS: f32 = 1e-15;

/// Round to nearest, ties to even, by the 1.5 * 2^23 trick ggml uses (`nearest_int`): valid
/// for |v| <= 2^22 - 1, which every caller's values are (they are scaled quants).
#[inline]
pub(super) fn nearest_int(v: f32) -> i32 {
    let bits = (v + 12_582_912.0f32).to_bits();
    (bits & 0x007f_ffff) as i32 - 0x0040_0000
}

#[inline]
pub(super) fn f16_round(v: f32) -> u16 {
    f32_to_f16(v)
}

/// The value of largest magnitude (first on ties) and that magnitude.
pub(super) fn signed_max(x: &[f32]) -> (f32, f32) {
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        let a = v.abs();
        if a > amax {
            amax = a;
            max = v;
        }
    }
    (max, amax)
}

/// Symmetric quants l in -nmax..nmax-1 (stored + nmax) with a least-squares scale, weighted
/// by `qw` or else x^2 (`make_qx_quants` with rmse_type 1), trying 18 scales near nmax/max.
pub(super) fn make_qx_quants(nmax: i32, x: &[f32], qw: Option<&[f32]>, l_out: &mut [i8]) -> f32 {
    let (max, amax) = signed_max(x);
    if amax < GROUP_MAX_EPS {
        l_out.fill(0);
        return 0.0;
    }
    let nmaxf = nmax as f32;
    let clamp = |l: i32| l.clamp(-nmax, nmax - 1);
    let weight = |i: usize| qw.map_or(x[i] * x[i], |q| q[i]);
    let mut iscale = -nmaxf / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (i, (o, &v)) in l_out.iter_mut().zip(x).enumerate() {
        let l = clamp(nearest_int(iscale * v));
        *o = (l + nmax) as i8;
        let w = weight(i);
        let lf = l as f32;
        sumlx += w * v * lf;
        suml2 += w * lf * lf;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9i32..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmaxf + 0.1f32 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for (i, &v) in x.iter().enumerate() {
            let lf = clamp(nearest_int(iscale * v)) as f32;
            let w = weight(i);
            sumlx += w * v * lf;
            suml2 += w * lf * lf;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (o, &v) in l_out.iter_mut().zip(x) {
                *o = (nmax + clamp(nearest_int(iscale * v))) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// Q3_K's sub-block quants (`make_q3_quants` with rmse): start from nmax/max, then up to five
/// passes that move single quants while the weighted fit improves. L is stored + nmax.
fn make_q3_quants(nmax: i32, x: &[f32], l_out: &mut [i8]) -> f32 {
    let (max, amax) = signed_max(x);
    if amax < GROUP_MAX_EPS {
        l_out.fill(0);
        return 0.0;
    }
    let clamp = |l: i32| l.clamp(-nmax, nmax - 1);
    let iscale = -(nmax as f32) / max;
    let n = x.len();
    let mut l = [0i32; 16];
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for i in 0..n {
        l[i] = clamp(nearest_int(iscale * x[i]));
        let w = x[i] * x[i];
        sumlx += w * x[i] * l[i] as f32;
        suml2 += w * l[i] as f32 * l[i] as f32;
    }
    for _ in 0..5 {
        let mut changed = 0;
        for i in 0..n {
            let w = x[i] * x[i];
            let mut slx = sumlx - w * x[i] * l[i] as f32;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * l[i] as f32 * l[i] as f32;
                let new_l = clamp(nearest_int(x[i] * sl2 / slx));
                if new_l != l[i] {
                    slx += w * x[i] * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        l[i] = new_l;
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
    for i in 0..n {
        l_out[i] = (l[i] + nmax) as i8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// Asymmetric quants l in 0..=nmax with a scale and a min (`make_qkx2_quants`): the fit of
/// nmax/(max - min), then `nstep + 1` scales around it solved by weighted least squares; the
/// lowest weighted error (squared, or absolute with `use_mad`) wins. Returns (scale, -min).
#[allow(clippy::too_many_arguments)]
fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l_out: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    let n = x.len();
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l_out.fill(0);
        return (0.0, -min);
    }
    let nmaxf = nmax as f32;
    let err = |d: f32| if use_mad { d.abs() } else { d * d };
    let mut iscale = nmaxf / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l_out[i] = l as u8;
        let diff = scale * l as f32 + min - x[i];
        best_error += weights[i] * err(diff);
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
            let w = weights[i];
            let lf = l as f32;
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let big_d = sum_w * sum_l2 - sum_l * sum_l;
        if big_d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / big_d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / big_d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..n {
                let diff = this_scale * laux[i] as f32 + this_min - x[i];
                cur_error += weights[i] * err(diff);
            }
            if cur_error < best_error {
                l_out[..n].copy_from_slice(&laux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// Packs 2-bit quants as Q2_K/Q3_K lay them out: byte 32k + l holds elements
/// 128k + l, +32, +64, +96 in bits 0, 2, 4, 6.
pub(super) fn pack_2bit(l: &[u8; QK_K], qs: &mut [u8]) {
    for k in 0..2 {
        for i in 0..32 {
            let e = 128 * k + i;
            qs[32 * k + i] = l[e] | (l[e + 32] << 2) | (l[e + 64] << 4) | (l[e + 96] << 6);
        }
    }
}

pub(super) fn quant_q2_k(x: &[f32], b: &mut [u8]) {
    const Q4SCALE: f32 = 15.0;
    let mut l = [0u8; QK_K];
    let mut scales = [0.0f32; 16];
    let mut mins = [0.0f32; 16];
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    for j in 0..16 {
        let xs = &x[16 * j..16 * j + 16];
        let weights: [f32; 16] = std::array::from_fn(|i| xs[i].abs());
        let (s, m) = make_qkx2_quants(
            3,
            xs,
            &weights,
            &mut l[16 * j..16 * j + 16],
            -0.5,
            0.1,
            15,
            true,
        );
        scales[j] = s;
        mins[j] = m;
        if s > max_scale {
            max_scale = s;
        }
        if m > max_min {
            max_min = m;
        }
    }
    let mut sc = [0u8; 16];
    let d = if max_scale > 0.0 {
        let iscale = Q4SCALE / max_scale;
        for j in 0..16 {
            sc[j] = nearest_int(iscale * scales[j]) as u8;
        }
        f16_round(max_scale / Q4SCALE)
    } else {
        f16_round(0.0)
    };
    let dmin = if max_min > 0.0 {
        let iscale = Q4SCALE / max_min;
        for j in 0..16 {
            sc[j] |= (nearest_int(iscale * mins[j]) << 4) as u8;
        }
        f16_round(max_min / Q4SCALE)
    } else {
        f16_round(0.0)
    };
    let (df, dminf) = (f16_to_f32(d), f16_to_f32(dmin));
    for j in 0..16 {
        let dj = df * (sc[j] & 0xf) as f32;
        if dj == 0.0 {
            continue;
        }
        let dm = dminf * (sc[j] >> 4) as f32;
        for i in 0..16 {
            let q = nearest_int((x[16 * j + i] + dm) / dj).clamp(0, 3);
            l[16 * j + i] = q as u8;
        }
    }
    b[0..16].copy_from_slice(&sc);
    pack_2bit(&l, &mut b[16..80]);
    b[80..82].copy_from_slice(&d.to_le_bytes());
    b[82..84].copy_from_slice(&dmin.to_le_bytes());
}

pub(super) fn quant_q3_k(x: &[f32], b: &mut [u8]) {
    let mut l = [0i8; QK_K];
    let mut scales = [0.0f32; 16];
    let (mut max_scale, mut amax) = (0.0f32, 0.0f32);
    for j in 0..16 {
        scales[j] = make_q3_quants(4, &x[16 * j..16 * j + 16], &mut l[16 * j..16 * j + 16]);
        let a = scales[j].abs();
        if a > amax {
            amax = a;
            max_scale = scales[j];
        }
    }
    let mut sb = [0u8; 12];
    let d = if max_scale != 0.0 {
        let iscale = -32.0f32 / max_scale;
        for j in 0..16 {
            // C stores nearest_int into an int8_t before clamping.
            let q = nearest_int(iscale * scales[j]) as i8 as i32;
            let q = (q.clamp(-32, 31) + 32) as u8;
            if j < 8 {
                sb[j] = q & 0xf;
            } else {
                sb[j - 8] |= (q & 0xf) << 4;
            }
            sb[j % 4 + 8] |= (q >> 4) << (2 * (j / 4));
        }
        f16_round(1.0 / iscale)
    } else {
        f16_round(0.0)
    };
    finish_q3_k(x, &sb, d, &mut l, b);
}

/// Q3_K after the scales are packed: requantization against the rounded scales and the
/// packing (shared with the imatrix quantizer).
pub(super) fn finish_q3_k(x: &[f32], sb: &[u8; 12], d: u16, l: &mut [i8; QK_K], b: &mut [u8]) {
    let df = f16_to_f32(d);
    for j in 0..16 {
        let lo = if j < 8 { sb[j] & 0xf } else { sb[j - 8] >> 4 };
        let sc = (lo | (((sb[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) as i32 - 32;
        let dj = df * sc as f32;
        if dj == 0.0 {
            continue;
        }
        for i in 0..16 {
            let q = nearest_int(x[16 * j + i] / dj).clamp(-4, 3);
            l[16 * j + i] = (q + 4) as i8;
        }
    }
    // The high bit of element e goes to bit e / 32 of hmask[e % 32].
    let mut hmask = [0u8; 32];
    let mut low = [0u8; QK_K];
    for e in 0..QK_K {
        let mut v = l[e];
        if v > 3 {
            hmask[e % 32] |= 1 << (e / 32);
            v -= 4;
        }
        low[e] = v as u8;
    }
    b[0..32].copy_from_slice(&hmask);
    pack_2bit(&low, &mut b[32..96]);
    b[96..108].copy_from_slice(sb);
    b[108..110].copy_from_slice(&d.to_le_bytes());
}

/// The sub-block fits shared by Q4_K and Q5_K: weights av|x| + |x| per 32-element sub-block.
fn scale_min_fits(
    x: &[f32],
    nmax: i32,
    rmin: f32,
    nstep: i32,
    l: &mut [u8; QK_K],
) -> ([f32; 8], [f32; 8]) {
    let mut scales = [0.0f32; 8];
    let mut mins = [0.0f32; 8];
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0.0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        let weights: [f32; 32] = std::array::from_fn(|i| av_x + xs[i].abs());
        let (s, m) = make_qkx2_quants(
            nmax,
            xs,
            &weights,
            &mut l[32 * j..32 * j + 32],
            rmin,
            0.1,
            nstep,
            false,
        );
        scales[j] = s;
        mins[j] = m;
    }
    (scales, mins)
}

/// Encodes the 8 scales and mins into 6 bits each (Q4_K/Q5_K's 12 bytes) with d and dmin,
/// then requantizes each sub-block against the rounded scales. Returns (d, dmin, scales).
fn pack_scale_min(
    x: &[f32],
    scales: &[f32; 8],
    mins: &[f32; 8],
    nmax: i32,
    l: &mut [u8; QK_K],
) -> (u16, u16, [u8; 12]) {
    let max_scale = scales
        .iter()
        .fold(0.0f32, |a, &s| if s > a { s } else { a });
    let max_min = mins.iter().fold(0.0f32, |a, &m| if m > a { m } else { a });
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut s = [0u8; 12];
    for j in 0..8 {
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            s[j] = ls;
            s[j + 4] = lm;
        } else {
            s[j + 4] = (ls & 0xf) | ((lm & 0xf) << 4);
            s[j - 4] |= (ls >> 4) << 6;
            s[j] |= (lm >> 4) << 6;
        }
    }
    let d = f16_round(max_scale / 63.0);
    let dmin = f16_round(max_min / 63.0);
    requant_scale_min(x, &s, d, dmin, nmax, l);
    (d, dmin, s)
}

/// Requantizes each 32-element sub-block of Q4_K/Q5_K against its rounded 6-bit scale and min.
pub(super) fn requant_scale_min(
    x: &[f32],
    s: &[u8; 12],
    d: u16,
    dmin: u16,
    nmax: i32,
    l: &mut [u8; QK_K],
) {
    let (sc, mn) = super::unpack_scale_min_k4(s);
    let (df, dminf) = (f16_to_f32(d), f16_to_f32(dmin));
    for j in 0..8 {
        let dj = df * sc[j] as f32;
        if dj == 0.0 {
            continue;
        }
        let dm = dminf * mn[j] as f32;
        for i in 0..32 {
            let q = nearest_int((x[32 * j + i] + dm) / dj).clamp(0, nmax);
            l[32 * j + i] = q as u8;
        }
    }
}

pub(super) fn quant_q4_k(x: &[f32], b: &mut [u8]) {
    let mut l = [0u8; QK_K];
    let (scales, mins) = scale_min_fits(x, 15, -1.0, 20, &mut l);
    let (d, dmin, s) = pack_scale_min(x, &scales, &mins, 15, &mut l);
    write_q4_k(d, dmin, &s, &l, b);
}

/// Q4_K's bytes from its scales and 4-bit quants.
pub(super) fn write_q4_k(d: u16, dmin: u16, s: &[u8; 12], l: &[u8; QK_K], b: &mut [u8]) {
    b[0..2].copy_from_slice(&d.to_le_bytes());
    b[2..4].copy_from_slice(&dmin.to_le_bytes());
    b[4..16].copy_from_slice(s);
    // Byte 32c + i: element 64c + i in the low nibble, 64c + 32 + i in the high one.
    for c in 0..4 {
        for i in 0..32 {
            b[16 + 32 * c + i] = l[64 * c + i] | (l[64 * c + 32 + i] << 4);
        }
    }
}

pub(super) fn quant_q5_k(x: &[f32], b: &mut [u8]) {
    let mut l = [0u8; QK_K];
    let (scales, mins) = scale_min_fits(x, 31, -0.5, 15, &mut l);
    let (d, dmin, s) = pack_scale_min(x, &scales, &mins, 31, &mut l);
    write_q5_k(d, dmin, &s, &l, b);
}

/// Q5_K's bytes from its scales and 5-bit quants.
pub(super) fn write_q5_k(d: u16, dmin: u16, s: &[u8; 12], l: &[u8; QK_K], b: &mut [u8]) {
    b[0..2].copy_from_slice(&d.to_le_bytes());
    b[2..4].copy_from_slice(&dmin.to_le_bytes());
    b[4..16].copy_from_slice(s);
    let mut qh = [0u8; 32];
    for c in 0..4 {
        let (m1, m2) = (1u8 << (2 * c), 2u8 << (2 * c));
        for i in 0..32 {
            let mut l1 = l[64 * c + i];
            if l1 > 15 {
                l1 -= 16;
                qh[i] |= m1;
            }
            let mut l2 = l[64 * c + 32 + i];
            if l2 > 15 {
                l2 -= 16;
                qh[i] |= m2;
            }
            b[48 + 32 * c + i] = l1 | (l2 << 4);
        }
    }
    b[16..48].copy_from_slice(&qh);
}

pub(super) fn quant_q6_k(x: &[f32], b: &mut [u8]) {
    let mut l = [0i8; QK_K];
    let mut scales = [0.0f32; 16];
    let (mut max_scale, mut max_abs) = (0.0f32, 0.0f32);
    for ib in 0..16 {
        let s = make_qx_quants(
            32,
            &x[16 * ib..16 * ib + 16],
            None,
            &mut l[16 * ib..16 * ib + 16],
        );
        scales[ib] = s;
        if s.abs() > max_abs {
            max_abs = s.abs();
            max_scale = s;
        }
    }
    finish_q6_k(x, &scales, max_scale, max_abs, &mut l, b);
}

/// Q6_K after the sub-block fits: the 8-bit scales against the largest, requantization, and
/// the packing (shared with the imatrix quantizer).
pub(super) fn finish_q6_k(
    x: &[f32],
    scales: &[f32; 16],
    max_scale: f32,
    max_abs: f32,
    l: &mut [i8; QK_K],
    b: &mut [u8],
) {
    if max_abs < GROUP_MAX_EPS {
        b.fill(0);
        return;
    }
    let iscale = -128.0f32 / max_scale;
    let d = f16_round(1.0 / iscale);
    let df = f16_to_f32(d);
    let mut sc = [0i8; 16];
    for ib in 0..16 {
        sc[ib] = nearest_int(iscale * scales[ib]).min(127) as i8;
    }
    for j in 0..16 {
        let dj = df * sc[j] as f32;
        if dj == 0.0 {
            continue;
        }
        for i in 0..16 {
            let q = nearest_int(x[16 * j + i] / dj).clamp(-32, 31);
            l[16 * j + i] = (q + 32) as i8;
        }
    }
    let lu = |e: usize| l[e] as u8;
    for h in 0..2 {
        for i in 0..32 {
            let e = 128 * h + i;
            b[64 * h + i] = (lu(e) & 0xf) | ((lu(e + 64) & 0xf) << 4);
            b[64 * h + 32 + i] = (lu(e + 32) & 0xf) | ((lu(e + 96) & 0xf) << 4);
            b[128 + 32 * h + i] = (lu(e) >> 4)
                | ((lu(e + 32) >> 4) << 2)
                | ((lu(e + 64) >> 4) << 4)
                | ((lu(e + 96) >> 4) << 6);
        }
    }
    for (o, &s) in b[192..208].iter_mut().zip(&sc) {
        *o = s as u8;
    }
    b[208..210].copy_from_slice(&d.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_half_to_even() {
        assert_eq!(nearest_int(0.5), 0);
        assert_eq!(nearest_int(1.5), 2);
        assert_eq!(nearest_int(2.5), 2);
        assert_eq!(nearest_int(-2.5), -2);
        assert_eq!(nearest_int(-3.7), -4);
        assert_eq!(nearest_int(31.49), 31);
    }
}
