//! The AVX-512 VNNI decode kernel for Q5_0 rows packed 16 at a time
//! ([`crate::ops::matmul::packed`], `Layout::Q50X16`): one Q8_0 activation row against the 16
//! rows of a group, i32 / f32 lane r of every vector being row r.
//!
//! Per 32-element block, exact integers as the reference's (`quants::legacy::dot_q5_0_q8_0`):
//! a 64-byte load holds the same 4 quant bytes of the 16 rows; the fifth bits of those 4
//! elements of each row (bits 4q..4q + 4 of its `qh` for the low nibbles, 16 + 4q.. for the
//! high ones) are spread to bit 4 of the 4 bytes of its lane by one multiply (x · 0x00204081
//! moves bit j of a 4-bit x to bit 8j, with no carries), so the unsigned q5 = q + 16 meet 4
//! broadcast activations in one `vpdpbusd` per half (at most 32 · 31 · 127 per row). Σ q·a =
//! Σ q5·a - 16 · Σ a, the activation block's Σ a by one `vpdpbusd` against ones.
//!
//! The float part is the reference's, one row per lane, never fused: (d_w · d_a) · s, block b
//! added into block lane b % 4, the lanes combined as (0 + 2) + (1 + 3).
//!
//! Memory: as the Q4_K kernel (`avx512_q4k_x16`), one sequential stream in 2 MiB pages.
//!
//! Gate: `tests/split_exact.rs` (`packed_matmul_is_exact_for_every_thread_count`,
//! `legacy_float_orders_hold_on_large_block_sums`).

use std::arch::x86_64::*;

use super::avx512_x16::{bcast4, f16x16, finish, q8_0_sum};
use super::x16::{Blocks, Dots, Q8_0};

/// Bytes of one packed group's block (16 rows of 22 bytes).
const GROUP_BLOCK: usize = 352;

/// The 16 dots of the group `g` (`blocks · GROUP_BLOCK` bytes) with each of the `N` Q8_0
/// rows `a` (see `x16`).
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL/VNNI, AVX2 and F16C.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
pub(crate) unsafe fn dot_q50_x16<const N: usize>(g: &[u8], a: [&[u8]; N], out: &mut Dots<N>) {
    // No closures below: a closure does not inherit the target features.
    let m4 = _mm512_set1_epi8(0x0f);
    let low4 = _mm512_set1_epi32(0x0f);
    let spread = _mm512_set1_epi32(0x0020_4081);
    let bit0 = _mm512_set1_epi32(0x0101_0101);
    let zero = _mm512_setzero_si512();
    let mut lanes = [[_mm512_setzero_ps(); 4]; N];
    for (b, p, ap) in Blocks::new(g, a, GROUP_BLOCK, Q8_0, "Q5_0") {
        // SAFETY: d of the 16 rows (32 bytes at 0), their qh (64 at 32).
        let (dw, qh) = unsafe { (f16x16(p), _mm512_loadu_si512(p.add(32).cast())) };
        // Two chains for one row (shorter dependency chains), one a row for several.
        let mut acc = [[zero; 2]; N];
        for q in 0..4 {
            // SAFETY: quad q of the 16 rows.
            let v = unsafe { _mm512_loadu_si512(p.add(96 + 64 * q).cast()) };
            // Bits 4q..4q + 4 and 16 + 4q..16 + 4q + 4 of each row's qh, as 16 on the bytes.
            let shift = _mm_cvtsi32_si128(4 * q as i32);
            let shift_hi = _mm_cvtsi32_si128(16 + 4 * q as i32);
            let b_lo = _mm512_and_si512(_mm512_srl_epi32(qh, shift), low4);
            let b_hi = _mm512_and_si512(_mm512_srl_epi32(qh, shift_hi), low4);
            let b_lo =
                _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_mullo_epi32(b_lo, spread), bit0));
            let b_hi =
                _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_mullo_epi32(b_hi, spread), bit0));
            let lo = _mm512_or_si512(_mm512_and_si512(v, m4), b_lo);
            let hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16::<4>(v), m4), b_hi);
            let c = if N == 1 { q % 2 } else { 0 };
            for t in 0..N {
                // SAFETY: activation bytes 4q and 16 + 4q of the block's quants (at 2).
                let (alo, ahi) =
                    unsafe { (bcast4(ap[t].add(2 + 4 * q)), bcast4(ap[t].add(18 + 4 * q))) };
                acc[t][c] = _mm512_dpbusd_epi32(acc[t][c], lo, alo);
                acc[t][c] = _mm512_dpbusd_epi32(acc[t][c], hi, ahi);
            }
        }
        for t in 0..N {
            // SAFETY: the activation's block is a whole Q8_0 block.
            let (sa, da) = unsafe { q8_0_sum(ap[t]) };
            let s = _mm512_sub_epi32(
                _mm512_add_epi32(acc[t][0], acc[t][1]),
                _mm512_set1_epi32(16 * sa),
            );
            let v = _mm512_mul_ps(_mm512_mul_ps(dw, da), _mm512_cvtepi32_ps(s));
            lanes[t][b % 4] = _mm512_add_ps(lanes[t][b % 4], v);
        }
    }
    finish(&lanes, out);
}
