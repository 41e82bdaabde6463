//! The AVX-512 VNNI decode kernel for Q8_0 rows packed 16 at a time
//! ([`crate::ops::matmul::packed`], `Layout::Q80X16`): one Q8_0 activation row against the 16
//! rows of a group, i32 / f32 lane r of every vector being row r.
//!
//! Per 32-element block, exact integers as the reference's (`quants::legacy::dot_q8_0_q8_0`):
//! a 64-byte load holds the same 4 weight bytes of the 16 rows, biased to unsigned (w ^ 0x80 =
//! w + 128, exact for -128 too), and meets 4 broadcast activations in one `vpdpbusd` (at most
//! 32 · 255 · 127 per row); Σ w·a = Σ (w + 128)·a - 128 · Σ a, the activation block's Σ a by
//! one `vpdpbusd` against ones.
//! The `_facts` form reads each activation block's Σ a (and its d as f32) from the matmul's
//! side table instead (`x16`, `ActFacts`: filled once per matmul, where this form would sum
//! the block again for every group of 16 rows); the same integers and floats.
//!
//! The float part is the reference's, one row per lane, never fused: s · (d_w · d_a), block b
//! added into block lane b % 4, the lanes combined as (0 + 2) + (1 + 3).
//!
//! Memory: as the Q4_K kernel (`avx512_q4k_x16`), one sequential stream in 2 MiB pages.
//!
//! Gate: `tests/split_exact.rs` (`packed_matmul_is_exact_for_every_thread_count`,
//! `legacy_float_orders_hold_on_large_block_sums`).

use std::arch::x86_64::*;

use super::avx512_x16::{bcast4, f16x16, finish, q8_0_sum};
use super::x16::{fact, Blocks, Dots, NO_FACTS, Q8_0};
use crate::simd::ActFacts;

/// Bytes of one packed group's block (16 rows of 34 bytes).
const GROUP_BLOCK: usize = 544;

x16_entries! {
    /// The 16 dots of the group `g` (`blocks · GROUP_BLOCK` bytes) with each of the `N` Q8_0
    /// rows `a` (see `x16`).
    dot_q80_x16,
    dot_q80_x16_facts,
    "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c",
    "The CPU must support AVX-512 F/BW/VL/VNNI, AVX2 and F16C.",
    dots
}

/// The kernel, inlined into the two wrappers above, whose target features its intrinsics
/// take; with `FACTS`, each activation block's d and Σ q come from `facts` (`x16`), else from
/// its bytes.
///
/// # Safety
/// Only called from those wrappers.
#[inline(always)]
unsafe fn dots<const N: usize, const FACTS: bool>(
    g: &[u8],
    a: [&[u8]; N],
    facts: [ActFacts<'_>; N],
    out: &mut Dots<N>,
) {
    // No closures below: a closure does not inherit the target features.
    let bias = _mm512_set1_epi8(-128);
    let zero = _mm512_setzero_si512();
    let mut lanes = [[_mm512_setzero_ps(); 4]; N];
    let blocks = Blocks::new(g, a, GROUP_BLOCK, Q8_0, "Q8_0");
    if FACTS {
        blocks.check_facts(&facts);
    }
    for (b, p, ap) in blocks {
        // SAFETY: d of the 16 rows (32 bytes at 0).
        let dw = unsafe { f16x16(p) };
        // Two chains for one row (shorter dependency chains), one a row for several.
        let mut acc = [[zero; 2]; N];
        for q in 0..8 {
            // SAFETY: quad q of the 16 rows.
            let v = unsafe { _mm512_loadu_si512(p.add(32 + 64 * q).cast()) };
            let u = _mm512_xor_si512(v, bias);
            let c = if N == 1 { q % 2 } else { 0 };
            for t in 0..N {
                // SAFETY: activation bytes 4q of the block's quants (at 2).
                let av = unsafe { bcast4(ap[t].add(2 + 4 * q)) };
                acc[t][c] = _mm512_dpbusd_epi32(acc[t][c], u, av);
            }
        }
        for t in 0..N {
            let (sa, da) = if FACTS {
                // SAFETY: `check_facts` accepted the facts for these blocks.
                let (d, s) = unsafe { fact(&facts[t], b) };
                (s, _mm512_set1_ps(d))
            } else {
                // SAFETY: the activation's block is a whole Q8_0 block.
                unsafe { q8_0_sum(ap[t]) }
            };
            let s = _mm512_sub_epi32(
                _mm512_add_epi32(acc[t][0], acc[t][1]),
                _mm512_set1_epi32(128 * sa),
            );
            let v = _mm512_mul_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, da));
            lanes[t][b % 4] = _mm512_add_ps(lanes[t][b % 4], v);
        }
    }
    finish(&lanes, out);
}
