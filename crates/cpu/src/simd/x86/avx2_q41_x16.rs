//! The AVX2 decode and prefill kernel for Q4_1 rows packed 16 at a time
//! ([`crate::ops::matmul::packed`], `Layout::Q41X16`), the AVX2 form of `avx512_q41_x16`:
//! one or four Q8_1 activation rows against the 16 rows of a group, in two halves of 8 rows
//! (`avx2_x16`).
//!
//! Per 32-element block, exact integers as the reference's (`quants::legacy::dot_q4_1_q8_1`):
//! a 32-byte load holds the same 4 quant bytes of 8 rows; their low nibbles (0..15) meet 4
//! broadcast activations of the block's first half and their high nibbles 4 of its second
//! half in one `vpmaddubsw` each. A pair is at most 2 · 15 · 128 = 3840 in magnitude, so the
//! block's 8 `vpmaddubsw` sum in i16 to at most 30720 < 32767 before one `vpmaddwd`.
//!
//! The float part is the AVX-512 kernel's (the reference's), one row per lane, never fused:
//! (d_w · d_a) · s + m_w · s_a (s_a the activation block's stored sum), block b added into
//! block lane b % 4, the lanes combined as (0 + 2) + (1 + 3).
//!
//! Gate: `tests/split_exact.rs` (`packed_kernels_are_exact_on_every_isa`, and
//! `packed_matmul_is_exact_for_every_thread_count` under `MINFER_CPU_ISA=avx2`).

use std::arch::x86_64::*;

use super::avx2_x16::{bcast4, f16_lanes, f16x8, finish, load, per_half, widen};
use super::x16::{Blocks, Dots, Q8_1};

/// Bytes of one packed group's block (16 rows of 20 bytes).
const GROUP_BLOCK: usize = 320;

/// The 16 dots of the group `g` (`blocks · GROUP_BLOCK` bytes) with each of the `N` Q8_1
/// rows `a` (see `x16`).
///
/// # Safety
/// The CPU must support AVX2 and F16C.
// The half, token and lane indices also give byte offsets and walk several arrays in step.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn dot_q41_x16<const N: usize>(g: &[u8], a: [&[u8]; N], out: &mut Dots<N>) {
    // No closures below: a closure does not inherit the target features.
    let m4 = _mm256_set1_epi8(0x0f);
    let zero = _mm256_setzero_si256();
    let mut lanes = [[[_mm256_setzero_ps(); 4]; 2]; N];
    for (b, p, ap) in Blocks::new(g, a, GROUP_BLOCK, Q8_1, "Q4_1") {
        let mut da = [_mm256_setzero_ps(); N];
        let mut sa = [_mm256_setzero_ps(); N];
        for t in 0..N {
            // SAFETY: the activation's block has its d and s as f16 at 0 and 2.
            unsafe {
                da[t] = f16_lanes(ap[t]);
                sa[t] = f16_lanes(ap[t].add(2));
            }
        }
        for h in 0..2 {
            // SAFETY: d and m of rows 8h..8h + 8 (16 bytes at 16h and at 32 + 16h).
            let (dw, mw) = unsafe { (f16x8(p.add(16 * h)), f16x8(p.add(32 + 16 * h))) };
            // Two i16 chains for one row, one a row for several; together at most the
            // block's 8 `vpmaddubsw` (see the module docs).
            let mut acc = [[zero; 2]; N];
            let ap = per_half(ap);
            for q in 0..4 {
                // SAFETY: quad q of rows 8h..8h + 8.
                let v = unsafe { load(p.add(64 + 64 * q + 32 * h)) };
                let lo = _mm256_and_si256(v, m4);
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4);
                let c = if N == 1 { q % 2 } else { 0 };
                for t in 0..N {
                    // SAFETY: activation bytes 4q and 16 + 4q of the block's quants (at 4).
                    let (alo, ahi) =
                        unsafe { (bcast4(ap[t].add(4 + 4 * q)), bcast4(ap[t].add(20 + 4 * q))) };
                    acc[t][c] = _mm256_add_epi16(acc[t][c], _mm256_maddubs_epi16(lo, alo));
                    acc[t][c] = _mm256_add_epi16(acc[t][c], _mm256_maddubs_epi16(hi, ahi));
                }
            }
            for t in 0..N {
                let s = widen(_mm256_add_epi16(acc[t][0], acc[t][1]));
                let v = _mm256_add_ps(
                    _mm256_mul_ps(_mm256_mul_ps(dw, da[t]), _mm256_cvtepi32_ps(s)),
                    _mm256_mul_ps(mw, sa[t]),
                );
                lanes[t][h][b % 4] = _mm256_add_ps(lanes[t][h][b % 4], v);
            }
        }
    }
    finish(&lanes, out);
}
