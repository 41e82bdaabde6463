//! The AVX-512 VNNI Q4_K side kernel ([`crate::simd::RowSideFn`], decode): one Q8_K
//! activation row against many Q4_K weight rows, 4 rows at a time, so that what depends on
//! the activation alone is loaded once per super-block for 4 rows and the horizontal sums and
//! float part of 4 rows run as one.
//!
//! Once per call the activation row is re-laid out ([`Act`]) to match the weights' nibbles:
//! a 64-byte load of qs[64h..64h + 64] holds, in its low nibbles, the elements of sub-blocks
//! 4h and 4h + 2 and in its high nibbles those of 4h + 1 and 4h + 3, so the activations are
//! stored in that order (no shuffle of the weights per row), with the sums of the 32-element
//! sub-blocks (from the stored block sums, as the reference uses them).
//!
//! Per row and super-block, exact integers: each nibble vector meets its 64 activations in
//! one `vpdpbusd` (i32 lanes of 4 products, at most 4 · 15 · 128 = 7680: an i16); `packs`
//! joins the low- and high-nibble vectors into i16 lanes, 128-bit lane L holding 4 lanes of
//! each (no saturation), and one `vpdpwssd` against the scales spread the same way
//! ([`SPREAD`]) adds scale · pair sum into i32 lanes: Σ over the 16 lanes is isum.
//! msum = Σ_s S_s · mn_s over the sub-block sums S_s = bsum_2s + bsum_2s+1 (i32), which is
//! the reference's Σ_j bsum_j · mn_{j/2}, by one `vpmulld`. The 8 sums (isum and msum of 4 rows) are reduced by one transpose-add
//! (`sum8`). The float part is the reference's (`quants::kquants::dot_scale_min`) with one
//! row per lane, never fused: (d_w · d_a) · isum - (dmin_w · d_a) · msum, super-block b added
//! into block lane b % 4, the lanes combined as (0 + 2) + (1 + 3). Rows past the last group
//! of 4 run the single-row kernel `avx512_kquants::dot_q4_k` (the same bits).
//!
//! Gate: `tests/split_exact.rs` (`matmul_is_exact_for_every_thread_count`: decode's nt = 1 and
//! 3 run this kernel, tasks of 4-row groups and a remainder).

use std::arch::x86_64::*;

use super::avx2_tiles::sum8;
use super::avx512_dispatch::load64;
use super::avx512_kquants::{dot_q4_k, scales_mins_k4};
use super::{f32_at, side_row_bytes};

/// Bytes of one Q4_K block: d f16, dmin f16, scales[12], qs[128].
const Q4K: usize = 144;
/// Bytes of one Q8_K block: d f32, qs i8[256], bsums i16[16].
const Q8K: usize = 292;
/// Weight rows per group.
const ROWS: usize = 4;

/// i16 lane i of the scale vector for the packed sums of nibble vector h (`first` = 4h):
/// 128-bit lanes 0 and 1 hold 4 lanes of sub-block `first` then 4 of `first + 1`; lanes 2
/// and 3 of `first + 2` then `first + 3`.
const fn spread(first: usize) -> [i16; 32] {
    let mut idx = [0i16; 32];
    let mut i = 0;
    while i < 32 {
        let (lane, pos) = (i / 8, i % 8);
        idx[i] = (first + 2 * (lane >= 2) as usize + (pos >= 4) as usize) as i16;
        i += 1;
    }
    idx
}

/// The scale spreads of [`spread`] for sub-blocks 0..4 and 4..8.
const SPREAD: [[i16; 32]; 2] = [spread(0), spread(4)];

/// The activation row re-laid out for the kernel, per super-block: `q` the 256 quants in the
/// order of the weights' nibble vectors (for h in 0..2: elements 128h + [0..32, 64..96], then
/// 128h + [32..64, 96..128]), `s` the 8 sub-block sums from the stored block sums (i32: exact
/// for any stored values, as the reference's i32 arithmetic), `d` the scale.
struct Act {
    q: Vec<u8>,
    s: Vec<i32>,
    d: Vec<f32>,
}

impl Act {
    fn new(a: &[u8], blocks: usize) -> Act {
        let mut act = Act {
            q: Vec::with_capacity(256 * blocks),
            s: Vec::with_capacity(8 * blocks),
            d: Vec::with_capacity(blocks),
        };
        for ab in a.chunks_exact(Q8K).take(blocks) {
            let qs = &ab[4..260];
            for h in 0..2 {
                for part in [0, 64, 32, 96] {
                    act.q.extend_from_slice(&qs[128 * h + part..][..32]);
                }
            }
            let bsum = |j: usize| i16::from_le_bytes([ab[260 + 2 * j], ab[261 + 2 * j]]) as i32;
            act.s.extend((0..8).map(|s| bsum(2 * s) + bsum(2 * s + 1)));
            act.d.push(f32_at(ab, 0));
        }
        act
    }
}

/// The dots of the `out.len()` consecutive Q4_K rows of `w` with the Q8_K row `a` (the side
/// table's facts are not needed: the activation's scale is read from its blocks).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
pub(super) fn dot_q4_k_side_rows(w: &[u8], a: &[u8], _: &[f32], _: &[i32], out: &mut [f32]) {
    let Some(wrb) = side_row_bytes(w, out.len(), Q4K, "Q4_K") else {
        return;
    };
    let blocks = wrb / Q4K;
    let a = &a[..blocks * Q8K];
    let groups = out.len() / ROWS;
    let (grouped, rest) = out.split_at_mut(groups * ROWS);
    if groups > 0 {
        let act = Act::new(a, blocks);
        let group = ROWS * wrb;
        for (g, o) in grouped.chunks_exact_mut(ROWS).enumerate() {
            // The next group's bytes (none after the last), prefetched while this one runs.
            let next = &w[((g + 1) * group).min(groups * group)..(g + 2).min(groups) * group];
            let v = rows4(&w[g * group..][..group], wrb, &act, next);
            o.copy_from_slice(&v);
        }
    }
    let done = groups * ROWS * wrb;
    for (wr, o) in w[done..].chunks_exact(wrb).zip(rest.iter_mut()) {
        *o = dot_q4_k(wr, a);
    }
}

/// The dots of the 4 rows of `w` (`wrb` bytes each) with `act`, prefetching `next` (the bytes
/// the next call reads) evenly over the super-blocks: the 4 rows are read as 4 interleaved
/// streams, which the hardware prefetchers do not follow (without it the kernel waited on
/// the weight loads of rows 1..4 and ran at a third of the single-row kernel's speed).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
fn rows4(w: &[u8], wrb: usize, act: &Act, next: &[u8]) -> [f32; ROWS] {
    let blocks = wrb / Q4K;
    assert!(
        w.len() == ROWS * wrb
            && act.q.len() == 256 * blocks
            && act.s.len() == 8 * blocks
            && act.d.len() == blocks
    );
    let m4 = _mm512_set1_epi8(0x0f);
    let zero = _mm512_setzero_si512();
    // SAFETY: each spread is 64 readable bytes.
    let spread = SPREAD.map(|s| unsafe { _mm512_loadu_si512(s.as_ptr().cast()) });
    let mut lanes = [_mm_setzero_ps(); 4];
    // Cache lines of `next` per super-block.
    let all_lines = next.len().div_ceil(64);
    let lines = all_lines.div_ceil(blocks.max(1));
    for b in 0..blocks {
        for l in b * lines..((b + 1) * lines).min(all_lines) {
            // SAFETY: `_mm_prefetch` never faults; the address is inside `next`.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(next.as_ptr().add(64 * l).cast()) };
        }
        let aq = &act.q[256 * b..][..256];
        let aq: [__m512i; 4] = std::array::from_fn(|i| load64(&aq[64 * i..]));
        // SAFETY: `act.s` holds 8 i32 (32 bytes) per super-block.
        let ss = unsafe { _mm256_loadu_si256(act.s.as_ptr().add(8 * b).cast()) };
        // isum of rows 0..4, then their msum: lane r + 4·k after `sum8`.
        let mut sums = [_mm256_setzero_si256(); 8];
        // d of rows 0..4, then their dmin, as f16 words.
        let mut dd = [0u16; 8];
        for r in 0..ROWS {
            let wb = &w[r * wrb + b * Q4K..][..Q4K];
            dd[r] = u16::from_le_bytes([wb[0], wb[1]]);
            dd[ROWS + r] = u16::from_le_bytes([wb[2], wb[3]]);
            let (sc, mn) = scales_mins_k4(&wb[4..16]);
            let sc16 = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc as i64)));
            let mut acc = zero;
            for h in 0..2 {
                // qs[64h..64h + 64]: low nibbles sub-blocks 4h, 4h + 2; high 4h + 1, 4h + 3.
                let q = load64(&wb[16 + 64 * h..]);
                let lo = _mm512_and_si512(q, m4);
                let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(q), m4);
                let plo = _mm512_dpbusd_epi32(zero, lo, aq[2 * h]);
                let phi = _mm512_dpbusd_epi32(zero, hi, aq[2 * h + 1]);
                acc = _mm512_dpwssd_epi32(
                    acc,
                    _mm512_packs_epi32(plo, phi),
                    _mm512_permutexvar_epi16(spread[h], sc16),
                );
            }
            sums[r] = _mm256_add_epi32(
                _mm512_castsi512_si256(acc),
                _mm512_extracti64x4_epi64::<1>(acc),
            );
            // S_s · mn_s: at most 2 · 32767 · 63 in magnitude.
            let mins = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(mn as i64));
            sums[ROWS + r] = _mm256_mullo_epi32(ss, mins);
        }
        let s = _mm256_cvtepi32_ps(sum8(sums));
        // SAFETY: `dd` is 16 readable bytes.
        let dd = _mm256_cvtph_ps(unsafe { _mm_loadu_si128(dd.as_ptr().cast()) });
        // [d_w · d_a of rows 0..4, dmin_w · d_a of rows 0..4], times [isum, msum].
        let prod = _mm256_mul_ps(_mm256_mul_ps(dd, _mm256_set1_ps(act.d[b])), s);
        let v = _mm_sub_ps(
            _mm256_castps256_ps128(prod),
            _mm256_extractf128_ps::<1>(prod),
        );
        lanes[b % 4] = _mm_add_ps(lanes[b % 4], v);
    }
    let total = _mm_add_ps(
        _mm_add_ps(lanes[0], lanes[2]),
        _mm_add_ps(lanes[1], lanes[3]),
    );
    let mut out = [0f32; ROWS];
    // SAFETY: `out` holds 4 f32.
    unsafe { _mm_storeu_ps(out.as_mut_ptr(), total) };
    out
}
