//! The AVX-512 VNNI decode kernel for Q4_1 rows packed 16 at a time
//! ([`crate::ops::matmul::packed`], `Layout::Q41X16`): one Q8_1 activation row against the 16
//! rows of a group, i32 / f32 lane r of every vector being row r.
//!
//! Per 32-element block, exact integers as the reference's (`quants::legacy::dot_q4_1_q8_1`):
//! a 64-byte load holds the same 4 quant bytes of the 16 rows; their low nibbles meet 4
//! broadcast activations of the block's first half and their high nibbles 4 of its second
//! half in one `vpdpbusd` each (at most 32 · 15 · 127 per row).
//!
//! The float part is the reference's, one row per lane, never fused: (d_w · d_a) · s +
//! m_w · s_a (s_a the activation block's stored sum), block b added into block lane b % 4,
//! the lanes combined as (0 + 2) + (1 + 3).
//!
//! Memory: as the Q4_K kernel (`avx512_q4k_x16`), one sequential stream in 2 MiB pages.
//!
//! Gate: `tests/split_exact.rs` (`packed_matmul_is_exact_for_every_thread_count`).

use std::arch::x86_64::*;

use super::avx512_x16::{bcast4, f16_lanes, f16x16, finish};
use super::x16::{Blocks, Dots, Q8_1};

/// Bytes of one packed group's block (16 rows of 20 bytes).
const GROUP_BLOCK: usize = 320;

/// The 16 dots of the group `g` (`blocks · GROUP_BLOCK` bytes) with each of the `N` Q8_1
/// rows `a` (see `x16`).
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL/VNNI, AVX2 and F16C.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
pub(crate) unsafe fn dot_q41_x16<const N: usize>(g: &[u8], a: [&[u8]; N], out: &mut Dots<N>) {
    // No closures below: a closure does not inherit the target features.
    let m4 = _mm512_set1_epi8(0x0f);
    let zero = _mm512_setzero_si512();
    let mut lanes = [[_mm512_setzero_ps(); 4]; N];
    for (b, p, ap) in Blocks::new(g, a, GROUP_BLOCK, Q8_1, "Q4_1") {
        // SAFETY: d and m of the 16 rows (32 bytes at 0 and at 32).
        let (dw, mw) = unsafe { (f16x16(p), f16x16(p.add(32))) };
        // Two chains for one row (shorter dependency chains), one a row for several.
        let mut acc = [[zero; 2]; N];
        for q in 0..4 {
            // SAFETY: quad q of the 16 rows.
            let v = unsafe { _mm512_loadu_si512(p.add(64 + 64 * q).cast()) };
            let lo = _mm512_and_si512(v, m4);
            let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4);
            let c = if N == 1 { q % 2 } else { 0 };
            for t in 0..N {
                // SAFETY: activation bytes 4q and 16 + 4q of the block's quants (at 4).
                let (alo, ahi) =
                    unsafe { (bcast4(ap[t].add(4 + 4 * q)), bcast4(ap[t].add(20 + 4 * q))) };
                acc[t][c] = _mm512_dpbusd_epi32(acc[t][c], lo, alo);
                acc[t][c] = _mm512_dpbusd_epi32(acc[t][c], hi, ahi);
            }
        }
        for t in 0..N {
            // SAFETY: the activation's d and s (f16 at 0 and 2; the conversions are exact).
            let (da, sa) = unsafe { (f16_lanes(ap[t]), f16_lanes(ap[t].add(2))) };
            let s = _mm512_add_epi32(acc[t][0], acc[t][1]);
            let v = _mm512_add_ps(
                _mm512_mul_ps(_mm512_mul_ps(dw, da), _mm512_cvtepi32_ps(s)),
                _mm512_mul_ps(mw, sa),
            );
            lanes[t][b % 4] = _mm512_add_ps(lanes[t][b % 4], v);
        }
    }
    finish(&lanes, out);
}
