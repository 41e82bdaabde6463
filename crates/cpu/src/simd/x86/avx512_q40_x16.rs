//! The AVX-512 VNNI decode kernel for Q4_0 rows packed 16 at a time
//! ([`crate::ops::matmul::packed`], `Layout::Q40X16`): one Q8_0 activation row against the 16
//! rows of a group, i32 / f32 lane r of every vector being row r.
//!
//! Per 32-element block, exact integers as the reference's (`quants::legacy::dot_q4_0_q8_0`):
//! a 64-byte load holds the same 4 quant bytes of the 16 rows; their low nibbles u (q + 8)
//! meet 4 broadcast activations of the block's first half and their high nibbles 4 of its
//! second half in one `vpdpbusd` each (at most 32 · 15 · 127 per row). Σ q·a = Σ u·a -
//! 8 · Σ a, the activation block's Σ a by one `vpdpbusd` against ones.
//!
//! The float part is the reference's, one row per lane, never fused: (s · d_w) · d_a, block b
//! added into block lane b % 4, the lanes combined as (0 + 2) + (1 + 3).
//!
//! Memory: as the Q4_K kernel (`avx512_q4k_x16`), one sequential stream in 2 MiB pages.
//!
//! Gate: `tests/split_exact.rs` (`packed_matmul_is_exact_for_every_thread_count`).

use std::arch::x86_64::*;

use super::avx512_x16::{block_sum, f16_lanes, finish};

/// Bytes of one Q8_0 block: d f16, qs i8[32].
const Q8_0: usize = 34;
/// Bytes of one packed group's block (16 rows of 18 bytes).
const GROUP_BLOCK: usize = 288;

/// The 16 dots of the group `g` (`blocks · GROUP_BLOCK` bytes) with each of the `N` Q8_0
/// rows `a` (the group's bytes loaded and unpacked once for all of them; each row's values
/// are the one-row kernel's bits: its integers are exact and its float steps the same).
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL/VNNI, AVX2 and F16C.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
pub(crate) unsafe fn dot_q40_x16<const N: usize>(
    g: &[u8],
    a: [&[u8]; N],
    out: &mut [[f32; 16]; N],
) {
    let blocks = g.len() / GROUP_BLOCK;
    let mut fits = g.len() == blocks * GROUP_BLOCK;
    for row in a {
        fits &= row.len() == blocks * Q8_0;
    }
    assert!(fits, "a packed Q4_0 group against Q8_0 rows");
    // No closures below: a closure does not inherit the target features.
    let m4 = _mm512_set1_epi8(0x0f);
    let zero = _mm512_setzero_si512();
    let mut lanes = [[_mm512_setzero_ps(); 4]; N];
    for b in 0..blocks {
        // SAFETY: by the assertion, block b of the group is GROUP_BLOCK bytes at
        // b · GROUP_BLOCK of `g` and each activation's block Q8_0 bytes at b · Q8_0 of it.
        let p = unsafe { g.as_ptr().add(b * GROUP_BLOCK) };
        let mut ap = [p; N];
        for t in 0..N {
            // SAFETY: as above.
            ap[t] = unsafe { a[t].as_ptr().add(b * Q8_0) };
        }
        // SAFETY: d of the 16 rows (32 bytes at 0).
        let dw = unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())) };
        // Two chains for one row (shorter dependency chains), one a row for several.
        let mut acc = [[zero; 2]; N];
        for q in 0..4 {
            // SAFETY: quad q of the 16 rows.
            let v = unsafe { _mm512_loadu_si512(p.add(32 + 64 * q).cast()) };
            let lo = _mm512_and_si512(v, m4);
            let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4);
            let c = if N == 1 { q % 2 } else { 0 };
            for t in 0..N {
                // SAFETY: activation bytes 4q and 16 + 4q of the block's quants.
                let (alo, ahi) = unsafe {
                    (
                        _mm512_set1_epi32(ap[t].add(2 + 4 * q).cast::<i32>().read_unaligned()),
                        _mm512_set1_epi32(ap[t].add(18 + 4 * q).cast::<i32>().read_unaligned()),
                    )
                };
                acc[t][c] = _mm512_dpbusd_epi32(acc[t][c], lo, alo);
                acc[t][c] = _mm512_dpbusd_epi32(acc[t][c], hi, ahi);
            }
        }
        for t in 0..N {
            // SAFETY: the activation's 32 quants at 2 and its d at 0.
            let (aq, da) = unsafe { (_mm256_loadu_si256(ap[t].add(2).cast()), f16_lanes(ap[t])) };
            let sa = block_sum(aq);
            let s = _mm512_sub_epi32(
                _mm512_add_epi32(acc[t][0], acc[t][1]),
                _mm512_set1_epi32(8 * sa),
            );
            let v = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(s), dw), da);
            lanes[t][b % 4] = _mm512_add_ps(lanes[t][b % 4], v);
        }
    }
    for t in 0..N {
        finish(lanes[t], &mut out[t]);
    }
}
