//! The AVX-512 VNNI Q4_K tile kernel: one Q4_K weight row against the 8 Q8_K activation rows
//! of a tile (the contract is `simd/tiles.rs`'s), on activations interleaved by 8
//! (`TileSlice::iq`, [`IQ8K_BLOCK`] bytes per super-block: one 64-byte load holds the same 8
//! elements of all 8 tokens, i32 lane 2t + h = elements 4h..4h + 4 of the run for token t).
//!
//! Integer part, exact: each 32 quant bytes (two sub-blocks) are loaded into both 256-bit
//! halves of a vector and split into nibbles; each run of 8 weights, broadcast by an
//! in-register `vpermq` (a broadcast load from memory would take a second load slot per
//! `vpdpbusd`, and one 64-byte load per cycle is the bound), meets the interleaved
//! activations in one `vpdpbusd`, so i32 lane 2t + h adds token t's 4 products with no
//! horizontal reduction.
//! The 4 runs of a 32-element sub-block add into one vector whose lanes are at most
//! 16 · 15 · 128 = 30720 in magnitude: an i16, sign-extended. `vpdpwssd` with the sub-block's
//! scale in the low i16 of every i32 lane (0 in the high one) then adds lane · scale exactly
//! (the high i16, all sign bits, meets 0). The two lanes of a token are added at the end.
//! The mins' term Σ_j bsum_j · mn_{j/2} is Σ_s S_s · mn_s over the sub-block sums S_s that
//! [`crate::simd::TileSide::fill`] keeps two per i32 (checked against the stored block
//! sums there): one `vpmaddwd` per two pairs of sub-blocks, with the mins alike paired.
//!
//! The float part is the reference's (`quants::kquants::dot_scale_min`) for 8 tokens at once,
//! one token per lane, never fused: (d_w · d_a) · isum - (dmin_w · d_a) · msum, each super-block
//! added into block lane b % 4 ([`walk`]).
//!
//! Against the `vpmaddubsw` + `vpdpwssd` form this replaces (two instructions per 64 products
//! of one token, then a transpose of 8 vectors per super-block), it issues one `vpdpbusd` per
//! 64 products and one `vpdpwssd` per 256.
//!
//! Gate: `tests/split_exact.rs` (`tile_kernels_are_exact_on_every_isa` calls this kernel over
//! one range and uneven ones; the matmul test runs it through the driver).

use std::arch::x86_64::*;

use std::ops::Range;

use super::super::tiles::{TileAcc, TileSlice, IQ8K_BLOCK, TILE};
use super::avx2_tiles::{check, ld, ldf, walk, Q8K};
use super::avx512_kquants::scales_mins_k4;
use super::avx512_tile_pairs::walk2;
use super::f16_at;

/// Bytes of one Q4_K block: d f16, dmin f16, scales[12], qs[128].
const Q4K: usize = 144;

/// Run `q` (0..4, 8 bytes) of each 256-bit half of `v`, broadcast over its half.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
fn run_of(v: __m512i, q: usize) -> __m512i {
    match q {
        0 => _mm512_permutex_epi64::<0x00>(v),
        1 => _mm512_permutex_epi64::<0x55>(v),
        2 => _mm512_permutex_epi64::<0xaa>(v),
        _ => _mm512_permutex_epi64::<0xff>(v),
    }
}

/// isums of super-block `wb` (144 bytes) with scales `sc` (scale s in byte s) against the
/// interleaved activations `iq[n]` (one [`IQ8K_BLOCK`]) of each of `N` tiles: lane t of
/// result n = Σ_s sc_s · Σ_{i in s} q_i · a_{n,t,i}, exact (|isum| <= 8 · 63 · 30720 < 2^31).
/// What depends on the weights alone (nibbles, run broadcasts, scale vectors) is made once.
///
/// Per pair of sub-blocks (2j, 2j + 1): `part` lane 2t + h holds token t's sum over half h
/// of each run (an i16, module docs); `packs` puts, per 128-bit lane L, the i16 of lanes
/// 4L..4L + 4 of sub-block 2j then those of 2j + 1 (no saturation: exact), and one
/// `vpdpwssd` against [sc_2j × 4, sc_2j+1 × 4] adds, per 128-bit lane, token 2L's and
/// 2L + 1's scaled sums of sub-block 2j into i32 lanes 0 and 1, of 2j + 1 into lanes 2 and 3.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
fn isums<const N: usize>(wb: &[u8], sc: u64, iq: [&[u8]; N]) -> [__m256i; N] {
    let wb = &wb[..Q4K];
    for q in iq {
        assert!(
            q.len() >= IQ8K_BLOCK,
            "tile kernel: short interleaved block"
        );
    }
    let iq: [*const u8; N] = std::array::from_fn(|n| iq[n].as_ptr());
    let m4 = _mm512_set1_epi8(0x0f);
    let zero = _mm512_setzero_si512();
    // The 8 scales as i16 in the low 128 bits; pair j spread as [sc_2j × 4, sc_2j+1 × 4] over
    // every 128-bit lane.
    let sc16 = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc as i64)));
    let mut acc = [zero; N];
    for j in 0..4 {
        let idx: [i16; 32] = std::array::from_fn(|i| (2 * j + (i % 8) / 4) as i16);
        // SAFETY: `idx` is 64 readable bytes.
        let idx = unsafe { _mm512_loadu_si512(idx.as_ptr().cast()) };
        let scales = _mm512_permutexvar_epi16(idx, sc16);
        // qs[32j..32j + 32] in both 256-bit halves: sub-block 2j in the low nibbles, 2j + 1
        // in the high ones, each sub-block's 4 runs of 8 in the 4 qwords of a half.
        // SAFETY: `wb` has 144 bytes; qs[32j..32j + 32] at 16 + 32j.
        let q = unsafe { _mm512_broadcast_i64x4(ld(wb.as_ptr().add(16 + 32 * j))) };
        let halves = [
            _mm512_and_si512(q, m4),
            _mm512_and_si512(_mm512_srli_epi16::<4>(q), m4),
        ];
        let mut part = [[zero; 2]; N];
        for (h, quants) in halves.into_iter().enumerate() {
            for c in 0..4 {
                let r = 8 * j + 4 * h + c;
                let w = run_of(quants, c);
                for n in 0..N {
                    // SAFETY: r < 32: the 64 bytes at 64r lie within the block (asserted).
                    let a = unsafe { _mm512_loadu_si512(iq[n].add(64 * r).cast()) };
                    // Lanes at most 4 runs · 4 · 15 · 128 = 30720: an i16.
                    part[n][h] = _mm512_dpbusd_epi32(part[n][h], w, a);
                }
            }
        }
        for n in 0..N {
            let packed = _mm512_packs_epi32(part[n][0], part[n][1]);
            acc[n] = _mm512_dpwssd_epi32(acc[n], packed, scales);
        }
    }
    // Per 128-bit lane L: lanes 0 + 2 are token 2L, 1 + 3 token 2L + 1; then lanes 0, 1 of
    // every 128-bit lane gathered into the low 256 bits.
    let gather = _mm512_setr_epi32(0, 1, 4, 5, 8, 9, 12, 13, 0, 0, 0, 0, 0, 0, 0, 0);
    acc.map(|v| {
        let v = _mm512_add_epi32(v, _mm512_shuffle_epi32::<0b01_00_11_10>(v));
        _mm512_castsi512_si256(_mm512_permutexvar_epi32(gather, v))
    })
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
fn msum8(mn: u64, is: &[i32]) -> __m256i {
    let is = &is[..4 * TILE];
    let pair = |p: usize| {
        let lo = (mn >> (16 * p)) as u8 as i32;
        let hi = (mn >> (16 * p + 8)) as u8 as i32;
        lo | hi << 16
    };
    // Facts 0 and 1 in one vector, 2 and 3 in the other; each half gets its pair of mins.
    let m01 = _mm512_inserti64x4::<1>(_mm512_set1_epi32(pair(0)), _mm256_set1_epi32(pair(1)));
    let m23 = _mm512_inserti64x4::<1>(_mm512_set1_epi32(pair(2)), _mm256_set1_epi32(pair(3)));
    // SAFETY: `is` holds 32 i32: two loads of 16.
    let (f01, f23) = unsafe {
        (
            _mm512_loadu_si512(is.as_ptr().cast()),
            _mm512_loadu_si512(is.as_ptr().add(2 * TILE).cast()),
        )
    };
    let s = _mm512_add_epi32(_mm512_madd_epi16(f01, m01), _mm512_madd_epi16(f23, m23));
    _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64::<1>(s))
}

/// The checks of one tile: lengths (`check`) and the interleaved quants.
fn check_q4k(w: &[u8], acts: &[u8], arb: usize, side: TileSlice, range: &Range<usize>) {
    check(w, acts, arb, side, [Q4K, Q8K, 1, 4], range);
    assert!(
        side.iq.len() >= w.len() / Q4K * IQ8K_BLOCK,
        "tile kernel: no interleaved Q8_K quants"
    );
}

/// Block b's value for one tile from its isum: the reference's float expression, one token
/// per lane: (d_w · d_a) · isum - (dmin_w · d_a) · msum.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
fn value(wb: &[u8], mn: u64, isum: __m256i, side: &TileSlice, b: usize) -> __m256 {
    let isum = _mm256_cvtepi32_ps(isum);
    let msum = _mm256_cvtepi32_ps(msum8(mn, &side.is[b * 4 * TILE..]));
    let ad = ldf(side.fs, b * TILE);
    let d = _mm256_mul_ps(_mm256_set1_ps(f16_at(wb, 0)), ad);
    let dmin = _mm256_mul_ps(_mm256_set1_ps(f16_at(wb, 2)), ad);
    _mm256_sub_ps(_mm256_mul_ps(d, isum), _mm256_mul_ps(dmin, msum))
}

/// Q4_K weights against a tile of Q8_K activations (module docs).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
unsafe fn tile_q4_k(
    w: &[u8],
    acts: &[u8],
    arb: usize,
    side: TileSlice,
    range: Range<usize>,
    state: &mut TileAcc,
) {
    check_q4k(w, acts, arb, side, &range);
    walk(range, state, |b| {
        let wb = &w[b * Q4K..][..Q4K];
        let (sc, mn) = scales_mins_k4(&wb[4..16]);
        let [isum] = isums(wb, sc, [&side.iq[b * IQ8K_BLOCK..]]);
        value(wb, mn, isum, &side, b)
    });
}

/// Q4_K weights against two tiles: per tile the arithmetic of [`tile_q4_k`] (the same
/// integers, the same float expression), the weights' nibbles, run broadcasts and scale
/// vectors made once for both.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
unsafe fn tile2_q4_k(
    w: &[u8],
    acts: [&[u8]; 2],
    arb: usize,
    side: [TileSlice; 2],
    range: Range<usize>,
    states: &mut [TileAcc; 2],
) {
    for (a, s) in acts.iter().zip(&side) {
        check_q4k(w, a, arb, *s, &range);
    }
    let [s0, s1] = side;
    walk2(range, states, |b| {
        let wb = &w[b * Q4K..][..Q4K];
        let (sc, mn) = scales_mins_k4(&wb[4..16]);
        let blk = b * IQ8K_BLOCK;
        let [i0, i1] = isums(wb, sc, [&s0.iq[blk..], &s1.iq[blk..]]);
        (value(wb, mn, i0, &s0, b), value(wb, mn, i1, &s1, b))
    });
}

/// The safe two-tile entry point ([`crate::simd::TilePairFn`]); handed out only by
/// `avx512_tile_pair` after `avx512_supported()` returned true.
pub(super) fn safe2_q4_k(
    w: &[u8],
    acts: [&[u8]; 2],
    arb: usize,
    side: [TileSlice; 2],
    range: Range<usize>,
    states: &mut [TileAcc; 2],
) {
    // SAFETY: see the doc: the CPU supports the kernel's instruction set.
    unsafe { tile2_q4_k(w, acts, arb, side, range, states) }
}

/// The safe entry point ([`crate::simd::TileFn`]); handed out only by `avx512_tile` after
/// `avx512_supported()` returned true. The kernel checks every length it reads through.
pub(super) fn safe_q4_k(
    w: &[u8],
    acts: &[u8],
    arb: usize,
    side: TileSlice,
    range: Range<usize>,
    state: &mut TileAcc,
) {
    // SAFETY: see the doc: the CPU supports the kernel's instruction set.
    unsafe { tile_q4_k(w, acts, arb, side, range, state) }
}
