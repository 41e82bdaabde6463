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

/// Cells a block of [`attend_tile`] widens.
const TILE_BLOCK: usize = 16;

/// Cells whose scores [`attend_tile`] computes together (each query vector loaded once):
/// at -t 1 on the demo's shape 2 took 0.57 of row by row's time, 1 0.66, 3 0.54, 4 0.58.
const SCORE_CELLS: usize = 2;

/// `attn_f16::attend_tile` in AVX2 + FMA + F16C for heads of `HD` (64 or 128): the
/// AVX-512 tile kernel's steps (`attn_f16_avx512_tile::attend_tile`) with chains 8 to a vector,
/// the exponentials by [`super::libm_expf::expf8_avx2`] (the C library's `expf` in AVX2,
/// where it matches; else `f32::exp`), and each chain's V accumulator walked 64 dims at a
/// time (8 registers). Every chain's operations and their order are the reference's.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(super) fn attend_tile<'a, const HD: usize>(
    q: &[&[f32]],
    lens: &[usize],
    scale: f32,
    cells: &[usize],
    k: impl Fn(usize) -> &'a [u16],
    v: impl Fn(usize) -> &'a [u16],
    out: &mut [&mut [f32]],
) {
    const { assert!(HD.is_multiple_of(64)) };
    let hd = HD;
    let rows = q.len();
    assert!(rows > 0 && lens.len() == rows && out.len() == rows);
    let g = q[0].len() / hd;
    let nc = g * rows;
    let ng = nc.div_ceil(8);
    let np = ng * 8;
    let maxlen = lens.iter().copied().max().unwrap_or(0);
    assert!(cells.len() >= maxlen);
    let libm = super::libm_expf::avx2_matches_c_library();
    let mut qt = vec![0f32; np * hd];
    let mut clen = vec![0i32; np];
    for (c, cl) in clen.iter_mut().enumerate().take(nc) {
        let (hh, r) = (c / rows, c % rows);
        let (gi, l) = (c / 8, c % 8);
        for (e, &x) in q[r][hh * hd..][..hd].iter().enumerate() {
            qt[(gi * hd + e) * 8 + l] = h(f32_to_f16(x));
        }
        *cl = lens[r] as i32;
    }
    let mut m = vec![_mm256_set1_ps(f32::NEG_INFINITY); ng];
    let mut sum = vec![_mm256_setzero_ps(); ng];
    let lenv: Vec<__m256i> = clen
        .chunks_exact(8)
        // SAFETY: 8 i32 each.
        .map(|c| unsafe { _mm256_loadu_si256(c.as_ptr().cast()) })
        .collect();
    let mut acc = vec![0f32; np * hd];
    let mut kf = vec![0f32; TILE_BLOCK * hd];
    let mut vf = vec![0f32; TILE_BLOCK * hd];
    let mut eb = vec![0f32; ng * TILE_BLOCK * 8];
    let mut gb = vec![0u8; ng * TILE_BLOCK];
    let scale_v = _mm256_set1_ps(scale);
    let one = _mm256_set1_ps(1.0);
    for b0 in (0..maxlen).step_by(TILE_BLOCK) {
        let n = TILE_BLOCK.min(maxlen - b0);
        for (j, &cell) in cells[b0..b0 + n].iter().enumerate() {
            let (kc, vc) = (&k(cell)[..hd], &v(cell)[..hd]);
            for i in (0..hd).step_by(8) {
                // SAFETY: j < TILE_BLOCK: j hd + i + 8 <= TILE_BLOCK hd.
                unsafe {
                    _mm256_storeu_ps(kf.as_mut_ptr().add(j * hd + i), load_ph(kc, i));
                    _mm256_storeu_ps(vf.as_mut_ptr().add(j * hd + i), load_ph(vc, i));
                }
            }
        }
        for gi in 0..ng {
            let qg = &qt[gi * hd * 8..][..hd * 8];
            let (mut mv, mut sv) = (m[gi], sum[gi]);
            let mut sc = [_mm256_setzero_ps(); TILE_BLOCK];
            for j in (0..n).step_by(SCORE_CELLS) {
                let js: [usize; SCORE_CELLS] = std::array::from_fn(|i| (j + i).min(n - 1));
                let got = scores8xn::<HD, SCORE_CELLS>(qg, js.map(|j| &kf[j * hd..][..hd]));
                for (&j, s) in js.iter().zip(got) {
                    sc[j] = _mm256_mul_ps(s, scale_v);
                }
            }
            for (j, &s) in sc.iter().enumerate().take(n) {
                let valid = _mm256_castsi256_ps(_mm256_cmpgt_epi32(
                    lenv[gi],
                    _mm256_set1_epi32((b0 + j) as i32),
                ));
                let grew = _mm256_and_ps(valid, _mm256_cmp_ps::<_CMP_GT_OQ>(s, mv));
                let arg = _mm256_blendv_ps(_mm256_sub_ps(s, mv), _mm256_sub_ps(mv, s), grew);
                let arg = _mm256_and_ps(arg, valid);
                mv = _mm256_blendv_ps(mv, s, grew);
                let e = if libm {
                    super::libm_expf::expf8_avx2(arg)
                } else {
                    let mut a = [0f32; 8];
                    // SAFETY: 8 f32 each way.
                    unsafe { _mm256_storeu_ps(a.as_mut_ptr(), arg) };
                    for x in a.iter_mut() {
                        *x = x.exp();
                    }
                    // SAFETY: as above.
                    unsafe { _mm256_loadu_ps(a.as_ptr()) }
                };
                let ms = _mm256_blendv_ps(one, e, grew);
                let vs = _mm256_blendv_ps(e, one, grew);
                sv = _mm256_blendv_ps(sv, _mm256_fmadd_ps(sv, ms, vs), valid);
                // SAFETY: (gi TILE_BLOCK + j) 8 + 8 <= eb.len().
                unsafe { _mm256_storeu_ps(eb.as_mut_ptr().add((gi * TILE_BLOCK + j) * 8), e) };
                gb[gi * TILE_BLOCK + j] = _mm256_movemask_ps(grew) as u8;
            }
            m[gi] = mv;
            sum[gi] = sv;
        }
        for c in 0..np {
            let nch = (clen[c] as usize).saturating_sub(b0).min(n);
            if nch == 0 {
                continue;
            }
            let (gi, l) = (c / 8, c % 8);
            for d in (0..hd).step_by(64) {
                tile_v(
                    &mut acc[c * hd + d..][..64],
                    &vf[d..],
                    hd,
                    nch,
                    &eb[gi * TILE_BLOCK * 8..][..TILE_BLOCK * 8],
                    &gb[gi * TILE_BLOCK..][..TILE_BLOCK],
                    l,
                );
            }
        }
    }
    let mut sums = vec![0f32; np];
    for (s, v) in sums.chunks_exact_mut(8).zip(&sum) {
        // SAFETY: 8 writable f32.
        unsafe { _mm256_storeu_ps(s.as_mut_ptr(), *v) };
    }
    for c in 0..nc {
        let (hh, r) = (c / rows, c % rows);
        let sm = sums[c];
        let inv = if sm == 0.0 { 0.0 } else { 1.0 / sm };
        for (o, &a) in out[r][hh * hd..][..hd].iter_mut().zip(&acc[c * hd..][..hd]) {
            *o = a * inv;
        }
    }
}

/// The dots of 8 chains' transposed queries `qg` (element e of lane l at `e 8 + l`) with N K
/// rows `kr`, each query vector loaded once for the N (the loads, not the FMAs, bound one
/// row at a time), lane for lane [`dot_f32`] (see `attn_f16_avx512_tile::scores`): accumulator j's
/// lane l takes the elements 32 c + 8 j + l by fma from zero, then (acc0 + acc2) + (acc1 +
/// acc3), lanes l and l + 4 added, then (t0 + t1) + (t2 + t3).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn scores8xn<const HD: usize, const N: usize>(qg: &[f32], kr: [&[f32]; N]) -> [__m256; N] {
    assert!(HD.is_multiple_of(32) && qg.len() >= HD * 8 && kr.iter().all(|k| k.len() >= HD));
    let qp = qg.as_ptr();
    let kp: [*const f32; N] = kr.map(|k| k.as_ptr());
    let mut t = [[_mm256_setzero_ps(); 4]; N];
    for l in 0..4 {
        let mut a = [[_mm256_setzero_ps(); 2]; N];
        for (half, ll) in [l, l + 4].into_iter().enumerate() {
            let mut p = [[_mm256_setzero_ps(); 4]; N];
            for j in 0..4 {
                for c in 0..HD / 32 {
                    let e = 32 * c + 8 * j + ll;
                    // SAFETY: e < HD: qg holds HD 8 values, each kr HD.
                    unsafe {
                        let qv = _mm256_loadu_ps(qp.add(e * 8));
                        for (p, k) in p.iter_mut().zip(&kp) {
                            p[j] = _mm256_fmadd_ps(qv, _mm256_set1_ps(*k.add(e)), p[j]);
                        }
                    }
                }
            }
            for (x, p) in a.iter_mut().zip(&p) {
                x[half] = _mm256_add_ps(_mm256_add_ps(p[0], p[2]), _mm256_add_ps(p[1], p[3]));
            }
        }
        for (tx, x) in t.iter_mut().zip(&a) {
            tx[l] = _mm256_add_ps(x[0], x[1]);
        }
    }
    t.map(|t| _mm256_add_ps(_mm256_add_ps(t[0], t[1]), _mm256_add_ps(t[2], t[3])))
}

/// One chain's 64 accumulator dims `acc` over its first `n` cells of a block (`vf`: the
/// block's widened V rows from this slice's first dim, `hd` apart): per cell the reference's
/// rescale (when the max grew) and update, rounded to f16; `e`/`grew`: lane `l` of the
/// block's steps, 8 apart.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn tile_v(acc: &mut [f32], vf: &[f32], hd: usize, n: usize, e: &[f32], grew: &[u8], l: usize) {
    assert!(acc.len() == 64 && n > 0 && vf.len() >= (n - 1) * hd + 64);
    assert!(e.len() >= n * 8 && grew.len() >= n && l < 8);
    let mut a = [_mm256_setzero_ps(); 8];
    for (i, x) in a.iter_mut().enumerate() {
        // SAFETY: 8 i + 8 <= 64 = acc.len().
        *x = unsafe { _mm256_loadu_ps(acc.as_ptr().add(8 * i)) };
    }
    for j in 0..n {
        let ex = e[j * 8 + l];
        let vs = if grew[j] >> l & 1 != 0 {
            let f = _mm256_set1_ps(ex);
            for y in a.iter_mut() {
                *y = round_ph(_mm256_mul_ps(*y, f));
            }
            1f32
        } else {
            ex
        };
        let f = _mm256_set1_ps(vs);
        for (i, y) in a.iter_mut().enumerate() {
            // SAFETY: j hd + 8 i + 8 <= (n - 1) hd + 64 <= vf.len().
            let x = unsafe { _mm256_loadu_ps(vf.as_ptr().add(j * hd + 8 * i)) };
            *y = round_ph(_mm256_fmadd_ps(x, f, *y));
        }
    }
    for (i, &x) in a.iter().enumerate() {
        // SAFETY: as for the loads.
        unsafe { _mm256_storeu_ps(acc.as_mut_ptr().add(8 * i), x) };
    }
}
