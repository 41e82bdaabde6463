//! AVX-512 VNNI tile kernels: one weight row against 8 activation rows (the contract is
//! `simd/tiles.rs`'s; the AVX2 kernels of `avx2_tiles.rs` have the same shape). What VNNI
//! changes is the integer part only; every f32 operation is the AVX2 tile's (the reference's
//! block expression, one token per lane, never fused), and blocks add into the 4 block lanes
//! through the same [`walk`].
//!
//! - Q5_0 and Q8_0 weights read the tile's activations interleaved by 4 (`TileSlice::iq`:
//!   one 32-byte load holds the same 4 elements of all 8 tokens). Each 4 unsigned weight
//!   bytes, broadcast, meet them in one `vpdpbusd`, whose i32 lane t adds token t's 4
//!   products: no horizontal reduction, no i16 intermediate. Q5_0's quants are unsigned
//!   already (q5 = q + 16, 0..=31); Q8_0's are biased by 128 (w ^ 0x80 = w + 128) and the
//!   bias is taken back with the block sums of the side table:
//!   Σ w·a = Σ (w + 128)·a - 128·Σ a, exact in i32 (|Σ (w + 128)·a| <= 32·255·128), for
//!   any weight byte (-128 included) and any activation.
//! - Q6_K weights (Q8_K activations, 16-element sub-block scales) keep the AVX2 form,
//!   `vpmaddubsw` pairs times the scale, with `vpdpwssd` doing the scale multiply and the
//!   accumulation in one instruction (the same i32 integers as `madd` + `add`).
//! - Q4_K weights read the Q8_K activations interleaved by 8: `avx512_q4k_tile.rs`.
//!
//! Gate: `tests/split_exact.rs` (matmul on this machine's instruction set, and
//! `tile_kernels_are_exact_on_every_isa`, which calls the tile of each instruction set).

use std::arch::x86_64::*;

use std::ops::Range;

use super::super::tiles::{TileAcc, TileFn, TileSlice, IQ_BLOCK, TILE};
use super::avx2_tiles::{check, ld, ldf, ldi, sum8, walk, Q8K, Q8_0};
use super::{f16_at, load16, nibbles32};
use minfer_gguf::GgmlType;

/// Weight blocks unpacked per first pass of the Q5_0 kernel.
const CHUNK: usize = 32;

/// Σ over the block's 8 groups of 4 elements of `vpdpbusd(weights of group g broadcast,
/// interleaved activations of group g)`: lane t = Σ u·a of token t over the block, exact
/// (|lane| <= 32·255·128). `u`: the block's 32 unsigned weight bytes (8 four-byte words);
/// `iq`: the block's interleaved activations. Two groups per 512-bit vector: one 64-byte
/// load holds groups 2p and 2p + 1 of all 8 tokens, and one permute puts word 2p of `u` in
/// the low 8 lanes, word 2p + 1 in the high 8; the halves are added at the end.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
fn dot_interleaved(u: __m256i, iq: &[u8]) -> __m256i {
    let iq = &iq[..IQ_BLOCK];
    // The upper 256 bits of the cast are never selected.
    let u = _mm512_castsi256_si512(u);
    let pair = |p: i32| {
        let (lo, hi) = (2 * p, 2 * p + 1);
        let idx = _mm512_setr_epi32(
            lo, lo, lo, lo, lo, lo, lo, lo, hi, hi, hi, hi, hi, hi, hi, hi,
        );
        let w = _mm512_permutexvar_epi32(idx, u);
        // SAFETY: `iq` holds 4 pairs of groups of 64 bytes.
        let a = unsafe { _mm512_loadu_si512(iq.as_ptr().add(64 * p as usize).cast()) };
        (w, a)
    };
    let zero = _mm512_setzero_si512();
    let (w0, a0) = pair(0);
    let (w1, a1) = pair(1);
    let (w2, a2) = pair(2);
    let (w3, a3) = pair(3);
    let x = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, w0, a0), w2, a2);
    let y = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, w1, a1), w3, a3);
    let s = _mm512_add_epi32(x, y);
    _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64::<1>(s))
}

/// Q5_0 weights: q = q5 - 16, so Σ q·a = Σ q5·a - 16·Σ a; the block value is
/// (d_w · d_a) · s, as in the AVX2 tile.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
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
    // The row's quants are unpacked into `q5` by a first pass over a chunk of blocks (as in
    // the AVX2 tile; unpacking in the block loop measured 8 % slower here, where it is 4 %
    // faster for Q8_0, whose unpack is one `xor`).
    let mut q5 = [[0u8; 32]; CHUNK];
    let mut dw = [0f32; CHUNK];
    for c0 in range.clone().step_by(CHUNK) {
        let chunk = c0..(c0 + CHUNK).min(range.end);
        for ((b, q5), dw) in chunk.clone().zip(q5.iter_mut()).zip(dw.iter_mut()) {
            let wb = &w[b * 22..][..22];
            *dw = f16_at(wb, 0);
            let qh = u32::from_le_bytes([wb[2], wb[3], wb[4], wb[5]]);
            let low = nibbles32(&wb[6..]);
            // The 5th bit: +16 on the elements whose bit of qh is set (low nibbles <= 15).
            let v = _mm256_mask_add_epi8(low, qh, low, _mm256_set1_epi8(16));
            // SAFETY: `q5` is 32 bytes.
            unsafe { _mm256_storeu_si256(q5.as_mut_ptr().cast(), v) };
        }
        walk(chunk, state, |b| {
            let i = b - c0;
            let s = _mm256_sub_epi32(
                dot_interleaved(
                    // SAFETY: `q5[i]` is 32 bytes.
                    unsafe { ld(q5[i].as_ptr()) },
                    &side.iq[b * IQ_BLOCK..],
                ),
                _mm256_slli_epi32::<4>(ldi(side.is, b * TILE)),
            );
            let dd = _mm256_mul_ps(_mm256_broadcast_ss(&dw[i]), ldf(side.fs, b * TILE));
            _mm256_mul_ps(dd, _mm256_cvtepi32_ps(s))
        });
    }
}

/// Q4_0 weights: u = q + 8 (the nibbles), Σ q·a = Σ u·a - 8·Σ a; the block value is
/// (s · d_w) · d_a, the reference's order (not Q5_0's).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
unsafe fn tile_q4_0(
    w: &[u8],
    acts: &[u8],
    arb: usize,
    side: TileSlice,
    range: Range<usize>,
    state: &mut TileAcc,
) {
    check(w, acts, arb, side, [18, Q8_0, 1, 1], &range);
    assert!(
        side.iq.len() >= w.len() / 18 * IQ_BLOCK,
        "tile kernel: no interleaved quants"
    );
    walk(range, state, |b| {
        let wb = &w[b * 18..][..18];
        let s = _mm256_sub_epi32(
            dot_interleaved(nibbles32(&wb[2..]), &side.iq[b * IQ_BLOCK..]),
            _mm256_slli_epi32::<3>(ldi(side.is, b * TILE)),
        );
        let sd = _mm256_mul_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(f16_at(wb, 0)));
        _mm256_mul_ps(sd, ldf(side.fs, b * TILE))
    });
}

/// Q8_0 weights (any byte, -128 included): biased to w + 128, Σ w·a = Σ (w + 128)·a -
/// 128·Σ a; the block value is s · (d_w · d_a), as in the AVX2 tile.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
unsafe fn tile_q8_0(
    w: &[u8],
    acts: &[u8],
    arb: usize,
    side: TileSlice,
    range: Range<usize>,
    state: &mut TileAcc,
) {
    check(w, acts, arb, side, [34, Q8_0, 1, 1], &range);
    assert!(
        side.iq.len() >= w.len() / 34 * IQ_BLOCK,
        "tile kernel: no interleaved quants"
    );
    walk(range, state, |b| {
        let wb = &w[b * 34..][..34];
        // SAFETY: `wb` has 34 bytes, quants at 2..34.
        let q = unsafe { ld(wb.as_ptr().add(2)) };
        let u = _mm256_xor_si256(q, _mm256_set1_epi8(-128));
        let s = _mm256_sub_epi32(
            dot_interleaved(u, &side.iq[b * IQ_BLOCK..]),
            _mm256_slli_epi32::<7>(ldi(side.is, b * TILE)),
        );
        let dd = _mm256_mul_ps(_mm256_set1_ps(f16_at(wb, 0)), ldf(side.fs, b * TILE));
        _mm256_mul_ps(_mm256_cvtepi32_ps(s), dd)
    });
}

/// Q6_K weights, as the AVX2 tile: q = q6 - 32, per 16-element sub-block
/// Σ q·a = Σ q6·a - 32 · bsum (`TileSide::fill` checks the block sums); the value
/// (d_w · d_a) · isum.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
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
        let sc512 = _mm512_castsi256_si512(sc16);
        let mut isum = [_mm512_setzero_si512(); TILE];
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
            // Chunk i: 32 elements, the quants of sub-blocks 8h + 2i and 8h + 2i + 1.
            let q6: [__m256i; 4] = std::array::from_fn(|i| {
                let high =
                    _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * i as i32)), m2);
                _mm256_or_si256(lows[i], _mm256_slli_epi16::<4>(high))
            });
            for pair in 0..2 {
                // Chunks 2·pair and 2·pair + 1 in one vector; 128-bit lane l holds sub-block
                // s + l, whose scale the permute spreads over the lane's 8 words.
                let q =
                    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(q6[2 * pair]), q6[2 * pair + 1]);
                let s = 8 * h + 4 * pair;
                let idx: [i16; 32] = std::array::from_fn(|i| (s + i / 8) as i16);
                // SAFETY: `idx` is 64 bytes.
                let idx = unsafe { _mm512_loadu_si512(idx.as_ptr().cast()) };
                let sc = _mm512_permutexvar_epi16(idx, sc512);
                for (t, isum) in isum.iter_mut().enumerate() {
                    let off = t * arb + b * Q8K + 4 + 128 * h + 64 * pair;
                    // SAFETY: `check`: quants at 4..260 of each super-block.
                    let a = unsafe { _mm512_loadu_si512(acts.as_ptr().add(off).cast()) };
                    // q6·a pairs: at most 2·63·128, no saturation.
                    *isum = _mm512_dpwssd_epi32(*isum, _mm512_maddubs_epi16(q, a), sc);
                }
            }
        }
        let isum: [__m256i; TILE] = std::array::from_fn(|t| {
            let v = isum[t];
            let v = _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64::<1>(v));
            // SAFETY: `check`: block sums at 260..292 of each super-block.
            let bs = unsafe { ld(acts.as_ptr().add(t * arb + b * Q8K + 260)) };
            let corr = _mm256_slli_epi32::<5>(_mm256_madd_epi16(bs, sc16));
            _mm256_sub_epi32(v, corr)
        });
        let isum = _mm256_cvtepi32_ps(sum8(isum));
        let d = _mm256_mul_ps(_mm256_set1_ps(f16_at(wb, 208)), ldf(side.fs, b * TILE));
        _mm256_mul_ps(d, isum)
    });
}

tile_wrappers! {
    safe_q4_0 => tile_q4_0,
    safe_q5_0 => tile_q5_0,
    safe_q8_0 => tile_q8_0,
    safe_q6_k => tile_q6_k,
}

/// The AVX-512 VNNI tile kernel for weights of `ty`, where one exists (the AVX2 tile serves
/// the other types on AVX-512 machines).
pub(in crate::simd) fn avx512_tile(ty: GgmlType) -> Option<TileFn> {
    if !super::avx512_supported() {
        return None;
    }
    Some(match ty {
        GgmlType::Q4_0 => safe_q4_0,
        GgmlType::Q5_0 => safe_q5_0,
        GgmlType::Q8_0 => safe_q8_0,
        GgmlType::Q4K => super::avx512_q4k_tile::safe_q4_k,
        GgmlType::Q6K => safe_q6_k,
        _ => return None,
    })
}
