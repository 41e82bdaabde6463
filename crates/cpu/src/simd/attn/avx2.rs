//! AVX2 + FMA + F16C attention row kernels. Every public-to-the-module function is a safe
//! wrapper that [`kernels`] hands out only after [`supported`] confirmed the features.
//!
//! Scores: products and sums in f64 (4-lane FMAs), four cells reduced together by `hadd` (list
//! entries 4j..4j + 4; the last `n % 4` one by one, in another lane order).
//! Accumulate: 32 accumulator lanes held in registers while the cells stream through, one FMA
//! chain per lane in list order (so pieces of a list, called in order, give the same bits).

use std::arch::x86_64::*;

use super::{check_cells, head_bytes, KvKernels};
use crate::simd::Isa;
use minfer_gguf::GgmlType;

pub(super) fn supported() -> bool {
    crate::cpu_features::avx2_fma_f16c()
}

pub(super) fn kernels(ty: GgmlType) -> Option<KvKernels> {
    if !supported() {
        return None;
    }
    let (scores, accum): (super::ScoresFn, super::AccumFn) = match ty {
        GgmlType::F32 => (scores_f32, accum_f32),
        GgmlType::F16 => (scores_f16, accum_f16),
        GgmlType::Q8_0 => (scores_q8_0, accum_q8_0),
        _ => return None,
    };
    Some(KvKernels {
        scores,
        accum,
        isa: Isa::Avx2,
    })
}

macro_rules! safe_wrappers {
    ($($name:ident => $inner:ident ($($arg:ident: $t:ty),*)),* $(,)?) => {
        $(fn $name($($arg: $t),*) {
            // SAFETY: only handed out by `kernels`, after `supported()` confirmed AVX2, F16C
            // and FMA; the kernel checks its slice bounds itself.
            unsafe { $inner($($arg),*) }
        })*
    };
}

safe_wrappers! {
    scores_f32 => scores_f32_k(q: &[f32], k: &[u8], cells: &[usize], out: &mut [f64]),
    scores_f16 => scores_f16_k(q: &[f32], k: &[u8], cells: &[usize], out: &mut [f64]),
    scores_q8_0 => scores_q8_0_k(q: &[f32], k: &[u8], cells: &[usize], out: &mut [f64]),
    accum_f32 => accum_f32_k(acc: &mut [f32], v: &[u8], cells: &[usize], p: &[f32]),
    accum_f16 => accum_f16_k(acc: &mut [f32], v: &[u8], cells: &[usize], p: &[f32]),
    accum_q8_0 => accum_q8_0_k(acc: &mut [f32], v: &[u8], cells: &[usize], p: &[f32]),
}

/// Horizontal sums of four 4-lane f64 vectors: `([Σa, Σb], [Σc, Σd])`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum4_pd(a: __m256d, b: __m256d, c: __m256d, d: __m256d) -> (__m128d, __m128d) {
    let ab = _mm256_hadd_pd(a, b);
    let cd = _mm256_hadd_pd(c, d);
    (
        _mm_add_pd(_mm256_castpd256_pd128(ab), _mm256_extractf128_pd::<1>(ab)),
        _mm_add_pd(_mm256_castpd256_pd128(cd), _mm256_extractf128_pd::<1>(cd)),
    )
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum_pd(a: __m256d) -> f64 {
    let s = _mm_add_pd(_mm256_castpd256_pd128(a), _mm256_extractf128_pd::<1>(a));
    _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)))
}

/// The low and high 4 lanes of 8 f32 as f64 (exact).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn widen(x: __m256) -> (__m256d, __m256d) {
    (
        _mm256_cvtps_pd(_mm256_castps256_ps128(x)),
        _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(x)),
    )
}

/// `acc + x * y` over 8 f32 pairs, the products and sums in f64 (two 4-lane halves).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn fma8_pd(acc: (__m256d, __m256d), x: __m256, y: __m256) -> (__m256d, __m256d) {
    let (xl, xh) = widen(x);
    let (yl, yh) = widen(y);
    (
        _mm256_fmadd_pd(xl, yl, acc.0),
        _mm256_fmadd_pd(xh, yh, acc.1),
    )
}

/// 8 f32 elements of a head at element `i`.
///
/// SAFETY (caller): `h + 4 * (i + 8)` lies inside the head.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load8_f32(h: *const u8, i: usize) -> __m256 {
    // SAFETY: in bounds per the caller; loadu has no alignment requirement.
    unsafe { _mm256_loadu_ps(h.add(4 * i).cast::<f32>()) }
}

/// 8 f16 elements of a head at element `i`, widened to f32 (exact).
///
/// SAFETY (caller): `h + 2 * (i + 8)` lies inside the head.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load8_f16(h: *const u8, i: usize) -> __m256 {
    // SAFETY: in bounds per the caller; loadu has no alignment requirement.
    unsafe { _mm256_cvtph_ps(_mm_loadu_si128(h.add(2 * i).cast::<__m128i>())) }
}

/// 8 signed bytes at `b` as f32 (exact).
///
/// SAFETY (caller): `b + 8` lies inside the head.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load8_i8(b: *const u8) -> __m256 {
    // SAFETY: 8 bytes in bounds per the caller; loadl reads exactly 8 bytes.
    unsafe { _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(b.cast::<__m128i>()))) }
}

/// Scores for float heads: `load8(h, i)` gives elements `i..i + 8`, `one(h, i)` element `i`.
/// Products and sums in f64 (f32 x f32 products are exact there).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scores_float(
    ty: GgmlType,
    q: &[f32],
    k: &[u8],
    cells: &[usize],
    out: &mut [f64],
    load8: impl Fn(*const u8, usize) -> __m256,
    one: impl Fn(*const u8, usize) -> f32,
) {
    let hd = q.len();
    let n = out.len();
    check_cells(k, cells, n, head_bytes(ty, hd));
    let full = hd / 8 * 8;
    let qp = q.as_ptr();
    let cell = |j: usize| k.as_ptr().wrapping_add(cells[j]);
    let zero = || (_mm256_setzero_pd(), _mm256_setzero_pd());
    let tail = |h: *const u8| -> f64 { (full..hd).map(|i| q[i] as f64 * one(h, i) as f64).sum() };
    // SAFETY: every cell j < n is in bounds (`check_cells`), element reads stay below `hd`.
    unsafe {
        let mut j = 0;
        while j + 4 <= n {
            let h = [cell(j), cell(j + 1), cell(j + 2), cell(j + 3)];
            let mut a = [zero(), zero(), zero(), zero()];
            let mut i = 0;
            while i < full {
                let qv = _mm256_loadu_ps(qp.add(i));
                for c in 0..4 {
                    a[c] = fma8_pd(a[c], qv, load8(h[c], i));
                }
                i += 8;
            }
            let sum = |x: (__m256d, __m256d)| _mm256_add_pd(x.0, x.1);
            let (s01, s23) = hsum4_pd(sum(a[0]), sum(a[1]), sum(a[2]), sum(a[3]));
            _mm_storeu_pd(out.as_mut_ptr().add(j), s01);
            _mm_storeu_pd(out.as_mut_ptr().add(j + 2), s23);
            if full < hd {
                for c in 0..4 {
                    out[j + c] += tail(h[c]);
                }
            }
            j += 4;
        }
        while j < n {
            let h = cell(j);
            let mut a = zero();
            let mut i = 0;
            while i < full {
                a = fma8_pd(a, _mm256_loadu_ps(qp.add(i)), load8(h, i));
                i += 8;
            }
            out[j] = hsum_pd(_mm256_add_pd(a.0, a.1)) + tail(h);
            j += 1;
        }
    }
}

/// Accumulation for float heads (see [`scores_float`] for `load8` / `one`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn accum_float(
    ty: GgmlType,
    acc: &mut [f32],
    v: &[u8],
    cells: &[usize],
    p: &[f32],
    load8: impl Fn(*const u8, usize) -> __m256,
    one: impl Fn(*const u8, usize) -> f32,
) {
    let hd = acc.len();
    let n = p.len();
    check_cells(v, cells, n, head_bytes(ty, hd));
    let cell = |j: usize| v.as_ptr().wrapping_add(cells[j]);
    let ap = acc.as_mut_ptr();
    // SAFETY: as in `scores_float`; accumulator reads and writes stay below `hd`.
    unsafe {
        let mut i = 0;
        while i + 32 <= hd {
            let mut a = [
                _mm256_loadu_ps(ap.add(i)),
                _mm256_loadu_ps(ap.add(i + 8)),
                _mm256_loadu_ps(ap.add(i + 16)),
                _mm256_loadu_ps(ap.add(i + 24)),
            ];
            for (j, &w) in p.iter().enumerate() {
                let (h, w) = (cell(j), _mm256_set1_ps(w));
                for (c, ac) in a.iter_mut().enumerate() {
                    *ac = _mm256_fmadd_ps(w, load8(h, i + 8 * c), *ac);
                }
            }
            for (c, ac) in a.iter().enumerate() {
                _mm256_storeu_ps(ap.add(i + 8 * c), *ac);
            }
            i += 32;
        }
        while i + 8 <= hd {
            let mut a = _mm256_loadu_ps(ap.add(i));
            for (j, &w) in p.iter().enumerate() {
                a = _mm256_fmadd_ps(_mm256_set1_ps(w), load8(cell(j), i), a);
            }
            _mm256_storeu_ps(ap.add(i), a);
            i += 8;
        }
        for (e, a) in acc.iter_mut().enumerate().skip(i) {
            for (j, &w) in p.iter().enumerate() {
                *a += w * one(cell(j), e);
            }
        }
    }
}

/// Element `i` of an f32 head.
///
/// SAFETY (caller): `h + 4 * (i + 1)` lies inside the head.
unsafe fn one_f32(h: *const u8, i: usize) -> f32 {
    // SAFETY: per the caller.
    unsafe { h.add(4 * i).cast::<f32>().read_unaligned() }
}

/// Element `i` of an f16 head.
///
/// SAFETY (caller): `h + 2 * (i + 1)` lies inside the head.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn one_f16(h: *const u8, i: usize) -> f32 {
    // SAFETY: per the caller.
    unsafe { half_at(h.add(2 * i)) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scores_f32_k(q: &[f32], k: &[u8], cells: &[usize], out: &mut [f64]) {
    // SAFETY: this function's features are enabled (its caller's contract).
    unsafe {
        scores_float(
            GgmlType::F32,
            q,
            k,
            cells,
            out,
            |h, i| load8_f32(h, i),
            |h, i| one_f32(h, i),
        )
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scores_f16_k(q: &[f32], k: &[u8], cells: &[usize], out: &mut [f64]) {
    // SAFETY: as `scores_f32_k`.
    unsafe {
        scores_float(
            GgmlType::F16,
            q,
            k,
            cells,
            out,
            |h, i| load8_f16(h, i),
            |h, i| one_f16(h, i),
        )
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn accum_f32_k(acc: &mut [f32], v: &[u8], cells: &[usize], p: &[f32]) {
    // SAFETY: as `scores_f32_k`.
    unsafe {
        accum_float(
            GgmlType::F32,
            acc,
            v,
            cells,
            p,
            |h, i| load8_f32(h, i),
            |h, i| one_f32(h, i),
        )
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn accum_f16_k(acc: &mut [f32], v: &[u8], cells: &[usize], p: &[f32]) {
    // SAFETY: as `scores_f32_k`.
    unsafe {
        accum_float(
            GgmlType::F16,
            acc,
            v,
            cells,
            p,
            |h, i| load8_f16(h, i),
            |h, i| one_f16(h, i),
        )
    }
}

/// The f16 at `b` (a Q8_0 block scale, an f16 element), widened by F16C: the
/// `half` conversion checks CPU features on every call, which showed in `perf` of q8_0 decode.
///
/// SAFETY (caller): `b + 2` lies inside the head.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn half_at(b: *const u8) -> f32 {
    // SAFETY: per the caller.
    let bits = unsafe { b.cast::<u16>().read_unaligned() };
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

/// Q8_0 scores with f32 queries (no query rounding): per block, 32 products summed in f64,
/// then scaled by the block's `d` into the cell's total.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scores_q8_0_k(q: &[f32], k: &[u8], cells: &[usize], out: &mut [f64]) {
    let hd = q.len();
    let n = out.len();
    check_cells(k, cells, n, head_bytes(GgmlType::Q8_0, hd));
    let nb = hd / 32;
    let qp = q.as_ptr();
    let cell = |j: usize| k.as_ptr().wrapping_add(cells[j]);
    // SAFETY: cells j < n are in bounds (`check_cells`), blocks b < hd / 32 inside each.
    let dot = |h: *const u8| -> __m256d {
        unsafe {
            let mut t = _mm256_setzero_pd();
            for b in 0..nb {
                let blk = h.add(34 * b);
                let qb = qp.add(32 * b);
                let mut s = (_mm256_setzero_pd(), _mm256_setzero_pd());
                for c in 0..4 {
                    s = fma8_pd(
                        s,
                        _mm256_loadu_ps(qb.add(8 * c)),
                        load8_i8(blk.add(2 + 8 * c)),
                    );
                }
                let d = _mm256_set1_pd(half_at(blk) as f64);
                t = _mm256_fmadd_pd(_mm256_add_pd(s.0, s.1), d, t);
            }
            t
        }
    };
    let mut j = 0;
    while j + 4 <= n {
        let (s01, s23) = hsum4_pd(
            dot(cell(j)),
            dot(cell(j + 1)),
            dot(cell(j + 2)),
            dot(cell(j + 3)),
        );
        // SAFETY: j + 4 <= out.len().
        unsafe {
            _mm_storeu_pd(out.as_mut_ptr().add(j), s01);
            _mm_storeu_pd(out.as_mut_ptr().add(j + 2), s23);
        }
        j += 4;
    }
    while j < n {
        out[j] = hsum_pd(dot(cell(j)));
        j += 1;
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn accum_q8_0_k(acc: &mut [f32], v: &[u8], cells: &[usize], p: &[f32]) {
    let hd = acc.len();
    check_cells(v, cells, p.len(), head_bytes(GgmlType::Q8_0, hd));
    let cell = |j: usize| v.as_ptr().wrapping_add(cells[j]);
    let ap = acc.as_mut_ptr();
    // SAFETY: cells j < p.len() are in bounds (`check_cells`); block b < hd / 32 covers
    // accumulator lanes 32b..32b + 32 < hd.
    unsafe {
        for b in 0..hd / 32 {
            let o = ap.add(32 * b);
            let mut a = [
                _mm256_loadu_ps(o),
                _mm256_loadu_ps(o.add(8)),
                _mm256_loadu_ps(o.add(16)),
                _mm256_loadu_ps(o.add(24)),
            ];
            for (j, &w) in p.iter().enumerate() {
                let blk = cell(j).add(34 * b);
                let wd = _mm256_set1_ps(w * half_at(blk));
                for (c, ac) in a.iter_mut().enumerate() {
                    *ac = _mm256_fmadd_ps(wd, load8_i8(blk.add(2 + 8 * c)), *ac);
                }
            }
            for (c, ac) in a.iter().enumerate() {
                _mm256_storeu_ps(o.add(8 * c), *ac);
            }
        }
    }
}
