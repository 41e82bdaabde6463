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
//! The `_facts` form reads each activation block's Σ a (and its d as f32) from the matmul's
//! side table instead (`x16`, `ActFacts`: filled once per matmul, where this form would sum
//! the block again for every group of 16 rows); the same integers and floats.
//!
//! Where the core has AVX-512 BITALG (Ice Lake, Zen 4 and later), the fifth bits reach their
//! bytes by one `vpshufbitqmb` a half instead (each byte's bit picked from its row's `qh` into
//! a mask, [`PICKS`]) and a masked byte add of 16: two instructions where the multiply takes
//! five, the same integers. The demo model's 896-wide matrices are Q5_0, so this kernel was
//! about half of its prefill.
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
use super::x16::{fact, Blocks, Dots, NO_FACTS, Q8_0};
use crate::simd::ActFacts;

/// Bytes of one packed group's block (16 rows of 22 bytes).
const GROUP_BLOCK: usize = 352;

/// Per quad q and half h (0: the low nibbles, 1: the high ones), the `vpshufbitqmb` control:
/// byte i of the quad's 64 bytes (row i / 4, element 4q + i % 4 of the half) takes bit
/// 16h + 4q + i % 4 of its row's `qh`, which is bit 32 ((i / 4) % 2) + that of the 64-bit lane
/// i / 8 holding rows 2 (i / 8) and 2 (i / 8) + 1.
static PICKS: [[[u8; 64]; 2]; 4] = picks();

const fn picks() -> [[[u8; 64]; 2]; 4] {
    let mut t = [[[0u8; 64]; 2]; 4];
    let mut q = 0;
    while q < 4 {
        let mut h = 0;
        while h < 2 {
            let mut i = 0;
            while i < 64 {
                t[q][h][i] = (((i >> 2) & 1) * 32 + 16 * h + 4 * q + (i & 3)) as u8;
                i += 1;
            }
            h += 1;
        }
        q += 1;
    }
    t
}

x16_entries! {
    /// The 16 dots of the group `g` (`blocks · GROUP_BLOCK` bytes) with each of the `N` Q8_0
    /// rows `a` (see `x16`), spreading the fifth bits by a multiply (`avx512_dispatch` hands
    /// out [`with_bitalg`] instead where the core has BITALG).
    with_multiply,
    with_multiply_facts,
    "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c",
    "The CPU must support AVX-512 F/BW/VL/VNNI, AVX2 and F16C.",
    dots,
    false
}

x16_entries! {
    /// [`with_multiply`]'s dots, picking the fifth bits by `vpshufbitqmb`.
    with_bitalg,
    with_bitalg_facts,
    "avx512f,avx512bw,avx512vl,avx512vnni,avx512bitalg,avx2,f16c",
    "The CPU must support AVX-512 F/BW/VL/VNNI/BITALG, AVX2 and F16C.",
    dots,
    true
}

/// The kernel, inlined into the wrappers above, whose target features its intrinsics take
/// (BITALG's only where `BITALG`); with `FACTS`, each activation block's d and Σ q come from
/// `facts` (`x16`), else from its bytes.
///
/// # Safety
/// Only called from those wrappers.
#[inline(always)]
unsafe fn dots<const N: usize, const BITALG: bool, const FACTS: bool>(
    g: &[u8],
    a: [&[u8]; N],
    facts: [ActFacts<'_>; N],
    out: &mut Dots<N>,
) {
    // No closures below: a closure does not inherit the target features.
    let m4 = _mm512_set1_epi8(0x0f);
    let low4 = _mm512_set1_epi32(0x0f);
    let spread = _mm512_set1_epi32(0x0020_4081);
    let bit0 = _mm512_set1_epi32(0x0101_0101);
    let sixteen = _mm512_set1_epi8(16);
    let zero = _mm512_setzero_si512();
    let mut lanes = [[_mm512_setzero_ps(); 4]; N];
    let blocks = Blocks::new(g, a, GROUP_BLOCK, Q8_0, "Q5_0");
    if FACTS {
        blocks.check_facts(&facts);
    }
    for (b, p, ap) in blocks {
        // SAFETY: d of the 16 rows (32 bytes at 0), their qh (64 at 32).
        let (dw, qh) = unsafe { (f16x16(p), _mm512_loadu_si512(p.add(32).cast())) };
        // Two chains for one row (shorter dependency chains), one a row for several.
        let mut acc = [[zero; 2]; N];
        for (q, picks) in PICKS.iter().enumerate() {
            // SAFETY: quad q of the 16 rows.
            let v = unsafe { _mm512_loadu_si512(p.add(96 + 64 * q).cast()) };
            let (lo, hi) = (
                _mm512_and_si512(v, m4),
                _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4),
            );
            let (lo, hi) = if BITALG {
                // SAFETY: `picks` is two 64-byte tables.
                let (pl, ph) = unsafe {
                    (
                        _mm512_loadu_si512(picks[0].as_ptr().cast()),
                        _mm512_loadu_si512(picks[1].as_ptr().cast()),
                    )
                };
                let (kl, kh) = (
                    _mm512_bitshuffle_epi64_mask(qh, pl),
                    _mm512_bitshuffle_epi64_mask(qh, ph),
                );
                (
                    _mm512_mask_add_epi8(lo, kl, lo, sixteen),
                    _mm512_mask_add_epi8(hi, kh, hi, sixteen),
                )
            } else {
                // Bits 4q..4q + 4 and 16 + 4q..16 + 4q + 4 of each row's qh, as 16 on the
                // bytes.
                let shift = _mm_cvtsi32_si128(4 * q as i32);
                let shift_hi = _mm_cvtsi32_si128(16 + 4 * q as i32);
                let b_lo = _mm512_and_si512(_mm512_srl_epi32(qh, shift), low4);
                let b_hi = _mm512_and_si512(_mm512_srl_epi32(qh, shift_hi), low4);
                let b_lo = _mm512_slli_epi32::<4>(_mm512_and_si512(
                    _mm512_mullo_epi32(b_lo, spread),
                    bit0,
                ));
                let b_hi = _mm512_slli_epi32::<4>(_mm512_and_si512(
                    _mm512_mullo_epi32(b_hi, spread),
                    bit0,
                ));
                (_mm512_or_si512(lo, b_lo), _mm512_or_si512(hi, b_hi))
            };
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
                _mm512_set1_epi32(16 * sa),
            );
            let v = _mm512_mul_ps(_mm512_mul_ps(dw, da), _mm512_cvtepi32_ps(s));
            lanes[t][b % 4] = _mm512_add_ps(lanes[t][b % 4], v);
        }
    }
    finish(&lanes, out);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The two ways to the fifth bits give the same dots on random groups and on groups of
    /// all-ones / all-zero bytes (every fifth bit set / clear), one and four activation rows,
    /// and so do both ways' forms reading the activations' facts from the side table.
    /// `tests/packed_exact.rs` holds the dispatched kernels to the scalar reference; this holds
    /// the paths the machine does not dispatch to the one it does. Controls: a wrong quad's
    /// table (PICKS[q] for q + 1) fails it (tried by hand); so does the multiply path's facts
    /// form reading Σ q + 1 (tried by hand, 2026-12-07).
    #[test]
    fn bitalg_picks_give_the_multiplys_dots() {
        if !crate::cpu_features::avx512_bitalg() {
            println!("SKIP: no AVX-512 BITALG here");
            return;
        }
        let blocks = 3;
        let mut seed = 0x9e37_79b9_u32;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            seed
        };
        for fill in [None, Some(0u8), Some(0xff)] {
            let mut g = vec![0u8; blocks * GROUP_BLOCK];
            for (i, x) in g.iter_mut().enumerate() {
                *x = fill.unwrap_or(next() as u8);
                // Finite, non-zero f16 scales in the first 32 bytes of each block.
                if i % GROUP_BLOCK < 32 && i % 2 == 1 {
                    *x = (*x & 0x3b) | 0x30;
                }
            }
            let rows: Vec<Vec<u8>> = (0..4)
                .map(|_| {
                    let mut r = vec![0u8; blocks * 34];
                    for (i, x) in r.iter_mut().enumerate() {
                        *x = if i % 34 == 1 { 0x3c } else { next() as u8 };
                    }
                    r
                })
                .collect();
            let a4 = [&rows[0][..], &rows[1], &rows[2], &rows[3]];
            let mut side = crate::simd::TileSide::default();
            assert!(side.fill_rows(minfer_gguf::GgmlType::Q8_0, &rows.concat(), blocks * 34));
            let f4: [ActFacts; 4] = std::array::from_fn(|t| {
                let (d, sums) = side.row(t);
                ActFacts { d, sums }
            });
            let (mut m4, mut b4) = ([[0f32; 16]; 4], [[0f32; 16]; 4]);
            let (mut m1, mut b1) = ([[0f32; 16]; 1], [[0f32; 16]; 1]);
            let (mut mf4, mut bf4) = ([[0f32; 16]; 4], [[0f32; 16]; 4]);
            let (mut mf1, mut bf1) = ([[0f32; 16]; 1], [[0f32; 16]; 1]);
            // SAFETY: BITALG (and so AVX-512 VNNI) confirmed above.
            unsafe {
                with_multiply::<4>(&g, a4, &mut m4);
                with_bitalg::<4>(&g, a4, &mut b4);
                with_multiply::<1>(&g, [&rows[1]], &mut m1);
                with_bitalg::<1>(&g, [&rows[1]], &mut b1);
                with_multiply_facts::<4>(&g, a4, f4, &mut mf4);
                with_bitalg_facts::<4>(&g, a4, f4, &mut bf4);
                with_multiply_facts::<1>(&g, [&rows[1]], [f4[1]], &mut mf1);
                with_bitalg_facts::<1>(&g, [&rows[1]], [f4[1]], &mut bf1);
            }
            let bits =
                |d: &[[f32; 16]]| -> Vec<u32> { d.iter().flatten().map(|x| x.to_bits()).collect() };
            assert_eq!(bits(&m4), bits(&b4), "fill {fill:?}, four rows");
            assert_eq!(bits(&m1), bits(&b1), "fill {fill:?}, one row");
            for (what, f4, f1) in [("multiply", &mf4, &mf1), ("bitalg", &bf4, &bf1)] {
                assert_eq!(
                    bits(&m4),
                    bits(f4),
                    "fill {fill:?}, four rows, {what} facts"
                );
                assert_eq!(bits(&m1), bits(f1), "fill {fill:?}, one row, {what} facts");
            }
            assert!(
                m4.iter().flatten().any(|x| *x != 0.0),
                "fill {fill:?}: all zero"
            );
        }
    }
}
