//! `attn_f16::attend_tile`'s AVX-512 kernel: several prompt rows of one GQA group over one
//! window, each row's window a prefix of the longest, chains of (row, head) 16 to a vector;
//! every chain's operations and their order the one-row kernels' (`attn_f16_avx512`), so its
//! bits do not depend on what shares the tile (`tests/attn_f16.rs`).

use std::arch::x86_64::*;

use super::attn_f16_avx512::{load_ph, round_ph};
use super::libm_expf::expf8;
use minfer_gguf::quants::{f16_to_f32, f32_to_f16};

/// Cells a block of [`attend_tile`] widens (K and V to f32 once for every chain of the tile).
const TILE_BLOCK: usize = 16;

/// `attn_f16::attend_tile` (several query rows of one GQA group over one window, each a
/// prefix of the longest) for heads of `16 NV` (NV even: a multiple of 32), `H` chains'
/// V accumulators at a time in registers (`H NV <= 16`).
///
/// A chain is one (row, head); chain `c` is head `c / rows` of row `c % rows`, and chains
/// are laid out 16 to a vector, one per lane. Per block of [`TILE_BLOCK`] cells: the K and V
/// rows widened to f32 once; per group of 16 chains and per cell, the 16 scores at once, each
/// lane the reference's dot (`attn_f16_avx512::dot_f32`'s products, sums and fold, lane for lane: the
/// queries are transposed so that a lane holds its chain's query and the K element is
/// broadcast), times the scale; the softmax step (compare, exponential by [`expf8`] or
/// `f32::exp`, the sum's fma) in those lanes, masked to the chains whose window reaches the
/// cell; then each chain's V accumulator over the block's cells in order, [`tile_v`]. Every
/// chain's operations and their order are the reference's, so its bits are the one-row
/// kernels' whatever rows share the tile.
#[target_feature(enable = "avx512f,avx512vl,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(super) fn attend_tile<'a, const NV: usize, const H: usize>(
    q: &[&[f32]],
    lens: &[usize],
    scale: f32,
    cells: &[usize],
    k: impl Fn(usize) -> &'a [u16],
    v: impl Fn(usize) -> &'a [u16],
    out: &mut [&mut [f32]],
) {
    const { assert!(NV.is_multiple_of(2) && H * NV <= 16 && 16 % H == 0) };
    let hd = 16 * NV;
    let rows = q.len();
    assert!(rows > 0 && lens.len() == rows && out.len() == rows);
    let g = q[0].len() / hd;
    let nc = g * rows;
    let ng = nc.div_ceil(16);
    let np = ng * 16;
    let maxlen = lens.iter().copied().max().unwrap_or(0);
    assert!(cells.len() >= maxlen);
    let libm = super::libm_expf::matches_c_library();
    // Per group the transposed queries (f16-rounded, as f32): qt[(gi HD + e) 16 + lane].
    let mut qt = vec![0f32; np * hd];
    let mut clen = vec![0i32; np];
    for (c, cl) in clen.iter_mut().enumerate().take(nc) {
        let (h, r) = (c / rows, c % rows);
        let (gi, l) = (c / 16, c % 16);
        let qh = &q[r][h * hd..][..hd];
        for (e, &x) in qh.iter().enumerate() {
            qt[(gi * hd + e) * 16 + l] = f16_to_f32(f32_to_f16(x));
        }
        *cl = lens[r] as i32;
    }
    let mut m = vec![_mm512_set1_ps(f32::NEG_INFINITY); ng];
    let mut sum = vec![_mm512_setzero_ps(); ng];
    let lenv: Vec<__m512i> = clen
        .chunks_exact(16)
        // SAFETY: 16 i32 each.
        .map(|c| unsafe { _mm512_loadu_si512(c.as_ptr().cast()) })
        .collect();
    let mut acc = vec![0f32; np * hd];
    let mut kf = vec![0f32; TILE_BLOCK * hd];
    let mut vf = vec![0f32; TILE_BLOCK * hd];
    // Per group and block cell: the 16 chains' exponentials and whether their max grew.
    let mut eb = vec![0f32; ng * TILE_BLOCK * 16];
    let mut gb = vec![0u16; ng * TILE_BLOCK];
    let scale_v = _mm512_set1_ps(scale);
    let one = _mm512_set1_ps(1.0);
    for b0 in (0..maxlen).step_by(TILE_BLOCK) {
        let n = TILE_BLOCK.min(maxlen - b0);
        for (j, &cell) in cells[b0..b0 + n].iter().enumerate() {
            let (kc, vc) = (&k(cell)[..hd], &v(cell)[..hd]);
            for i in (0..hd).step_by(16) {
                // SAFETY: j < TILE_BLOCK: j hd + i + 16 <= TILE_BLOCK hd.
                unsafe {
                    _mm512_storeu_ps(kf.as_mut_ptr().add(j * hd + i), load_ph(kc, i));
                    _mm512_storeu_ps(vf.as_mut_ptr().add(j * hd + i), load_ph(vc, i));
                }
            }
        }
        for gi in 0..ng {
            let qg = &qt[gi * hd * 16..][..hd * 16];
            let (mut mv, mut sv) = (m[gi], sum[gi]);
            for j in 0..n {
                let s = _mm512_mul_ps(scores::<NV>(qg, &kf[j * hd..][..hd]), scale_v);
                let valid = _mm512_cmpgt_epi32_mask(lenv[gi], _mm512_set1_epi32((b0 + j) as i32));
                let grew = _mm512_mask_cmp_ps_mask::<_CMP_GT_OQ>(valid, s, mv);
                let arg = _mm512_mask_blend_ps(grew, _mm512_sub_ps(s, mv), _mm512_sub_ps(mv, s));
                let arg = _mm512_maskz_mov_ps(valid, arg);
                mv = _mm512_mask_blend_ps(grew, mv, s);
                let e = exp16(arg, libm);
                let ms = _mm512_mask_blend_ps(grew, one, e);
                let vs = _mm512_mask_blend_ps(grew, e, one);
                sv = _mm512_mask_mov_ps(sv, valid, _mm512_fmadd_ps(sv, ms, vs));
                // SAFETY: (gi TILE_BLOCK + j) 16 + 16 <= eb.len().
                unsafe {
                    _mm512_storeu_ps(eb.as_mut_ptr().add((gi * TILE_BLOCK + j) * 16), e);
                }
                gb[gi * TILE_BLOCK + j] = grew;
            }
            m[gi] = mv;
            sum[gi] = sv;
        }
        for c0 in (0..np).step_by(H) {
            let (gi, l0) = (c0 / 16, c0 % 16);
            let nch: [usize; H] =
                std::array::from_fn(|i| (clen[c0 + i] as usize).saturating_sub(b0).min(n));
            if nch.iter().all(|&x| x == 0) {
                continue;
            }
            tile_v::<NV, H>(
                &mut acc[c0 * hd..(c0 + H) * hd],
                &vf,
                nch,
                &eb[gi * TILE_BLOCK * 16..][..TILE_BLOCK * 16],
                &gb[gi * TILE_BLOCK..][..TILE_BLOCK],
                l0,
            );
        }
    }
    let mut sums = vec![0f32; np];
    for (s, v) in sums.chunks_exact_mut(16).zip(&sum) {
        // SAFETY: 16 writable f32.
        unsafe { _mm512_storeu_ps(s.as_mut_ptr(), *v) };
    }
    for c in 0..nc {
        let (h, r) = (c / rows, c % rows);
        let sm = sums[c];
        let inv = if sm == 0.0 { 0.0 } else { 1.0 / sm };
        for (o, &a) in out[r][h * hd..][..hd].iter_mut().zip(&acc[c * hd..][..hd]) {
            *o = a * inv;
        }
    }
}

/// 16 lanes of `expf` (`expf8` twice where it is the C library's, else `f32::exp`).
#[inline]
#[target_feature(enable = "avx512f,avx512vl,fma,f16c")]
fn exp16(x: __m512, libm: bool) -> __m512 {
    if libm {
        let lo = expf8(_mm512_castps512_ps256(x));
        let hi = expf8(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(
            _mm512_castps_pd(x),
        )));
        let lo = _mm512_castps256_ps512(lo);
        _mm512_castpd_ps(_mm512_insertf64x4::<1>(
            _mm512_castps_pd(lo),
            _mm256_castps_pd(hi),
        ))
    } else {
        let mut a = [0f32; 16];
        // SAFETY: 16 f32 each way.
        unsafe { _mm512_storeu_ps(a.as_mut_ptr(), x) };
        for x in a.iter_mut() {
            *x = x.exp();
        }
        // SAFETY: as above.
        unsafe { _mm512_loadu_ps(a.as_ptr()) }
    }
}

/// The dots of 16 chains' queries (`qg`, transposed: element e of lane l at `e 16 + l`) with
/// one K row `kr` (16 NV f32), lane for lane `attn_f16_avx512::dot_f32`: the AVX2 accumulator j's lane l
/// takes the elements 32 c + 8 j + l, c = 0, 1, ..., by fma from zero; the accumulators add
/// as (acc0 + acc2) + (acc1 + acc3); lanes l and l + 4 add; then (t0 + t1) + (t2 + t3).
#[inline]
#[target_feature(enable = "avx512f,avx512vl,fma,f16c")]
fn scores<const NV: usize>(qg: &[f32], kr: &[f32]) -> __m512 {
    let hd = 16 * NV;
    assert!(qg.len() >= hd * 16 && kr.len() >= hd);
    let (qp, kp) = (qg.as_ptr(), kr.as_ptr());
    let mut a0 = [_mm512_setzero_ps(); 8];
    for (l, a) in a0.iter_mut().enumerate() {
        let mut p = [_mm512_setzero_ps(); 4];
        for (j, p) in p.iter_mut().enumerate() {
            for c in 0..NV / 2 {
                let e = 32 * c + 8 * j + l;
                // SAFETY: e < hd: qg holds hd 16 values, kr hd.
                *p = unsafe {
                    _mm512_fmadd_ps(
                        _mm512_loadu_ps(qp.add(e * 16)),
                        _mm512_set1_ps(*kp.add(e)),
                        *p,
                    )
                };
            }
        }
        *a = _mm512_add_ps(_mm512_add_ps(p[0], p[2]), _mm512_add_ps(p[1], p[3]));
    }
    let t: [__m512; 4] = std::array::from_fn(|l| _mm512_add_ps(a0[l], a0[l + 4]));
    _mm512_add_ps(_mm512_add_ps(t[0], t[1]), _mm512_add_ps(t[2], t[3]))
}

/// H chains' V accumulators (`acc`, 16 NV each) over a block's widened V rows `vf`: chain i
/// (lane `l0 + i` of `e`/`grew`, the block's steps 16 apart) over its first `n[i]` cells,
/// each step the reference's rescale (when the max grew) and update, rounded to f16.
#[inline]
#[target_feature(enable = "avx512f,avx512vl,fma,f16c")]
fn tile_v<const NV: usize, const H: usize>(
    acc: &mut [f32],
    vf: &[f32],
    n: [usize; H],
    e: &[f32],
    grew: &[u16],
    l0: usize,
) {
    let hd = 16 * NV;
    let nmax = n.iter().copied().max().unwrap_or(0);
    assert!(acc.len() == H * hd && vf.len() >= nmax * hd && e.len() >= nmax * 16);
    assert!(grew.len() >= nmax && l0 + H <= 16);
    let mut a = [[_mm512_setzero_ps(); NV]; H];
    for (h, ah) in a.iter_mut().enumerate() {
        for (i, x) in ah.iter_mut().enumerate() {
            // SAFETY: h hd + 16 i + 16 <= H hd = acc.len().
            *x = unsafe { _mm512_loadu_ps(acc.as_ptr().add(h * hd + 16 * i)) };
        }
    }
    for j in 0..nmax {
        let mut x = [_mm512_setzero_ps(); NV];
        for (i, x) in x.iter_mut().enumerate() {
            // SAFETY: j hd + 16 i + 16 <= nmax hd <= vf.len().
            *x = unsafe { _mm512_loadu_ps(vf.as_ptr().add(j * hd + 16 * i)) };
        }
        let gj = grew[j];
        for (h, ah) in a.iter_mut().enumerate() {
            if j >= n[h] {
                continue;
            }
            let l = l0 + h;
            let ex = e[j * 16 + l];
            let vs = if gj >> l & 1 != 0 {
                let f = _mm512_set1_ps(ex);
                for y in ah.iter_mut() {
                    *y = round_ph(_mm512_mul_ps(*y, f));
                }
                1f32
            } else {
                ex
            };
            let f = _mm512_set1_ps(vs);
            for (y, &xv) in ah.iter_mut().zip(&x) {
                *y = round_ph(_mm512_fmadd_ps(xv, f, *y));
            }
        }
    }
    for (h, ah) in a.iter().enumerate() {
        for (i, &x) in ah.iter().enumerate() {
            // SAFETY: as for the loads.
            unsafe { _mm512_storeu_ps(acc.as_mut_ptr().add(h * hd + 16 * i), x) };
        }
    }
}
