//! AVX-512 VNNI tile kernels for two tiles at once (16 tokens: a decode step of 16 sequences,
//! or prefill): one weight row against the activations of two tiles, sharing what depends on
//! the weights alone (Q5_0's unpack, the permutes that spread each 4 weight bytes over the
//! token lanes, the weight scale) between the tiles. Per tile, every integer and every f32
//! operation is the one-tile kernel's of `avx512_tiles.rs` (the same `vpdpbusd` sums, the
//! block value with the same operands and order, block b into lane b % 4), so each token's
//! result keeps the scalar reference's bits. Gate: `tests/split_exact.rs` (matmuls of 12 and
//! 19 tokens on this machine run these; `tile_kernels_are_exact_on_every_isa` calls them).

use std::arch::x86_64::*;

use std::ops::Range;

use super::super::tiles::{TileAcc, TilePairFn, TileSlice, IQ_BLOCK, TILE};
use super::avx2_tiles::{check, ld, ldf, ldi, Q8_0};
use super::{f16_at, nibbles32};
use minfer_gguf::GgmlType;

/// Weight blocks unpacked per first pass of the Q5_0 kernel.
const CHUNK: usize = 32;

/// As `avx512_tiles::dot_interleaved`, for the interleaved activations `iq` of two tiles
/// against the same 32 unsigned weight bytes `u`: the permuted weights are made once.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
fn dot_interleaved2(u: __m256i, iq0: &[u8], iq1: &[u8]) -> (__m256i, __m256i) {
    let (iq0, iq1) = (&iq0[..IQ_BLOCK], &iq1[..IQ_BLOCK]);
    // The upper 256 bits of the cast are never selected.
    let u = _mm512_castsi256_si512(u);
    let perm = |p: i32| {
        let (lo, hi) = (2 * p, 2 * p + 1);
        let idx = _mm512_setr_epi32(
            lo, lo, lo, lo, lo, lo, lo, lo, hi, hi, hi, hi, hi, hi, hi, hi,
        );
        _mm512_permutexvar_epi32(idx, u)
    };
    let (w0, w1, w2, w3) = (perm(0), perm(1), perm(2), perm(3));
    let zero = _mm512_setzero_si512();
    // SAFETY: both `iq`s hold 4 pairs of groups of 64 bytes.
    let (a, c) = unsafe {
        let l = |q: &[u8], p: usize| _mm512_loadu_si512(q.as_ptr().add(64 * p).cast());
        (
            [l(iq0, 0), l(iq0, 1), l(iq0, 2), l(iq0, 3)],
            [l(iq1, 0), l(iq1, 1), l(iq1, 2), l(iq1, 3)],
        )
    };
    let x0 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, w0, a[0]), w2, a[2]);
    let y0 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, w1, a[1]), w3, a[3]);
    let x1 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, w0, c[0]), w2, c[2]);
    let y1 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, w1, c[1]), w3, c[3]);
    let half =
        |s: __m512i| _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64::<1>(s));
    (
        half(_mm512_add_epi32(x0, y0)),
        half(_mm512_add_epi32(x1, y1)),
    )
}

/// `avx2_tiles::walk` for two tiles: block b's two values into lane b % 4 of each tile's
/// state, blocks in order.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn walk2(
    range: Range<usize>,
    states: &mut [TileAcc; 2],
    mut value: impl FnMut(usize) -> (__m256, __m256),
) {
    // SAFETY: each lane row holds 8 f32.
    let load = |s: &TileAcc, l: usize| unsafe { _mm256_loadu_ps(s[l].as_ptr()) };
    let (s0, s1) = (&states[0], &states[1]);
    let (mut a0, mut a1, mut a2, mut a3) = (load(s0, 0), load(s0, 1), load(s0, 2), load(s0, 3));
    let (mut b0, mut b1, mut b2, mut b3) = (load(s1, 0), load(s1, 1), load(s1, 2), load(s1, 3));
    for b in range {
        let (va, vb) = value(b);
        match b % 4 {
            0 => (a0, b0) = (_mm256_add_ps(a0, va), _mm256_add_ps(b0, vb)),
            1 => (a1, b1) = (_mm256_add_ps(a1, va), _mm256_add_ps(b1, vb)),
            2 => (a2, b2) = (_mm256_add_ps(a2, va), _mm256_add_ps(b2, vb)),
            _ => (a3, b3) = (_mm256_add_ps(a3, va), _mm256_add_ps(b3, vb)),
        }
    }
    let lanes = [[a0, a1, a2, a3], [b0, b1, b2, b3]];
    for t in 0..2 {
        for l in 0..4 {
            // SAFETY: each lane row holds 8 f32.
            unsafe { _mm256_storeu_ps(states[t][l].as_mut_ptr(), lanes[t][l]) };
        }
    }
}

/// Q5_0 weights, two tiles: `avx512_tiles::tile_q5_0`'s arithmetic per tile.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
unsafe fn tile2_q5_0(
    w: &[u8],
    acts: [&[u8]; 2],
    arb: usize,
    side: [TileSlice; 2],
    range: Range<usize>,
    states: &mut [TileAcc; 2],
) {
    for (a, s) in acts.iter().zip(&side) {
        check(w, a, arb, *s, [22, Q8_0, 1, 1], &range);
        assert!(
            s.iq.len() >= w.len() / 22 * IQ_BLOCK,
            "tile kernel: no interleaved quants"
        );
    }
    let [side0, side1] = side;
    let mut q5 = [[0u8; 32]; CHUNK];
    let mut dw = [0f32; CHUNK];
    for c0 in range.clone().step_by(CHUNK) {
        let chunk = c0..(c0 + CHUNK).min(range.end);
        for ((b, q5), dw) in chunk.clone().zip(q5.iter_mut()).zip(dw.iter_mut()) {
            let wb = &w[b * 22..][..22];
            *dw = f16_at(wb, 0);
            let qh = u32::from_le_bytes([wb[2], wb[3], wb[4], wb[5]]);
            let low = nibbles32(&wb[6..]);
            let v = _mm256_mask_add_epi8(low, qh, low, _mm256_set1_epi8(16));
            // SAFETY: `q5` is 32 bytes.
            unsafe { _mm256_storeu_si256(q5.as_mut_ptr().cast(), v) };
        }
        walk2(chunk, states, |b| {
            let i = b - c0;
            let (s0, s1) = dot_interleaved2(
                // SAFETY: `q5[i]` is 32 bytes.
                unsafe { ld(q5[i].as_ptr()) },
                &side0.iq[b * IQ_BLOCK..],
                &side1.iq[b * IQ_BLOCK..],
            );
            let dwv = _mm256_broadcast_ss(&dw[i]);
            let value = |s: __m256i, side: &TileSlice| {
                let s = _mm256_sub_epi32(s, _mm256_slli_epi32::<4>(ldi(side.is, b * TILE)));
                let dd = _mm256_mul_ps(dwv, ldf(side.fs, b * TILE));
                _mm256_mul_ps(dd, _mm256_cvtepi32_ps(s))
            };
            (value(s0, &side0), value(s1, &side1))
        });
    }
}

/// Q8_0 weights, two tiles: `avx512_tiles::tile_q8_0`'s arithmetic per tile.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
unsafe fn tile2_q8_0(
    w: &[u8],
    acts: [&[u8]; 2],
    arb: usize,
    side: [TileSlice; 2],
    range: Range<usize>,
    states: &mut [TileAcc; 2],
) {
    for (a, s) in acts.iter().zip(&side) {
        check(w, a, arb, *s, [34, Q8_0, 1, 1], &range);
        assert!(
            s.iq.len() >= w.len() / 34 * IQ_BLOCK,
            "tile kernel: no interleaved quants"
        );
    }
    let [side0, side1] = side;
    walk2(range, states, |b| {
        let wb = &w[b * 34..][..34];
        // SAFETY: `wb` has 34 bytes, quants at 2..34.
        let q = unsafe { ld(wb.as_ptr().add(2)) };
        let u = _mm256_xor_si256(q, _mm256_set1_epi8(-128));
        let (s0, s1) = dot_interleaved2(u, &side0.iq[b * IQ_BLOCK..], &side1.iq[b * IQ_BLOCK..]);
        let dwv = _mm256_set1_ps(f16_at(wb, 0));
        let value = |s: __m256i, side: &TileSlice| {
            let s = _mm256_sub_epi32(s, _mm256_slli_epi32::<7>(ldi(side.is, b * TILE)));
            let dd = _mm256_mul_ps(dwv, ldf(side.fs, b * TILE));
            _mm256_mul_ps(_mm256_cvtepi32_ps(s), dd)
        };
        (value(s0, &side0), value(s1, &side1))
    });
}

fn safe_q5_0(
    w: &[u8],
    acts: [&[u8]; 2],
    arb: usize,
    side: [TileSlice; 2],
    range: Range<usize>,
    states: &mut [TileAcc; 2],
) {
    // SAFETY: only handed out by `avx512_tile_pair` after `avx512_supported()` held.
    unsafe { tile2_q5_0(w, acts, arb, side, range, states) }
}

fn safe_q8_0(
    w: &[u8],
    acts: [&[u8]; 2],
    arb: usize,
    side: [TileSlice; 2],
    range: Range<usize>,
    states: &mut [TileAcc; 2],
) {
    // SAFETY: as `safe_q5_0`.
    unsafe { tile2_q8_0(w, acts, arb, side, range, states) }
}

/// The AVX-512 VNNI two-tile kernel for weights of `ty`, where one exists.
pub(in crate::simd) fn avx512_tile_pair(ty: GgmlType) -> Option<TilePairFn> {
    if !super::avx512_supported() {
        return None;
    }
    Some(match ty {
        GgmlType::Q5_0 => safe_q5_0,
        GgmlType::Q8_0 => safe_q8_0,
        GgmlType::Q4K => super::avx512_q4k_tile::safe2_q4_k,
        _ => return None,
    })
}
