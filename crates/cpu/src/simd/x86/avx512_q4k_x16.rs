//! The AVX-512 VNNI decode kernel for Q4_K rows packed 16 at a time
//! ([`crate::ops::matmul::packed`], `Layout::Q4kX16`): one Q8_K activation row against the 16
//! rows of a group, i32 / f32 lane r of every vector being row r.
//!
//! Per super-block, exact integers as the reference's (`quants::kquants::dot_scale_min`):
//! - A 64-byte load holds the same 4 quant bytes of the 16 rows; their low nibbles meet 4
//!   activations of sub-block 2j (broadcast, 4 bytes) and their high nibbles 4 of sub-block
//!   2j + 1 in one `vpdpbusd` each: a sub-block's 32 products per row are 8 such steps (i32,
//!   at most 32 · 15 · 128). Each is multiplied by the row's six-bit scale (`vpmulld`) into
//!   isum.
//! - The scales and mins are unpacked for the 16 rows at once from the three packed words
//!   (the bit moves of `quants::unpack_scale_min_k4`), one byte per lane picked by `vpshufb`.
//! - msum = Σ_j bsum_j · mn_{j/2} over the activation's 16 stored i16 block sums, by one
//!   `vpdpwssd` per sub-block: the row's min twice as i16 against the pair of sums.
//!
//! The float part is the reference's, one row per lane, never fused: (d_w · d_a) · isum -
//! (dmin_w · d_a) · msum, super-block b added into block lane b % 4, the lanes combined as
//! (0 + 2) + (1 + 3).
//!
//! Memory: the packed group is one sequential stream in 2 MiB pages (`huge::HugeBytes`),
//! and each super-block's 36 lines are requested by software prefetches at the top of its
//! iteration, so that they are in flight together while the loads walk them (the compute of
//! one super-block fills the out-of-order window before its later loads issue). Measured on
//! the Zen 4 development machine (`benches/decode_matvec.rs`, the 1.5B shape, medians of 3;
//! docs/PERFORMANCE.md): no prefetch 10.0 GB/s, this super-block 18.8-25.0, from half a
//! super-block ahead 10.2, the next super-block 11.4; in 4 KiB pages 9-10 GB/s whatever the
//! distance, so the backend packs only where huge pages are available.
//!
//! Gate: `tests/split_exact.rs` (`packed_matmul_is_exact_for_every_thread_count`).

use std::arch::x86_64::*;

use super::avx512_x16::{bcast4, f16x16, f32_lanes, finish};
use super::x16::{Blocks, Dots, Q8K};

/// Bytes of one packed group's super-block (16 rows of 144 bytes).
const GROUP_BLOCK: usize = 2304;

/// `vpshufb` indices giving each i32 lane byte `k` of itself, zero-extended.
const fn byte_of_lane(k: u8, twice: bool) -> [u8; 64] {
    let mut idx = [0x80u8; 64];
    let mut lane = 0;
    while lane < 16 {
        let at = 4 * (lane % 4) as u8 + k;
        idx[4 * lane] = at;
        if twice {
            idx[4 * lane + 2] = at;
        }
        lane += 1;
    }
    idx
}

/// Byte k of each lane as an i32 (the scales), and as two i16 (the mins, for `vpdpwssd`).
const SCALE_IDX: [[u8; 64]; 4] = [
    byte_of_lane(0, false),
    byte_of_lane(1, false),
    byte_of_lane(2, false),
    byte_of_lane(3, false),
];
const MIN_IDX: [[u8; 64]; 4] = [
    byte_of_lane(0, true),
    byte_of_lane(1, true),
    byte_of_lane(2, true),
    byte_of_lane(3, true),
];

/// The 16 dots of the group `g` (`blocks · GROUP_BLOCK` bytes) with each of the `N` Q8_K
/// rows `a` (see `x16`).
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL/VNNI, AVX2 and F16C.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
pub(crate) unsafe fn dot_q4k_x16<const N: usize>(g: &[u8], a: [&[u8]; N], out: &mut Dots<N>) {
    // No closures below: a closure does not inherit the target features, so intrinsics in
    // one become calls.
    let m4 = _mm512_set1_epi8(0x0f);
    let six = _mm512_set1_epi32(0x3f3f_3f3f);
    let four = _mm512_set1_epi32(0x0f0f_0f0f);
    let top = _mm512_set1_epi32(0x3030_3030);
    let zero = _mm512_setzero_si512();
    let mut sidx = [zero; 4];
    let mut midx = [zero; 4];
    for k in 0..4 {
        // SAFETY: each table row is 64 readable bytes.
        sidx[k] = unsafe { _mm512_loadu_si512(SCALE_IDX[k].as_ptr().cast()) };
        midx[k] = unsafe { _mm512_loadu_si512(MIN_IDX[k].as_ptr().cast()) };
    }
    let mut lanes = [[_mm512_setzero_ps(); 4]; N];
    // Opaque to the optimiser: a constant bound let it unroll the prefetches and rotate them
    // to the end of the previous iteration, which measured as slow as no prefetch.
    let lines = std::hint::black_box(GROUP_BLOCK / 64);
    for (b, p, ap) in Blocks::new(g, a, GROUP_BLOCK, Q8K, "Q4_K") {
        // Every line of this super-block requested at once (see the module docs).
        for l in 0..lines {
            // SAFETY: `_mm_prefetch` never faults; the address is inside the super-block.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.add(64 * l).cast()) };
        }
        // SAFETY: offsets inside the super-block (see the layout).
        let (d, dmin, wa, wb, wc) = unsafe {
            (
                f16x16(p),
                f16x16(p.add(32)),
                _mm512_loadu_si512(p.add(64).cast()),
                _mm512_loadu_si512(p.add(128).cast()),
                _mm512_loadu_si512(p.add(192).cast()),
            )
        };
        // Per lane: scales 0..4, scales 4..8, mins 0..4, mins 4..8 (one byte each).
        let sl = _mm512_and_si512(wa, six);
        let sh = _mm512_or_si512(
            _mm512_and_si512(wc, four),
            _mm512_and_si512(_mm512_srli_epi32::<2>(wa), top),
        );
        let ml = _mm512_and_si512(wb, six);
        let mh = _mm512_or_si512(
            _mm512_and_si512(_mm512_srli_epi32::<4>(wc), four),
            _mm512_and_si512(_mm512_srli_epi32::<2>(wb), top),
        );
        let mut isum = [zero; N];
        let mut msum = [zero; N];
        for j in 0..4 {
            // For one row two chains per nibble half (even and odd quads), joined after:
            // shorter dependency chains of `vpdpbusd`; one a row for several.
            let mut lo = [[zero; 2]; N];
            let mut hi = [[zero; 2]; N];
            for q in 0..8 {
                // SAFETY: quad 8j + q of the 16 rows.
                let v = unsafe { _mm512_loadu_si512(p.add(256 + 64 * (8 * j + q)).cast()) };
                let vl = _mm512_and_si512(v, m4);
                let vh = _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4);
                let c = if N == 1 { q % 2 } else { 0 };
                for t in 0..N {
                    // SAFETY: activation bytes 64j + 4q and 64j + 32 + 4q (+ 4 for d), inside
                    // the block.
                    let (alo, ahi) = unsafe {
                        (
                            bcast4(ap[t].add(4 + 64 * j + 4 * q)),
                            bcast4(ap[t].add(4 + 64 * j + 32 + 4 * q)),
                        )
                    };
                    lo[t][c] = _mm512_dpbusd_epi32(lo[t][c], vl, alo);
                    hi[t][c] = _mm512_dpbusd_epi32(hi[t][c], vh, ahi);
                }
            }
            let (s0, s1) = (2 * j, 2 * j + 1);
            let src0 = if s0 < 4 { sl } else { sh };
            let src1 = if s1 < 4 { sl } else { sh };
            let sc0 = _mm512_shuffle_epi8(src0, sidx[s0 % 4]);
            let sc1 = _mm512_shuffle_epi8(src1, sidx[s1 % 4]);
            for t in 0..N {
                isum[t] = _mm512_add_epi32(
                    isum[t],
                    _mm512_mullo_epi32(_mm512_add_epi32(lo[t][0], lo[t][1]), sc0),
                );
                isum[t] = _mm512_add_epi32(
                    isum[t],
                    _mm512_mullo_epi32(_mm512_add_epi32(hi[t][0], hi[t][1]), sc1),
                );
            }
        }
        for s in 0..8 {
            let src = if s < 4 { ml } else { mh };
            let mn = _mm512_shuffle_epi8(src, midx[s % 4]);
            for t in 0..N {
                // SAFETY: bsums 2s and 2s + 1 (4 bytes at 260 + 4s of the block).
                let bs = unsafe { bcast4(ap[t].add(260 + 4 * s)) };
                msum[t] = _mm512_dpwssd_epi32(msum[t], mn, bs);
            }
        }
        for t in 0..N {
            // SAFETY: the block's d is its first 4 bytes.
            let da = unsafe { f32_lanes(ap[t]) };
            let v = _mm512_sub_ps(
                _mm512_mul_ps(_mm512_mul_ps(d, da), _mm512_cvtepi32_ps(isum[t])),
                _mm512_mul_ps(_mm512_mul_ps(dmin, da), _mm512_cvtepi32_ps(msum[t])),
            );
            lanes[t][b % 4] = _mm512_add_ps(lanes[t][b % 4], v);
        }
    }
    finish(&lanes, out);
}
