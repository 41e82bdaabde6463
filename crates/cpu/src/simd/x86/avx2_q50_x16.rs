//! The AVX2 decode and prefill kernel for Q5_0 rows packed 16 at a time
//! ([`crate::ops::matmul::packed`], `Layout::Q50X16`), the AVX2 form of `avx512_q50_x16`:
//! one or four Q8_0 activation rows against the 16 rows of a group, in two halves of 8 rows
//! (`avx2_x16`).
//!
//! Per 32-element block, exact integers as the reference's (`quants::legacy::dot_q5_0_q8_0`):
//! a 32-byte load holds the same 4 quant bytes of 8 rows. The fifth bits of those 4 elements
//! of each row (bits 4q..4q + 4 of its `qh` for the low nibbles, 16 + 4q.. for the high
//! ones) come from the qh byte holding them, copied to the 4 bytes of the row's lane by
//! `vpshufb`: byte j tested against bit j (+ 4 for odd quads) gives 16 or 0, so the unsigned
//! q5 = q + 16 (0..31) meet 4 broadcast activations in one `vpmaddubsw` per half-block. A
//! pair is at most 2 · 31 · 128 = 7936 in magnitude, so 4 `vpmaddubsw` (the block's low
//! halves, and its high halves) sum in i16 to at most 31744 < 32767, each sum widened by
//! one `vpmaddwd`. Σ q·a = Σ q5·a - 16 · Σ a, the activation block's Σ a by `vpsadbw`.
//! The `_facts` form reads each activation block's Σ a (and its d as f32) from the matmul's
//! side table instead (`x16`, `ActFacts`: filled once per matmul, where this form would sum
//! the block again for every group of 16 rows); the same integers and floats.
//!
//! The float part is the AVX-512 kernel's (the reference's), one row per lane, never fused:
//! (d_w · d_a) · s, block b added into block lane b % 4, the lanes combined as
//! (0 + 2) + (1 + 3).
//!
//! Gate: `tests/split_exact.rs` (`packed_kernels_are_exact_on_every_isa`,
//! `legacy_float_orders_hold_on_large_block_sums`, and
//! `packed_matmul_is_exact_for_every_thread_count` under `MINFER_CPU_ISA=avx2`).

use std::arch::x86_64::*;

use super::avx2_x16::{bcast4, f16x8, finish, load, per_half, q8_0_block, widen};
use super::x16::{Blocks, Dots, NO_FACTS, Q8_0};
use crate::simd::ActFacts;

/// Bytes of one packed group's block (16 rows of 22 bytes).
pub(super) const GROUP_BLOCK: usize = 352;

/// `vpshufb` indices copying byte `k` of each i32 lane to its 4 bytes.
const fn byte_everywhere(k: u8) -> [u8; 32] {
    let mut idx = [0u8; 32];
    let mut i = 0;
    while i < 32 {
        idx[i] = 4 * ((i / 4) % 4) as u8 + k;
        i += 1;
    }
    idx
}

pub(super) const SPREAD: [[u8; 32]; 4] = [
    byte_everywhere(0),
    byte_everywhere(1),
    byte_everywhere(2),
    byte_everywhere(3),
];

/// 16 in each byte j of the lanes of `byte` (a qh byte in all 4 bytes of its lane) whose bit
/// `j + shift` is set, else 0 (`bits`: 1 << (j + shift) in byte j).
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) fn fifth_bits(byte: __m256i, bits: __m256i) -> __m256i {
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(byte, bits), bits);
    _mm256_and_si256(set, _mm256_set1_epi8(16))
}

x16_entries! {
    /// The 16 dots of the group `g` (`blocks · GROUP_BLOCK` bytes) with each of the `N` Q8_0
    /// rows `a` (see `x16`).
    dot_q50_x16,
    dot_q50_x16_facts,
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
    // Bit j of byte j (even quads), bit j + 4 (odd quads).
    let bits = [
        _mm256_set1_epi32(0x0804_0201),
        _mm256_set1_epi32(0x8040_2010u32 as i32),
    ];
    let zero = _mm256_setzero_si256();
    let mut spread = [zero; 4];
    for k in 0..4 {
        // SAFETY: each table row is 32 readable bytes.
        spread[k] = unsafe { load(SPREAD[k].as_ptr()) };
    }
    let mut lanes = [[[_mm256_setzero_ps(); 4]; 2]; N];
    let blocks = Blocks::new(g, a, GROUP_BLOCK, Q8_0, "Q5_0");
    if FACTS {
        blocks.check_facts(&facts);
    }
    for (b, p, ap) in blocks {
        // SAFETY: `check_facts` accepted the facts for these blocks (with FACTS); each of
        // `ap` starts a whole Q8_0 block.
        let (sa, da) = unsafe { q8_0_block::<N, FACTS>(&facts, b, &ap) };
        for h in 0..2 {
            // SAFETY: d of rows 8h..8h + 8 (16 bytes at 16h), their qh words (32 at 32 + 32h).
            let (dw, qh) = unsafe { (f16x8(p.add(16 * h)), load(p.add(32 + 32 * h))) };
            // Per row: the sums of the low halves' products and of the high halves'.
            let mut lo = [zero; N];
            let mut hi = [zero; N];
            let ap = per_half(ap);
            for q in 0..4 {
                // SAFETY: quad q of rows 8h..8h + 8.
                let v = unsafe { load(p.add(96 + 64 * q + 32 * h)) };
                let b_lo = fifth_bits(_mm256_shuffle_epi8(qh, spread[q / 2]), bits[q % 2]);
                let b_hi = fifth_bits(_mm256_shuffle_epi8(qh, spread[2 + q / 2]), bits[q % 2]);
                let u_lo = _mm256_or_si256(_mm256_and_si256(v, m4), b_lo);
                let u_hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(v), m4), b_hi);
                for t in 0..N {
                    // SAFETY: activation bytes 4q and 16 + 4q of the block's quants (at 2).
                    let (alo, ahi) =
                        unsafe { (bcast4(ap[t].add(2 + 4 * q)), bcast4(ap[t].add(18 + 4 * q))) };
                    lo[t] = _mm256_add_epi16(lo[t], _mm256_maddubs_epi16(u_lo, alo));
                    hi[t] = _mm256_add_epi16(hi[t], _mm256_maddubs_epi16(u_hi, ahi));
                }
            }
            for t in 0..N {
                let s = _mm256_sub_epi32(
                    _mm256_add_epi32(widen(lo[t]), widen(hi[t])),
                    _mm256_set1_epi32(16 * sa[t]),
                );
                let v = _mm256_mul_ps(_mm256_mul_ps(dw, da[t]), _mm256_cvtepi32_ps(s));
                lanes[t][h][b % 4] = _mm256_add_ps(lanes[t][h][b % 4], v);
            }
        }
    }
    finish(&lanes, out);
}
