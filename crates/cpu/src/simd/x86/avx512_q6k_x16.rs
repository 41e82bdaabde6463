//! The AVX-512 VNNI decode kernel for Q6_K rows packed 16 at a time
//! ([`crate::ops::matmul::packed`], `Layout::Q6kX16`): one Q8_K activation row against the 16
//! rows of a group, i32 / f32 lane r of every vector being row r.
//!
//! Per super-block, exact integers as the reference's (`quants::kquants::dot_q6_k_q8_k`):
//! the six-bit quants u (0..64) of the 16 rows are assembled from their `ql` and `qh` quads,
//! 4 at a time per lane, and meet 4 broadcast activations in one `vpdpbusd` (at most
//! 16 · 63 · 128 per 16-element sub-block). The reference's q = u - 32 is taken back per
//! sub-block as 32 · bsum (the activation's stored i16 sum of those 16 elements), and the
//! difference multiplied by the row's i8 scale (`vpmulld`) into isum: Σ_s sc_s · (Σ u·a -
//! 32 · bsum_s) = Σ_s sc_s · Σ q·a, at most 16 · 128 · 129024 in magnitude.
//!
//! The float part is the reference's, one row per lane, never fused: (d_w · d_a) · isum,
//! super-block b added into block lane b % 4, the lanes combined as (0 + 2) + (1 + 3).
//!
//! The group's bytes are laid out in the order this kernel reads them (a first layout with
//! `ql` and `qh` in two regions, read as three interleaved streams, ran the output matrix at
//! 7 GB/s; in reading order 26-27 GB/s), with no software prefetch (see the Q4_K kernel).
//!
//! Gate: `tests/split_exact.rs` (`packed_matmul_is_exact_for_every_thread_count`).

use std::arch::x86_64::*;

use super::avx512_x16::{bcast4, f16x16, f32_lanes, finish};
use super::x16::{Blocks, Dots, Q8K};

/// Bytes of one packed group's super-block (16 rows of 210 bytes).
const GROUP_BLOCK: usize = 3360;
/// Where the packed pieces start in a group's super-block.
const SCALES: usize = 32;
const TRIPLES: usize = 288;

/// `vpshufb` indices moving byte `k` of each i32 lane to its top byte (then an arithmetic
/// shift sign-extends it).
const fn byte_to_top(k: u8) -> [u8; 64] {
    let mut idx = [0x80u8; 64];
    let mut lane = 0;
    while lane < 16 {
        idx[4 * lane + 3] = 4 * (lane % 4) as u8 + k;
        lane += 1;
    }
    idx
}

const SCALE_IDX: [[u8; 64]; 4] = [
    byte_to_top(0),
    byte_to_top(1),
    byte_to_top(2),
    byte_to_top(3),
];

/// The 16 dots of the group `g` (`blocks · GROUP_BLOCK` bytes) with each of the `N` Q8_K
/// rows `a` (see `x16`).
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL/VNNI, AVX2 and F16C.
// Indices walk several arrays in step (sub-blocks of the scales, the sums and the tokens).
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
pub(crate) unsafe fn dot_q6k_x16<const N: usize>(g: &[u8], a: [&[u8]; N], out: &mut Dots<N>) {
    // No closures below: a closure does not inherit the target features.
    let m4 = _mm512_set1_epi8(0x0f);
    let m30 = _mm512_set1_epi8(0x30);
    let zero = _mm512_setzero_si512();
    let mut sidx = [zero; 4];
    for k in 0..4 {
        // SAFETY: each table row is 64 readable bytes.
        sidx[k] = unsafe { _mm512_loadu_si512(SCALE_IDX[k].as_ptr().cast()) };
    }
    let mut lanes = [[_mm512_setzero_ps(); 4]; N];
    for (b, p, ap) in Blocks::new(g, a, GROUP_BLOCK, Q8K, "Q6_K") {
        // SAFETY: offsets inside the super-block (see the layout).
        let (d, sw) = unsafe {
            let mut sw = [zero; 4];
            for (w, v) in sw.iter_mut().enumerate() {
                *v = _mm512_loadu_si512(p.add(SCALES + 64 * w).cast());
            }
            (f16x16(p), sw)
        };
        let mut isum = [zero; N];
        for n in 0..2 {
            for h in 0..2 {
                // Sub-blocks 8n + h, 8n + 2 + h, 8n + 4 + h, 8n + 6 + h: elements
                // 128n + 16h + 32i + [0, 16).
                let mut acc = [[zero; 4]; N];
                for g4 in 0..4 {
                    let gq = 4 * h + g4;
                    // SAFETY: triple 8n + gq of the 16 rows (ql quads 16n + gq and 16n + 8 + gq,
                    // qh quad 8n + gq), in the super-block.
                    let (la, lb, qh) = unsafe {
                        let t = p.add(TRIPLES + 192 * (8 * n + gq));
                        (
                            _mm512_loadu_si512(t.cast()),
                            _mm512_loadu_si512(t.add(64).cast()),
                            _mm512_loadu_si512(t.add(128).cast()),
                        )
                    };
                    let u = [
                        _mm512_or_si512(
                            _mm512_and_si512(la, m4),
                            _mm512_and_si512(_mm512_slli_epi16::<4>(qh), m30),
                        ),
                        _mm512_or_si512(
                            _mm512_and_si512(lb, m4),
                            _mm512_and_si512(_mm512_slli_epi16::<2>(qh), m30),
                        ),
                        _mm512_or_si512(
                            _mm512_and_si512(_mm512_srli_epi16::<4>(la), m4),
                            _mm512_and_si512(qh, m30),
                        ),
                        _mm512_or_si512(
                            _mm512_and_si512(_mm512_srli_epi16::<4>(lb), m4),
                            _mm512_and_si512(_mm512_srli_epi16::<2>(qh), m30),
                        ),
                    ];
                    for t in 0..N {
                        for i in 0..4 {
                            // SAFETY: activation bytes 128n + 4gq + 32i (+ 4 for d), in the
                            // block.
                            let av = unsafe { bcast4(ap[t].add(4 + 128 * n + 32 * i + 4 * gq)) };
                            acc[t][i] = _mm512_dpbusd_epi32(acc[t][i], u[i], av);
                        }
                    }
                }
                for i in 0..4 {
                    let s = 8 * n + 2 * i + h;
                    let sc = _mm512_srai_epi32::<24>(_mm512_shuffle_epi8(sw[s / 4], sidx[s % 4]));
                    for t in 0..N {
                        // SAFETY: bsum s is the i16 at 260 + 2s of the block.
                        let bsum = unsafe { ap[t].add(260 + 2 * s).cast::<i16>().read_unaligned() };
                        let dot = _mm512_sub_epi32(acc[t][i], _mm512_set1_epi32(32 * bsum as i32));
                        isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(dot, sc));
                    }
                }
            }
        }
        for t in 0..N {
            // SAFETY: the block's d is its first 4 bytes.
            let da = unsafe { f32_lanes(ap[t]) };
            let v = _mm512_mul_ps(_mm512_mul_ps(d, da), _mm512_cvtepi32_ps(isum[t]));
            lanes[t][b % 4] = _mm512_add_ps(lanes[t][b % 4], v);
        }
    }
    finish(&lanes, out);
}
