//! The AVX2 decode and prefill kernel for Q4_0 rows packed 16 at a time
//! ([`crate::ops::matmul::packed`], `Layout::Q40X16`), the AVX2 form of `avx512_q40_x16`:
//! one or four Q8_0 activation rows against the 16 rows of a group, in two halves of 8 rows
//! (`avx2_x16`).
//!
//! Per 32-element block, exact integers as the reference's (`quants::legacy::dot_q4_0_q8_0`):
//! a 32-byte load holds the same 4 quant bytes of 8 rows; their low nibbles u (q + 8, 0..15)
//! meet 4 broadcast activations of the block's first half and their high nibbles 4 of its
//! second half in one `vpmaddubsw` each. A pair is at most 2 · 15 · 128 = 3840 in magnitude,
//! so the 8 `vpmaddubsw` of a block (4 quads, two nibbles) sum in i16 to at most 30720 <
//! 32767 before one `vpmaddwd` against ones. Σ q·a = Σ u·a - 8 · Σ a, the activation
//! block's Σ a by `vpsadbw`.
//! The `_facts` form reads each activation block's Σ a (and its d as f32) from the matmul's
//! side table instead (`x16`, `ActFacts`: filled once per matmul, where this form would sum
//! the block again for every group of 16 rows); the same integers and floats.
//!
//! The float part is the AVX-512 kernel's (the reference's), one row per lane, never fused:
//! (s · d_w) · d_a, block b added into block lane b % 4, the lanes combined as
//! (0 + 2) + (1 + 3).
//!
//! Gate: `tests/split_exact.rs` (`packed_kernels_are_exact_on_every_isa`, and
//! `packed_matmul_is_exact_for_every_thread_count` under `MINFER_CPU_ISA=avx2`).

use std::arch::x86_64::*;

use super::avx2_x16::{bcast4, f16x8, finish, load, per_half, q8_0_block, widen};
use super::x16::{Blocks, Dots, NO_FACTS, Q8_0};
use crate::simd::ActFacts;

/// Bytes of one packed group's block (16 rows of 18 bytes).
const GROUP_BLOCK: usize = 288;

x16_entries! {
    /// The 16 dots of the group `g` (`blocks · GROUP_BLOCK` bytes) with each of the `N` Q8_0
    /// rows `a` (see `x16`).
    dot_q40_x16,
    dot_q40_x16_facts,
    "avx2,f16c",
    "The CPU must support AVX2 and F16C.",
    dots
}

/// The kernel, inlined into the two wrappers above, whose target features its intrinsics
/// take; with `FACTS`, each activation block's d and Σ q come from `facts` (`x16`), else from
/// its bytes.
///
/// # Safety
/// Only called from those wrappers.
// The half, token and lane indices also give byte offsets and walk several arrays in step.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn dots<const N: usize, const FACTS: bool>(
    g: &[u8],
    a: [&[u8]; N],
    facts: [ActFacts<'_>; N],
    out: &mut Dots<N>,
) {
    // No closures below: a closure does not inherit the target features.
    let m4 = _mm256_set1_epi8(0x0f);
    let zero = _mm256_setzero_si256();
    let mut lanes = [[[_mm256_setzero_ps(); 4]; 2]; N];
    let blocks = Blocks::new(g, a, GROUP_BLOCK, Q8_0, "Q4_0");
    if FACTS {
        blocks.check_facts(&facts);
    }
    for (b, p, ap) in blocks {
        // SAFETY: `check_facts` accepted the facts for these blocks (with FACTS); each of
        // `ap` starts a whole Q8_0 block.
        let (sa, da) = unsafe { q8_0_block::<N, FACTS>(&facts, b, &ap) };
        for h in 0..2 {
            // SAFETY: d of rows 8h..8h + 8 (16 bytes at 16h).
            let dw = unsafe { f16x8(p.add(16 * h)) };
            // Two i16 chains for one row (shorter dependency chains), one a row for several;
            // together at most the block's 8 `vpmaddubsw` (see the module docs).
            let mut acc = [[zero; 2]; N];
            let ap = per_half(ap);
            for q in 0..4 {
                // SAFETY: quad q of rows 8h..8h + 8.
                let v = unsafe { load(p.add(32 + 64 * q + 32 * h)) };
                let lo = _mm256_and_si256(v, m4);
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4);
                let c = if N == 1 { q % 2 } else { 0 };
                for t in 0..N {
                    // SAFETY: activation bytes 4q and 16 + 4q of the block's quants.
                    let (alo, ahi) =
                        unsafe { (bcast4(ap[t].add(2 + 4 * q)), bcast4(ap[t].add(18 + 4 * q))) };
                    acc[t][c] = _mm256_add_epi16(acc[t][c], _mm256_maddubs_epi16(lo, alo));
                    acc[t][c] = _mm256_add_epi16(acc[t][c], _mm256_maddubs_epi16(hi, ahi));
                }
            }
            for t in 0..N {
                let s = _mm256_sub_epi32(
                    widen(_mm256_add_epi16(acc[t][0], acc[t][1])),
                    _mm256_set1_epi32(8 * sa[t]),
                );
                let v = _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(s), dw), da[t]);
                lanes[t][h][b % 4] = _mm256_add_ps(lanes[t][h][b % 4], v);
            }
        }
    }
    finish(&lanes, out);
}
