//! The AVX2 decode and prefill kernel for Q8_0 rows packed 16 at a time
//! ([`crate::ops::matmul::packed`], `Layout::Q80X16`), the AVX2 form of `avx512_q80_x16`:
//! one or four Q8_0 activation rows against the 16 rows of a group, in two halves of 8 rows
//! (`avx2_x16`).
//!
//! Per 32-element block, exact integers as the reference's (`quants::legacy::dot_q8_0_q8_0`)
//! for every byte of weights and activations (weights from a file may hold -128, which the
//! sign trick, |w| against a with w's sign, takes exactly only while no activation is -128):
//! a 32-byte load holds the same 4 weight bytes of 8 rows, biased to unsigned
//! (u = w ^ 0x80 = w + 128) and split in nibbles, u = 16 · hi + lo with hi and lo in 0..15.
//! Each nibble vector meets 4 broadcast activations in one `vpmaddubsw`: a pair is at most
//! 2 · 15 · 128 = 3840 in magnitude, so the block's 8 quads sum in i16 to at most 30720 <
//! 32767 per nibble, and one `vpmaddwd` against ones (lo) and one against 16 (hi) give
//! Σ u·a. Σ w·a = Σ u·a - 128 · Σ a, the activation block's Σ a by `vpsadbw`.
//! The `_facts` form reads each activation block's Σ a (and its d as f32) from the matmul's
//! side table instead (`x16`, `ActFacts`: filled once per matmul, where this form would sum
//! the block again for every group of 16 rows); the same integers and floats.
//!
//! The float part is the AVX-512 kernel's (the reference's), one row per lane, never fused:
//! s · (d_w · d_a), block b added into block lane b % 4, the lanes combined as
//! (0 + 2) + (1 + 3).
//!
//! Gate: `tests/split_exact.rs` (`packed_kernels_are_exact_on_every_isa`, and
//! `packed_matmul_is_exact_for_every_thread_count` under `MINFER_CPU_ISA=avx2`).

use std::arch::x86_64::*;

use super::avx2_x16::{bcast4, f16x8, finish, load, per_half, q8_0_block, widen};
use super::x16::{Blocks, Dots, NO_FACTS, Q8_0};
use crate::simd::ActFacts;

/// Bytes of one packed group's block (16 rows of 34 bytes).
const GROUP_BLOCK: usize = 544;

x16_entries! {
    /// The 16 dots of the group `g` (`blocks · GROUP_BLOCK` bytes) with each of the `N` Q8_0
    /// rows `a` (see `x16`).
    dot_q80_x16,
    dot_q80_x16_facts,
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
    let bias = _mm256_set1_epi8(-128);
    let m4 = _mm256_set1_epi8(0x0f);
    let sixteen = _mm256_set1_epi16(16);
    let zero = _mm256_setzero_si256();
    let mut lanes = [[[_mm256_setzero_ps(); 4]; 2]; N];
    let blocks = Blocks::new(g, a, GROUP_BLOCK, Q8_0, "Q8_0");
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
            // Per row: the low nibbles' sums and the high nibbles' (see the module docs).
            let mut lo = [zero; N];
            let mut hi = [zero; N];
            let ap = per_half(ap);
            for q in 0..8 {
                // SAFETY: quad q of rows 8h..8h + 8.
                let u = _mm256_xor_si256(unsafe { load(p.add(32 + 64 * q + 32 * h)) }, bias);
                let ul = _mm256_and_si256(u, m4);
                let uh = _mm256_and_si256(_mm256_srli_epi16::<4>(u), m4);
                for t in 0..N {
                    // SAFETY: activation bytes 4q of the block's quants (at 2).
                    let av = unsafe { bcast4(ap[t].add(2 + 4 * q)) };
                    lo[t] = _mm256_add_epi16(lo[t], _mm256_maddubs_epi16(ul, av));
                    hi[t] = _mm256_add_epi16(hi[t], _mm256_maddubs_epi16(uh, av));
                }
            }
            for t in 0..N {
                let su = _mm256_add_epi32(widen(lo[t]), _mm256_madd_epi16(hi[t], sixteen));
                let s = _mm256_sub_epi32(su, _mm256_set1_epi32(128 * sa[t]));
                let v = _mm256_mul_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw, da[t]));
                lanes[t][h][b % 4] = _mm256_add_ps(lanes[t][h][b % 4], v);
            }
        }
    }
    finish(&lanes, out);
}
