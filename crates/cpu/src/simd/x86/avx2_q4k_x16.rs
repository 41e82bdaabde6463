//! The AVX2 decode and prefill kernel for Q4_K rows packed 16 at a time
//! ([`crate::ops::matmul::packed`], `Layout::Q4kX16`), the AVX2 form of `avx512_q4k_x16`:
//! one or four Q8_K activation rows against the 16 rows of a group, in two halves of 8 rows
//! (`avx2_x16`).
//!
//! Per super-block, exact integers as the reference's (`quants::kquants::dot_scale_min`):
//! - A 32-byte load holds the same 4 quant bytes of 8 rows; their low nibbles meet 4
//!   activations of sub-block 2j (broadcast, 4 bytes) and their high nibbles 4 of sub-block
//!   2j + 1 in one `vpmaddubsw` each. A pair is at most 2 · 15 · 128 = 3840 in magnitude (Q8_K
//!   activations reach -128), so a sub-block's 8 `vpmaddubsw` sum in i16 to at most 30720 <
//!   32767; one `vpmaddwd` against the row's six-bit scale (in both i16 of its lane) then
//!   gives scale · Σ q·a of the sub-block as an i32 (at most 63 · 61440), into isum.
//! - The scales and mins are unpacked for 8 rows at once from the three packed words (the bit
//!   moves of `quants::unpack_scale_min_k4`), one byte per i16 picked by `vpshufb`.
//! - msum = Σ_j bsum_j · mn_{j/2} over the activation's 16 stored i16 block sums, by one
//!   `vpmaddwd` per sub-block: the row's min twice as i16 against the pair of sums.
//!
//! The float part is the AVX-512 kernel's (the reference's), one row per lane, never fused:
//! (d_w · d_a) · isum - (dmin_w · d_a) · msum, super-block b added into block lane b % 4, the
//! lanes combined as (0 + 2) + (1 + 3).
//!
//! Memory: as the AVX-512 kernel, each super-block's 36 lines are requested by software
//! prefetches at the top of its iteration.
//!
//! Gate: `tests/split_exact.rs` (`packed_kernels_are_exact_on_every_isa`, and
//! `packed_matmul_is_exact_for_every_thread_count` under `MINFER_CPU_ISA=avx2`).

use std::arch::x86_64::*;

use super::avx2_x16::{bcast4, f16x8, finish, lane_bytes, load, per_half, q8k_d, table};
use super::x16::{Blocks, Dots, Q8K};

/// Bytes of one packed group's super-block (16 rows of 144 bytes).
pub(super) const GROUP_BLOCK: usize = 2304;

/// Byte k of each lane as two zero-extended i16 (a scale or a min, for `vpmaddwd`).
pub(super) const BYTE_IDX: [[u8; 32]; 4] = [
    lane_bytes(0, 0, 0),
    lane_bytes(1, 1, 0),
    lane_bytes(2, 2, 0),
    lane_bytes(3, 3, 0),
];

/// The six-bit scales and mins of 8 rows from their three packed words `wa`, `wb`, `wc`
/// (the bit moves of `quants::unpack_scale_min_k4`), one byte each per lane: scales 0..4,
/// scales 4..8, mins 0..4, mins 4..8.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) fn scales_mins(wa: __m256i, wb: __m256i, wc: __m256i) -> [__m256i; 4] {
    let six = _mm256_set1_epi32(0x3f3f_3f3f);
    let four = _mm256_set1_epi32(0x0f0f_0f0f);
    let top = _mm256_set1_epi32(0x3030_3030);
    let sl = _mm256_and_si256(wa, six);
    let sh = _mm256_or_si256(
        _mm256_and_si256(wc, four),
        _mm256_and_si256(_mm256_srli_epi32::<2>(wa), top),
    );
    let ml = _mm256_and_si256(wb, six);
    let mh = _mm256_or_si256(
        _mm256_and_si256(_mm256_srli_epi32::<4>(wc), four),
        _mm256_and_si256(_mm256_srli_epi32::<2>(wb), top),
    );
    [sl, sh, ml, mh]
}

/// The 16 dots of the group `g` (`blocks · GROUP_BLOCK` bytes) with each of the `N` Q8_K
/// rows `a` (see `x16`).
///
/// # Safety
/// The CPU must support AVX2 and F16C.
// The half, token and lane indices also give byte offsets and walk several arrays in step.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn dot_q4k_x16<const N: usize>(g: &[u8], a: [&[u8]; N], out: &mut Dots<N>) {
    // No closures below: a closure does not inherit the target features, so intrinsics in
    // one become calls.
    let m4 = _mm256_set1_epi8(0x0f);
    let zero = _mm256_setzero_si256();
    let mut idx = [zero; 4];
    for k in 0..4 {
        idx[k] = table(&BYTE_IDX[k]);
    }
    let mut lanes = [[[_mm256_setzero_ps(); 4]; 2]; N];
    // Opaque to the optimiser, as in the AVX-512 kernel: a constant bound let it unroll the
    // prefetches and move them to the end of the previous iteration.
    let lines = std::hint::black_box(GROUP_BLOCK / 64);
    for (b, p, ap) in Blocks::new(g, a, GROUP_BLOCK, Q8K, "Q4_K") {
        // SAFETY: each of `ap` starts a whole Q8_K block.
        let da = unsafe { q8k_d(&ap) };
        // Every line of this super-block requested at once (see the module docs).
        for l in 0..lines {
            // SAFETY: `_mm_prefetch` never faults; the address is inside the super-block.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.add(64 * l).cast()) };
        }
        for h in 0..2 {
            // SAFETY: offsets inside the super-block (see the layout), rows 8h..8h + 8.
            let (d, dmin, wa, wb, wc) = unsafe {
                (
                    f16x8(p.add(16 * h)),
                    f16x8(p.add(32 + 16 * h)),
                    load(p.add(64 + 32 * h)),
                    load(p.add(128 + 32 * h)),
                    load(p.add(192 + 32 * h)),
                )
            };
            let [sl, sh, ml, mh] = scales_mins(wa, wb, wc);
            let mut isum = [zero; N];
            let mut msum = [zero; N];
            let ap = per_half(ap);
            for j in 0..4 {
                // For one row two i16 chains per nibble half (even and odd quads), joined
                // after; one a row for several. Each sums at most the sub-block's 8.
                let mut lo = [[zero; 2]; N];
                let mut hi = [[zero; 2]; N];
                for q in 0..8 {
                    // SAFETY: quad 8j + q of rows 8h..8h + 8.
                    let v = unsafe { load(p.add(256 + 64 * (8 * j + q) + 32 * h)) };
                    let vl = _mm256_and_si256(v, m4);
                    let vh = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4);
                    let c = if N == 1 { q % 2 } else { 0 };
                    for t in 0..N {
                        // SAFETY: activation bytes 64j + 4q and 64j + 32 + 4q (+ 4 for d),
                        // inside the block.
                        let (alo, ahi) = unsafe {
                            (
                                bcast4(ap[t].add(4 + 64 * j + 4 * q)),
                                bcast4(ap[t].add(4 + 64 * j + 32 + 4 * q)),
                            )
                        };
                        lo[t][c] = _mm256_add_epi16(lo[t][c], _mm256_maddubs_epi16(vl, alo));
                        hi[t][c] = _mm256_add_epi16(hi[t][c], _mm256_maddubs_epi16(vh, ahi));
                    }
                }
                let (s0, s1) = (2 * j, 2 * j + 1);
                let src0 = if s0 < 4 { sl } else { sh };
                let src1 = if s1 < 4 { sl } else { sh };
                let sc0 = _mm256_shuffle_epi8(src0, idx[s0 % 4]);
                let sc1 = _mm256_shuffle_epi8(src1, idx[s1 % 4]);
                for t in 0..N {
                    let l = _mm256_add_epi16(lo[t][0], lo[t][1]);
                    let u = _mm256_add_epi16(hi[t][0], hi[t][1]);
                    isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(l, sc0));
                    isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(u, sc1));
                }
            }
            for s in 0..8 {
                let src = if s < 4 { ml } else { mh };
                let mn = _mm256_shuffle_epi8(src, idx[s % 4]);
                for t in 0..N {
                    // SAFETY: bsums 2s and 2s + 1 (4 bytes at 260 + 4s of the block).
                    let bs = unsafe { bcast4(ap[t].add(260 + 4 * s)) };
                    msum[t] = _mm256_add_epi32(msum[t], _mm256_madd_epi16(mn, bs));
                }
            }
            for t in 0..N {
                let v = _mm256_sub_ps(
                    _mm256_mul_ps(_mm256_mul_ps(d, da[t]), _mm256_cvtepi32_ps(isum[t])),
                    _mm256_mul_ps(_mm256_mul_ps(dmin, da[t]), _mm256_cvtepi32_ps(msum[t])),
                );
                lanes[t][h][b % 4] = _mm256_add_ps(lanes[t][h][b % 4], v);
            }
        }
    }
    finish(&lanes, out);
}
