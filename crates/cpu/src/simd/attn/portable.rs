//! Portable attention row kernels (every machine): plain f32 loops in element order.

use super::{check_cells, head_bytes, KvKernels};
use crate::simd::Isa;
use minfer_gguf::quants::f16_to_f32;
use minfer_gguf::GgmlType;

pub(super) fn kernels(ty: GgmlType) -> Option<KvKernels> {
    let (scores, accum): (super::ScoresFn, super::AccumFn) = match ty {
        GgmlType::F32 => (scores_f32, accum_f32),
        GgmlType::F16 => (scores_f16, accum_f16),
        GgmlType::Q8_0 => (scores_q8_0, accum_q8_0),
        _ => return None,
    };
    Some(KvKernels {
        scores,
        accum,
        isa: Isa::Scalar,
    })
}

#[inline]
fn f32_at(h: &[u8], i: usize) -> f32 {
    f32::from_le_bytes([h[4 * i], h[4 * i + 1], h[4 * i + 2], h[4 * i + 3]])
}

#[inline]
fn f16_at(h: &[u8], i: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([h[2 * i], h[2 * i + 1]]))
}

/// Scores with element `i` of a head read by `elem(head, i)`.
#[inline]
fn scores_with(
    ty: GgmlType,
    q: &[f32],
    k: &[u8],
    cells: &[usize],
    out: &mut [f64],
    elem: impl Fn(&[u8], usize) -> f32,
) {
    let hb = head_bytes(ty, q.len());
    check_cells(k, cells, out.len(), hb);
    for (&c, o) in cells.iter().zip(out.iter_mut()) {
        let h = &k[c..c + hb];
        *o = q
            .iter()
            .enumerate()
            .map(|(i, &x)| x as f64 * elem(h, i) as f64)
            .sum();
    }
}

#[inline]
fn accum_with(
    ty: GgmlType,
    acc: &mut [f32],
    v: &[u8],
    cells: &[usize],
    p: &[f32],
    elem: impl Fn(&[u8], usize) -> f32,
) {
    let hb = head_bytes(ty, acc.len());
    check_cells(v, cells, p.len(), hb);
    for (&c, &w) in cells.iter().zip(p) {
        let h = &v[c..c + hb];
        for (i, a) in acc.iter_mut().enumerate() {
            *a += w * elem(h, i);
        }
    }
}

fn scores_f32(q: &[f32], k: &[u8], cells: &[usize], out: &mut [f64]) {
    scores_with(GgmlType::F32, q, k, cells, out, f32_at)
}

fn scores_f16(q: &[f32], k: &[u8], cells: &[usize], out: &mut [f64]) {
    scores_with(GgmlType::F16, q, k, cells, out, f16_at)
}

fn accum_f32(acc: &mut [f32], v: &[u8], cells: &[usize], p: &[f32]) {
    accum_with(GgmlType::F32, acc, v, cells, p, f32_at)
}

fn accum_f16(acc: &mut [f32], v: &[u8], cells: &[usize], p: &[f32]) {
    accum_with(GgmlType::F16, acc, v, cells, p, f16_at)
}

/// Q8_0: per block of 32, `d * Σ q_i * x_i` (the block sum in f32, then scaled).
fn scores_q8_0(q: &[f32], k: &[u8], cells: &[usize], out: &mut [f64]) {
    let hb = head_bytes(GgmlType::Q8_0, q.len());
    check_cells(k, cells, out.len(), hb);
    for (&c, o) in cells.iter().zip(out.iter_mut()) {
        let h = &k[c..c + hb];
        let mut s = 0f64;
        for (qb, blk) in q.chunks_exact(32).zip(h.chunks_exact(34)) {
            let d = f16_to_f32(u16::from_le_bytes([blk[0], blk[1]]));
            let bs: f64 = qb
                .iter()
                .zip(&blk[2..])
                .map(|(&x, &b)| x as f64 * (b as i8) as f64)
                .sum();
            s += d as f64 * bs;
        }
        *o = s;
    }
}

fn accum_q8_0(acc: &mut [f32], v: &[u8], cells: &[usize], p: &[f32]) {
    let hb = head_bytes(GgmlType::Q8_0, acc.len());
    check_cells(v, cells, p.len(), hb);
    for (&c, &w) in cells.iter().zip(p) {
        let h = &v[c..c + hb];
        for (ab, blk) in acc.chunks_exact_mut(32).zip(h.chunks_exact(34)) {
            let wd = w * f16_to_f32(u16::from_le_bytes([blk[0], blk[1]]));
            for (a, &b) in ab.iter_mut().zip(&blk[2..]) {
                *a += wd * (b as i8) as f32;
            }
        }
    }
}
