//! AVX2 tile kernels: one weight row against 8 activation rows (see `simd/tiles.rs` for the
//! contract). Per block: the weight quants are unpacked once, each token's exact integer sum
//! is reduced into lane t of one i32 vector ([`sum8`]; Q5_0 reads activations interleaved by
//! 4, whose `maddubs` lanes are per token already), and the reference's f32 block expression
//! runs once for all 8 tokens with one token per lane.

use std::arch::x86_64::*;

use std::ops::Range;

use super::super::tiles::{TileAcc, TileFn, TileSlice, IQ_BLOCK, TILE};
use super::{f16_at, load16, nibbles32};
use minfer_gguf::GgmlType;

pub(super) const Q8_0: usize = 34;
const Q8_1: usize = 36;
pub(super) const Q8K: usize = 292;

/// Lane t = Σ of the 8 i32 lanes of `v[t]` (exact: the sums it is used for never wrap).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn sum8(v: [__m256i; TILE]) -> __m256i {
    let h01 = _mm256_hadd_epi32(v[0], v[1]);
    let h23 = _mm256_hadd_epi32(v[2], v[3]);
    let h45 = _mm256_hadd_epi32(v[4], v[5]);
    let h67 = _mm256_hadd_epi32(v[6], v[7]);
    // a: lanes 0..4 = low-half sums of v0..v3, lanes 4..8 = their high-half sums; b: v4..v7.
    let a = _mm256_hadd_epi32(h01, h23);
    let b = _mm256_hadd_epi32(h45, h67);
    _mm256_add_epi32(
        _mm256_permute2x128_si256::<0x20>(a, b),
        _mm256_permute2x128_si256::<0x31>(a, b),
    )
}

/// Lane t = Σ of the 16 i16 lanes of `p[t]`, for `maddubs` results whose lanes are at most
/// 8191 in magnitude (so that sums of 4 lanes fit i16: every partial sum here is exact).
/// Cheaper than widening each to i32 first: 2 `madd`s instead of 8.
#[inline]
#[target_feature(enable = "avx2")]
fn sum8_small(p: [__m256i; TILE]) -> __m256i {
    // Per 128-bit half: 4 sums of 2 lanes of p[2i], then of p[2i + 1].
    let h01 = _mm256_hadd_epi16(p[0], p[1]);
    let h23 = _mm256_hadd_epi16(p[2], p[3]);
    let h45 = _mm256_hadd_epi16(p[4], p[5]);
    let h67 = _mm256_hadd_epi16(p[6], p[7]);
    // Per half: 2 sums of 4 lanes for each of p0..p3 (p4..p7), then i32 per token and half.
    let ones = _mm256_set1_epi16(1);
    let a = _mm256_madd_epi16(_mm256_hadd_epi16(h01, h23), ones);
    let b = _mm256_madd_epi16(_mm256_hadd_epi16(h45, h67), ones);
    _mm256_add_epi32(
        _mm256_permute2x128_si256::<0x20>(a, b),
        _mm256_permute2x128_si256::<0x31>(a, b),
    )
}

/// 32 bytes at `p` (caller guarantees 32 readable bytes).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn ld(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees 32 readable bytes; loadu has no alignment requirement.
    unsafe { _mm256_loadu_si256(p.cast()) }
}

/// 8 f32 at `fs[i..i + 8]` (bounds-checked).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn ldf(fs: &[f32], i: usize) -> __m256 {
    let s = &fs[i..i + TILE];
    // SAFETY: `s` has 8 readable f32.
    unsafe { _mm256_loadu_ps(s.as_ptr()) }
}

/// 8 i32 at `is[i..i + 8]` (bounds-checked).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn ldi(is: &[i32], i: usize) -> __m256i {
    let s = &is[i..i + TILE];
    // SAFETY: `s` has 8 readable i32.
    unsafe { _mm256_loadu_si256(s.as_ptr().cast()) }
}

/// Adds `value(b)` for every block b of `range` into lane b % 4 of `state`, the lanes kept
/// in registers (a lane array indexed by b % 4 would live in memory). Rotating the lanes
/// after each block instead of the `match` (an indirect jump per block) measured no faster.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn walk(
    range: Range<usize>,
    state: &mut TileAcc,
    mut value: impl FnMut(usize) -> __m256,
) {
    // SAFETY: each lane row holds 8 f32.
    let [mut a0, mut a1, mut a2, mut a3] = state.map(|l| unsafe { _mm256_loadu_ps(l.as_ptr()) });
    for b in range {
        let v = value(b);
        match b % 4 {
            0 => a0 = _mm256_add_ps(a0, v),
            1 => a1 = _mm256_add_ps(a1, v),
            2 => a2 = _mm256_add_ps(a2, v),
            _ => a3 = _mm256_add_ps(a3, v),
        }
    }
    for (l, a) in state.iter_mut().zip([a0, a1, a2, a3]) {
        // SAFETY: each lane row holds 8 f32.
        unsafe { _mm256_storeu_ps(l.as_mut_ptr(), a) };
    }
}

/// Checks the lengths every tile kernel relies on: whole weight blocks of `wb` bytes, 8
/// activation rows of `arb` = blocks × `ab` bytes, `nf` f32 and `ni` i32 facts per block in
/// the side table, `range` within the blocks.
pub(super) fn check(
    w: &[u8],
    acts: &[u8],
    arb: usize,
    side: TileSlice,
    [wb, ab, nf, ni]: [usize; 4],
    range: &Range<usize>,
) {
    let blocks = w.len() / wb;
    assert!(
        w.len() == blocks * wb
            && arb == blocks * ab
            && acts.len() >= TILE * arb
            && side.fs.len() >= blocks * nf * TILE
            && side.is.len() >= blocks * ni * TILE
            && range.start <= range.end
            && range.end <= blocks,
        "tile kernel: inconsistent lengths"
    );
}

/// Q5_0 weights: q = q5 - 16 with q5 in 0..=31, so Σ q·a = Σ q5·a - 16·Σ a; the block value
/// is (d_w · d_a) · s. Reads the interleaved quants (`TileSlice::iq`): each 4 weights,
/// broadcast, meet the same 4 elements of all 8 tokens in one `maddubs`, whose 32-bit lane t
/// then holds token t's two pair sums, so the sums need no horizontal reduction. Pairs are
/// at most 2·31·128 = 7936 and an i16 lane adds 4 of them (31744, exact) before `madd`
/// widens them to i32.
#[target_feature(enable = "avx2,f16c")]
unsafe fn tile_q5_0(
    w: &[u8],
    acts: &[u8],
    arb: usize,
    side: TileSlice,
    range: Range<usize>,
    state: &mut TileAcc,
) {
    check(w, acts, arb, side, [22, Q8_0, 1, 1], &range);
    assert!(
        side.iq.len() >= w.len() / 22 * IQ_BLOCK,
        "tile kernel: no interleaved quants"
    );
    let ones = _mm256_set1_epi16(1);
    // The row's quants are unpacked into `q5` by a first pass over a chunk of blocks, so that
    // the second reads each 4 of them by a broadcast load (no shuffle port) where unpacking
    // in the same pass compiles to in-register shuffles.
    const CHUNK: usize = 32;
    // f32 only as a carrier of 4 quant bytes: `broadcast_ss` moves bits, no float math.
    let mut q5 = [[0f32; 8]; CHUNK];
    let mut dw = [0f32; CHUNK];
    for c0 in range.clone().step_by(CHUNK) {
        let chunk = c0..(c0 + CHUNK).min(range.end);
        for ((b, q5), dw) in chunk.clone().zip(q5.iter_mut()).zip(dw.iter_mut()) {
            let wb = &w[b * 22..][..22];
            *dw = f16_at(wb, 0);
            let qh = u32::from_le_bytes([wb[2], wb[3], wb[4], wb[5]]);
            let high = _mm256_and_si256(super::bits_to_bytes(qh), _mm256_set1_epi8(0x10));
            let v = _mm256_or_si256(nibbles32(&wb[6..]), high);
            // SAFETY: `q5` is 32 bytes.
            unsafe { _mm256_storeu_si256(q5.as_mut_ptr().cast(), v) };
        }
        walk(chunk, state, |b| {
            let i = b - c0;
            let q5 = &q5[i];
            let iq = &side.iq[b * IQ_BLOCK..][..IQ_BLOCK];
            // SAFETY: `iq` holds 8 groups of 32 bytes.
            let group = |g: usize| unsafe { ld(iq.as_ptr().add(32 * g)) };
            // A broadcast from memory, a load with no shuffle (`set1` of a loaded value
            // compiles to a load and a register broadcast).
            let four = |g: usize| _mm256_castps_si256(_mm256_broadcast_ss(&q5[g]));
            let half = |g0: usize| {
                let p = |g: usize| _mm256_maddubs_epi16(four(g), group(g));
                let s = _mm256_add_epi16(
                    _mm256_add_epi16(p(g0), p(g0 + 1)),
                    _mm256_add_epi16(p(g0 + 2), p(g0 + 3)),
                );
                _mm256_madd_epi16(s, ones)
            };
            let s = _mm256_sub_epi32(
                _mm256_add_epi32(half(0), half(4)),
                _mm256_slli_epi32::<4>(ldi(side.is, b * TILE)),
            );
            let dd = _mm256_mul_ps(_mm256_broadcast_ss(&dw[i]), ldf(side.fs, b * TILE));
            _mm256_mul_ps(dd, _mm256_cvtepi32_ps(s))
        });
    }
}

/// Q8_0 weights (any byte, -128 included) with activations in -127..=127 (`TileSide::fill`
/// checks): |w| as the unsigned operand and w's sign moved onto a, so a pair is at most
/// 2·128·127 = 32512; the block value is s · (d_w · d_a).
#[target_feature(enable = "avx2,f16c")]
unsafe fn tile_q8_0(
    w: &[u8],
    acts: &[u8],
    arb: usize,
    side: TileSlice,
    range: Range<usize>,
    state: &mut TileAcc,
) {
    check(w, acts, arb, side, [34, Q8_0, 1, 1], &range);
    let ones = _mm256_set1_epi16(1);
    walk(range, state, |b| {
        let wb = &w[b * 34..][..34];
        // SAFETY: `wb` has 34 bytes, quants at 2..34.
        let q = unsafe { ld(wb.as_ptr().add(2)) };
        let aq = _mm256_abs_epi8(q);
        let mut p = [_mm256_setzero_si256(); TILE];
        for (t, p) in p.iter_mut().enumerate() {
            // SAFETY: `check`: row t has `blocks` blocks of 34 bytes, quants at 2..34.
            let a = unsafe { ld(acts.as_ptr().add(t * arb + b * Q8_0 + 2)) };
            *p = _mm256_madd_epi16(_mm256_maddubs_epi16(aq, _mm256_sign_epi8(a, q)), ones);
        }
        let s = _mm256_cvtepi32_ps(sum8(p));
        let dd = _mm256_mul_ps(_mm256_set1_ps(f16_at(wb, 0)), ldf(side.fs, b * TILE));
        _mm256_mul_ps(s, dd)
    });
}

/// Q4_1 weights with Q8_1 activations: nibbles (0..=15) times a; the block value is
/// (d_w · d_a) · s + m_w · s_a.
#[target_feature(enable = "avx2,f16c")]
unsafe fn tile_q4_1(
    w: &[u8],
    acts: &[u8],
    arb: usize,
    side: TileSlice,
    range: Range<usize>,
    state: &mut TileAcc,
) {
    check(w, acts, arb, side, [20, Q8_1, 2, 0], &range);
    walk(range, state, |b| {
        let wb = &w[b * 20..][..20];
        let q = nibbles32(&wb[4..]);
        let mut p = [_mm256_setzero_si256(); TILE];
        for (t, p) in p.iter_mut().enumerate() {
            // SAFETY: `check`: row t has `blocks` blocks of 36 bytes, quants at 4..36.
            let a = unsafe { ld(acts.as_ptr().add(t * arb + b * Q8_1 + 4)) };
            // Lanes at most 2·15·128 = 3840.
            *p = _mm256_maddubs_epi16(q, a);
        }
        let s = _mm256_cvtepi32_ps(sum8_small(p));
        let dd = _mm256_mul_ps(_mm256_set1_ps(f16_at(wb, 0)), ldf(side.fs, 2 * b * TILE));
        let ms = _mm256_mul_ps(
            _mm256_set1_ps(f16_at(wb, 2)),
            ldf(side.fs, (2 * b + 1) * TILE),
        );
        _mm256_add_ps(_mm256_mul_ps(dd, s), ms)
    });
}

/// Q4_K weights: per super-block, isum = Σ_s sc_s · Σ q·a and msum = Σ_j bsum_j · mn_{j/2}
/// (the stored block sums, as the reference reads them); the value is
/// (d_w · d_a) · isum - (dmin_w · d_a) · msum.
#[target_feature(enable = "avx2,f16c")]
unsafe fn tile_q4_k(
    w: &[u8],
    acts: &[u8],
    arb: usize,
    side: TileSlice,
    range: Range<usize>,
    state: &mut TileAcc,
) {
    check(w, acts, arb, side, [144, Q8K, 1, 0], &range);
    let m4 = _mm256_set1_epi8(0x0f);
    walk(range, state, |b| {
        let wb = &w[b * 144..][..144];
        let (sc, mn) = minfer_gguf::quants::unpack_scale_min_k4(&wb[4..16]);
        let mut isum = [_mm256_setzero_si256(); TILE];
        for j in 0..4 {
            // SAFETY: `wb` has 144 bytes; quants of sub-blocks 2j, 2j + 1 at 16 + 32j.
            let q = unsafe { ld(wb.as_ptr().add(16 + 32 * j)) };
            let lo = _mm256_and_si256(q, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4);
            let s_lo = _mm256_set1_epi16(sc[2 * j] as i16);
            let s_hi = _mm256_set1_epi16(sc[2 * j + 1] as i16);
            for (t, isum) in isum.iter_mut().enumerate() {
                let a = acts.as_ptr().wrapping_add(t * arb + b * Q8K + 4 + 64 * j);
                // SAFETY: `check`: row t has `blocks` super-blocks of 292 bytes, quants at 4..260.
                let (a_lo, a_hi) = unsafe { (ld(a), ld(a.add(32))) };
                // Quants are at most 15: pairs stay far below i16 saturation.
                let p_lo = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, a_lo), s_lo);
                let p_hi = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, a_hi), s_hi);
                *isum = _mm256_add_epi32(*isum, _mm256_add_epi32(p_lo, p_hi));
            }
        }
        // Each min twice: a 32-element sub-block covers two 16-element block sums.
        let mins: [i16; 16] = std::array::from_fn(|i| mn[i / 2] as i16);
        // SAFETY: `mins` is 32 bytes.
        let mins = unsafe { _mm256_loadu_si256(mins.as_ptr().cast()) };
        let mut mprod = [_mm256_setzero_si256(); TILE];
        for (t, mprod) in mprod.iter_mut().enumerate() {
            // SAFETY: `check`: block sums at 260..292 of each super-block.
            let bs = unsafe { ld(acts.as_ptr().add(t * arb + b * Q8K + 260)) };
            *mprod = _mm256_madd_epi16(bs, mins);
        }
        let isum = _mm256_cvtepi32_ps(sum8(isum));
        let msum = _mm256_cvtepi32_ps(sum8(mprod));
        let ad = ldf(side.fs, b * TILE);
        let d = _mm256_mul_ps(_mm256_set1_ps(f16_at(wb, 0)), ad);
        let dmin = _mm256_mul_ps(_mm256_set1_ps(f16_at(wb, 2)), ad);
        _mm256_sub_ps(_mm256_mul_ps(d, isum), _mm256_mul_ps(dmin, msum))
    });
}

/// Q6_K weights: q = q6 - 32 with q6 in 0..=63, so per 16-element sub-block
/// Σ q·a = Σ q6·a - 32 · bsum (the block sums equal the quants' sums: `TileSide::fill`
/// checks); isum = Σ_s sc_s · (that), the value (d_w · d_a) · isum.
#[target_feature(enable = "avx2,f16c")]
unsafe fn tile_q6_k(
    w: &[u8],
    acts: &[u8],
    arb: usize,
    side: TileSlice,
    range: Range<usize>,
    state: &mut TileAcc,
) {
    check(w, acts, arb, side, [210, Q8K, 1, 0], &range);
    let m4 = _mm256_set1_epi8(0x0f);
    let m2 = _mm256_set1_epi8(3);
    walk(range, state, |b| {
        let wb = &w[b * 210..][..210];
        let sc16 = _mm256_cvtepi8_epi16(load16(&wb[192..208]));
        let mut isum = [_mm256_setzero_si256(); TILE];
        for h in 0..2 {
            // SAFETY: `wb` has 210 bytes: ql at 0..128, qh at 128..192.
            let (ql0, ql1, qh) = unsafe {
                let p = wb.as_ptr();
                (
                    ld(p.add(64 * h)),
                    ld(p.add(64 * h + 32)),
                    ld(p.add(128 + 32 * h)),
                )
            };
            let lows = [
                _mm256_and_si256(ql0, m4),
                _mm256_and_si256(ql1, m4),
                _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4),
                _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4),
            ];
            for (i, low) in lows.into_iter().enumerate() {
                let high =
                    _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * i as i32)), m2);
                let q6 = _mm256_or_si256(low, _mm256_slli_epi16::<4>(high));
                // Sub-blocks s (elements 0..16) and s + 1 (16..32) of this chunk.
                let s = 8 * h + 2 * i;
                let sc = _mm256_set_m128i(
                    _mm_set1_epi16(wb[192 + s + 1] as i8 as i16),
                    _mm_set1_epi16(wb[192 + s] as i8 as i16),
                );
                for (t, isum) in isum.iter_mut().enumerate() {
                    let off = t * arb + b * Q8K + 4 + 128 * h + 32 * i;
                    // SAFETY: `check`: quants at 4..260 of each super-block.
                    let a = unsafe { ld(acts.as_ptr().add(off)) };
                    // q6·a pairs: at most 2·63·128, no saturation.
                    let p = _mm256_madd_epi16(_mm256_maddubs_epi16(q6, a), sc);
                    *isum = _mm256_add_epi32(*isum, p);
                }
            }
        }
        for (t, isum) in isum.iter_mut().enumerate() {
            // SAFETY: `check`: block sums at 260..292 of each super-block.
            let bs = unsafe { ld(acts.as_ptr().add(t * arb + b * Q8K + 260)) };
            let corr = _mm256_slli_epi32::<5>(_mm256_madd_epi16(bs, sc16));
            *isum = _mm256_sub_epi32(*isum, corr);
        }
        let isum = _mm256_cvtepi32_ps(sum8(isum));
        let d = _mm256_mul_ps(_mm256_set1_ps(f16_at(wb, 208)), ldf(side.fs, b * TILE));
        _mm256_mul_ps(d, isum)
    });
}

tile_wrappers! {
    safe_q5_0 => tile_q5_0,
    safe_q8_0 => tile_q8_0,
    safe_q4_1 => tile_q4_1,
    safe_q4_k => tile_q4_k,
    safe_q6_k => tile_q6_k,
}

/// The AVX2 tile kernel for weights of `ty`, where one exists.
pub(in crate::simd) fn avx2_tile(ty: GgmlType) -> Option<TileFn> {
    if !super::avx2_supported() {
        return None;
    }
    Some(match ty {
        GgmlType::Q5_0 => safe_q5_0,
        GgmlType::Q8_0 => safe_q8_0,
        GgmlType::Q4_1 => safe_q4_1,
        GgmlType::Q4K => safe_q4_k,
        GgmlType::Q6K => safe_q6_k,
        _ => return None,
    })
}
