//! `attn_f16`'s one-chunk kernels (`attend_head`, `attend_group`) in AVX2 + FMA + F16C: the
//! arithmetic of llama.cpp's AVX2 build, lane for lane (`attn_f16`'s module docs; the AVX-512
//! form of the same lanes is `attn_f16_avx512`).

use minfer_gguf::quants::{f16_to_f32 as h, f32_to_f16};
use std::arch::x86_64::*;

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load_ph(x: &[u16], i: usize) -> __m256 {
    let x = &x[i..i + 8];
    // SAFETY: 8 readable u16 (16 bytes); loadu has no alignment requirement.
    unsafe { _mm256_cvtph_ps(_mm_loadu_si128(x.as_ptr().cast())) }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn store_ph(x: &mut [u16], i: usize, v: __m256) {
    let x = &mut x[i..i + 8];
    let p = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
    // SAFETY: 8 writable u16; storeu has no alignment requirement.
    unsafe { _mm_storeu_si128(x.as_mut_ptr().cast(), p) }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot(x: &[u16], y: &[u16]) -> f32 {
    let n = x.len().min(y.len());
    let np = n & !31;
    let mut acc = [_mm256_setzero_ps(); 4];
    for i in (0..np).step_by(32) {
        for (j, a) in acc.iter_mut().enumerate() {
            *a = _mm256_fmadd_ps(load_ph(x, i + 8 * j), load_ph(y, i + 8 * j), *a);
        }
    }
    let a0 = _mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3]));
    let t = _mm_add_ps(_mm256_castps256_ps128(a0), _mm256_extractf128_ps::<1>(a0));
    let t = _mm_hadd_ps(t, t);
    let t = _mm_hadd_ps(t, t);
    let mut r = _mm_cvtss_f32(t) as f64;
    for e in np..n {
        r += (h(x[e]) * h(y[e])) as f64;
    }
    r as f32
}

/// f32 to f16 and back (exact for the result: the f16 rounding of each lane, as f32).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn round_ph(x: __m256) -> __m256 {
    _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x))
}

/// [`dot`] with `y` given as f32 values of f16 numbers (exact), `x` as f16 bits: the same
/// products and sums in the same order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn dot_f32(x: &[f32], y: &[f32]) -> f32 {
    let n = x.len().min(y.len());
    let np = n & !31;
    let mut acc = [_mm256_setzero_ps(); 4];
    let (xp, yp) = (x.as_ptr(), y.as_ptr());
    for i in (0..np).step_by(32) {
        for (j, a) in acc.iter_mut().enumerate() {
            // SAFETY: i + 8j + 8 <= np <= both lengths.
            let (xv, yv) = unsafe {
                (
                    _mm256_loadu_ps(xp.add(i + 8 * j)),
                    _mm256_loadu_ps(yp.add(i + 8 * j)),
                )
            };
            *a = _mm256_fmadd_ps(xv, yv, *a);
        }
    }
    let a0 = _mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3]));
    let t = _mm_add_ps(_mm256_castps256_ps128(a0), _mm256_extractf128_ps::<1>(a0));
    let t = _mm_hadd_ps(t, t);
    let t = _mm_hadd_ps(t, t);
    let mut r = _mm_cvtss_f32(t) as f64;
    for e in np..n {
        r += (x[e] * y[e]) as f64;
    }
    r as f32
}

/// [`super::attend_group`]: per cell, K and V widened to f32 once (exact), then every
/// head's step of [`attend_head`], its f16 accumulator held as f32 values of f16 numbers
/// (rounded by [`round_ph`] where [`attend_head`] stores to f16).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn attend_group<'a>(
    q: &[f32],
    hd: usize,
    scale: f32,
    cells: impl IntoIterator<Item = usize>,
    k: impl Fn(usize) -> &'a [u16],
    v: impl Fn(usize) -> &'a [u16],
    out: &mut [f32],
) {
    let g = q.len() / hd;
    let d8 = hd & !7;
    // Queries rounded to f16, as f32; the accumulators, one head after another.
    let qf: Vec<f32> = q.iter().map(|&x| h(f32_to_f16(x))).collect();
    let mut vkq = vec![0f32; g * hd];
    let mut m = vec![f32::NEG_INFINITY; g];
    let mut sum = vec![0f32; g];
    let (mut kf, mut vf) = (vec![0f32; hd], vec![0f32; hd]);
    let mut s = vec![0f32; g];
    for c in cells {
        let (kc, vc) = (&k(c)[..hd], &v(c)[..hd]);
        for i in (0..d8).step_by(8) {
            // SAFETY: i + 8 <= d8 <= hd, the length of all four slices.
            unsafe {
                _mm256_storeu_ps(kf.as_mut_ptr().add(i), load_ph(kc, i));
                _mm256_storeu_ps(vf.as_mut_ptr().add(i), load_ph(vc, i));
            }
        }
        for e in d8..hd {
            kf[e] = h(kc[e]);
            vf[e] = h(vc[e]);
        }
        for (sh, qh) in s.iter_mut().zip(qf.chunks_exact(hd)) {
            *sh = dot_f32(&kf, qh) * scale;
        }
        for (hh, acc) in vkq.chunks_exact_mut(hd).enumerate() {
            let (mut ms, mut vs) = (1f32, 1f32);
            if s[hh] > m[hh] {
                let mold = m[hh];
                m[hh] = s[hh];
                ms = (mold - m[hh]).exp();
                let msv = _mm256_set1_ps(ms);
                for i in (0..d8).step_by(8) {
                    // SAFETY: i + 8 <= d8 <= hd = acc.len().
                    unsafe {
                        let p = acc.as_mut_ptr().add(i);
                        _mm256_storeu_ps(p, round_ph(_mm256_mul_ps(_mm256_loadu_ps(p), msv)));
                    }
                }
                for a in acc[d8..].iter_mut() {
                    *a = h(f32_to_f16(*a * ms));
                }
            } else {
                vs = (s[hh] - m[hh]).exp();
            }
            let vsv = _mm256_set1_ps(vs);
            for i in (0..d8).step_by(8) {
                // SAFETY: i + 8 <= d8 <= hd, the length of `acc` and `vf`.
                unsafe {
                    let p = acc.as_mut_ptr().add(i);
                    let r = _mm256_fmadd_ps(
                        _mm256_loadu_ps(vf.as_ptr().add(i)),
                        vsv,
                        _mm256_loadu_ps(p),
                    );
                    _mm256_storeu_ps(p, round_ph(r));
                }
            }
            for (a, &x) in acc[d8..].iter_mut().zip(&vf[d8..]) {
                *a = h(f32_to_f16(x.mul_add(vs, *a)));
            }
            sum[hh] = sum[hh].mul_add(ms, vs);
        }
    }
    for ((o, acc), &sm) in out.chunks_exact_mut(hd).zip(vkq.chunks_exact(hd)).zip(&sum) {
        let inv = if sm == 0.0 { 0.0 } else { 1.0 / sm };
        for (o, &a) in o.iter_mut().zip(acc) {
            *o = a * inv;
        }
    }
}

/// [`super::attend_head_ref`] with 8-lane f16 loads and stores (the same roundings:
/// F16C converts round to nearest even like `f32_to_f16`).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn attend_head<'a>(
    q: &[f32],
    scale: f32,
    cells: impl IntoIterator<Item = usize>,
    k: impl Fn(usize) -> &'a [u16],
    v: impl Fn(usize) -> &'a [u16],
    out: &mut [f32],
) {
    let d = out.len();
    let d8 = d & !7;
    let q16: Vec<u16> = q.iter().map(|&x| f32_to_f16(x)).collect();
    let mut vkq = vec![0u16; d];
    let (mut m, mut sum) = (f32::NEG_INFINITY, 0f32);
    for c in cells {
        let s = dot(k(c), &q16) * scale;
        let (mut ms, mut vs) = (1f32, 1f32);
        if s > m {
            let mold = m;
            m = s;
            ms = (mold - m).exp();
            let msv = _mm256_set1_ps(ms);
            for i in (0..d8).step_by(8) {
                let r = _mm256_mul_ps(load_ph(&vkq, i), msv);
                store_ph(&mut vkq, i, r);
            }
            for a in vkq[d8..].iter_mut() {
                *a = f32_to_f16(h(*a) * ms);
            }
        } else {
            vs = (s - m).exp();
        }
        let vc = v(c);
        let vsv = _mm256_set1_ps(vs);
        for i in (0..d8).step_by(8) {
            let r = _mm256_fmadd_ps(load_ph(vc, i), vsv, load_ph(&vkq, i));
            store_ph(&mut vkq, i, r);
        }
        for (a, &x) in vkq[d8..].iter_mut().zip(&vc[d8..]) {
            *a = f32_to_f16(h(x).mul_add(vs, h(*a)));
        }
        sum = sum.mul_add(ms, vs);
    }
    let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
    for (o, &a) in out.iter_mut().zip(&vkq) {
        *o = h(a) * inv;
    }
}
