//! The AVX2 prompt form of the Q5_0 packed kernel (`avx2_q50_x16`, [`crate::simd::X16Wide`]):
//! a packed group is expanded once ([`expand`]) into the unsigned 5-bit quants its kernel
//! builds, and [`dots`] reads them for every four activation rows.
//!
//! Why: in a prompt every group of 16 rows meets every token, four at a time. The packed
//! kernel builds each quad's q5 = q + 16 · fifth bit anew for each four tokens (per 32 bytes
//! of 8 rows: the nibble split and, for the fifth bits, two `vpshufb`, two tests and two
//! masks): about as many instructions as the four tokens' own `vpmaddubsw` work, which on
//! AVX2 (two instructions a product vector where AVX-512 VNNI has one `vpdpbusd`) made Q5_0
//! half of the demo model's AVX2 prefill (docs/PERFORMANCE.md, session 26). Built once a
//! group, they cost one pass for all the tokens of the call.
//!
//! The expansion of a block ([`WIDE_BLOCK`] bytes, 1.6 times the packed block's 352) is per
//! half h (rows 8h..8h + 8) at 288h: the 8 rows' d as f32 (the exact conversion of the f16),
//! then per 8 elements 8c..8c + 8 (c = 0..4: low nibbles for c < 2, high ones after) two
//! vectors of 4 rows each: at 32 + 64c rows 0, 1, 4, 5 and at 64 + 64c rows 2, 3, 6, 7, row
//! i of a vector in i32 lanes 2i (its elements 8c..8c + 4) and 2i + 1 (8c + 4..8c + 8). So
//! one 8-byte broadcast of the activations meets 4 rows' 8 elements in one `vpmaddubsw`
//! (half the broadcasts of the packed kernel's 4-byte ones, which on the Zen 4 VM cost more
//! than the loads they replace), and `vphaddd` of a row group's two sums gives rows 0..8 in
//! lane order.
//!
//! [`dots`] is the packed kernel's facts form without the unpacking, two tokens a pass over
//! the block's two halves (each 8-byte broadcast serves 4 `vpmaddubsw`; 8 i16 accumulators):
//! the same `vpmaddubsw` pairs (at most 2 · 31 · 128 = 7936 in magnitude, 4 summed in i16: at
//! most 31744), widened by `vpmaddwd` and `vphaddd` (exact), Σ q·a = Σ q5·a - 16 · Σ a with
//! Σ a and d from the side table, then the reference's float steps per row lane, never
//! fused: (d_w · d_a) · s, block b added into block lane b % 4, the lanes combined as
//! (0 + 2) + (1 + 3). So each dot is the packed kernel's, which is the reference's.
//!
//! Gate: `tests/packed_exact.rs` (`packed_kernels_are_exact_on_every_isa` expands every
//! group it checks and holds this form to the reference too; the matmul tests with 8 tokens
//! and more take this path).

use std::arch::x86_64::*;

use super::avx2_q50_x16::{fifth_bits, GROUP_BLOCK, SPREAD};
use super::avx2_x16::{bcast8, f16x8, finish, load, q8_0_facts, widen};
use super::x16::{Blocks, Dots, Q8_0};
use crate::simd::ActFacts;

/// Bytes of one block's expansion: per half, 8 f32 scales and 8 vectors of 32 bytes.
pub(super) const WIDE_BLOCK: usize = 2 * HALF;

/// Tokens from which a matmul takes this form (expanding a group costs about one pass of the
/// packed kernel's unpacking, which the expansion saves on every further four tokens).
pub(super) const FROM: usize = 8;

/// [`dots`] reads each activation block's d and Σ q from the rows' facts.
pub(super) const FACTS: bool = true;

/// Bytes of one half's expansion.
const HALF: usize = 32 + 8 * 32;

/// Expands the packed Q5_0 group `g` into `e` (see the module docs); panics unless `g` is
/// whole packed blocks and `e` holds [`WIDE_BLOCK`] bytes for each.
///
/// # Safety
/// The CPU must support AVX2 and F16C.
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn expand(g: &[u8], e: &mut [u8]) {
    let blocks = g.len() / GROUP_BLOCK;
    assert!(
        g.len() == blocks * GROUP_BLOCK && e.len() == blocks * WIDE_BLOCK,
        "a packed Q5_0 group of {} bytes into {} bytes",
        g.len(),
        e.len()
    );
    let m4 = _mm256_set1_epi8(0x0f);
    let bits = [
        _mm256_set1_epi32(0x0804_0201),
        _mm256_set1_epi32(0x8040_2010u32 as i32),
    ];
    // SAFETY: each table row is 32 readable bytes.
    let spread: [__m256i; 4] = std::array::from_fn(|k| unsafe { load(SPREAD[k].as_ptr()) });
    for (p, o) in g
        .chunks_exact(GROUP_BLOCK)
        .zip(e.chunks_exact_mut(WIDE_BLOCK))
    {
        let (p, o) = (p.as_ptr(), o.as_mut_ptr());
        for h in 0..2 {
            // SAFETY: the packed block's d of rows 8h..8h + 8 (16 bytes at 16h), their qh
            // words (32 at 32 + 32h), its quads (64 at 96 + 64q); the expansion's half at
            // HALF · h holds 32 + 8 · 32 bytes.
            unsafe {
                let o = o.add(HALF * h);
                _mm256_storeu_ps(o.cast(), f16x8(p.add(16 * h)));
                let qh = load(p.add(32 + 32 * h));
                let mut u = [_mm256_setzero_si256(); 8];
                for q in 0..4 {
                    let v = load(p.add(96 + 64 * q + 32 * h));
                    let b_lo = fifth_bits(_mm256_shuffle_epi8(qh, spread[q / 2]), bits[q % 2]);
                    let b_hi = fifth_bits(_mm256_shuffle_epi8(qh, spread[2 + q / 2]), bits[q % 2]);
                    u[q] = _mm256_or_si256(_mm256_and_si256(v, m4), b_lo);
                    u[4 + q] =
                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(v), m4), b_hi);
                }
                // u[c] lane r: row r's elements 4c..4c + 4. The vector at 32 + 64 c2 + 32 g:
                // lanes 2i + j of row group g's row i (0, 1, 4, 5 or 2, 3, 6, 7), elements
                // 8 c2 + 4j.. (the i32 unpacks take lanes 0, 1 and 4, 5 of each, or 2, 3
                // and 6, 7).
                for c2 in 0..4 {
                    let (a, b) = (u[2 * c2], u[2 * c2 + 1]);
                    _mm256_storeu_si256(o.add(32 + 64 * c2).cast(), _mm256_unpacklo_epi32(a, b));
                    _mm256_storeu_si256(o.add(64 + 64 * c2).cast(), _mm256_unpackhi_epi32(a, b));
                }
            }
        }
    }
}

/// The 16 dots of the expanded group `e` with each of the `N` Q8_0 rows `a` (see [`pass`]),
/// by passes of two tokens (one for an odd last token).
///
/// # Safety
/// The CPU must support AVX2 and F16C.
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn dots<const N: usize>(
    e: &[u8],
    a: [&[u8]; N],
    facts: [ActFacts<'_>; N],
    out: &mut Dots<N>,
) {
    let mut t = 0;
    while t < N {
        let n = if N - t >= 2 { 2 } else { 1 };
        // SAFETY: the caller's.
        unsafe {
            if n == 2 {
                let mut o = [[0f32; 16]; 2];
                pass::<2>(e, [a[t], a[t + 1]], [facts[t], facts[t + 1]], &mut o);
                out[t] = o[0];
                out[t + 1] = o[1];
            } else {
                let mut o = [[0f32; 16]; 1];
                pass::<1>(e, [a[t]], [facts[t]], &mut o);
                out[t] = o[0];
            }
        }
        t += n;
    }
}

/// The 16 dots of the expanded group `e` ([`expand`]) with each of the `N` Q8_0 rows `a`,
/// each activation block's d and Σ q read from the rows' `facts`: the bits of
/// `avx2_q50_x16::dot_q50_x16_facts` on the packed group.
///
/// # Safety
/// The CPU must support AVX2 and F16C.
// The half, token and lane indices also give byte offsets and walk several arrays in step.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,f16c")]
unsafe fn pass<const N: usize>(
    e: &[u8],
    a: [&[u8]; N],
    facts: [ActFacts<'_>; N],
    out: &mut Dots<N>,
) {
    let zero = _mm256_setzero_si256();
    let mut lanes = [[[_mm256_setzero_ps(); 4]; 2]; N];
    let blocks = Blocks::new(e, a, WIDE_BLOCK, Q8_0, "expanded Q5_0");
    blocks.check_facts(&facts);
    for (b, p, ap) in blocks {
        // SAFETY: `check_facts` accepted the facts for these blocks.
        let (sa, da) = unsafe { q8_0_facts(&facts, b) };
        let mut acc = [[[zero; 2]; 2]; N];
        for c2 in 0..4 {
            // SAFETY: the two vectors of elements 8 c2.. of each half.
            let v = unsafe {
                [
                    [load(p.add(32 + 64 * c2)), load(p.add(64 + 64 * c2))],
                    [
                        load(p.add(HALF + 32 + 64 * c2)),
                        load(p.add(HALF + 64 + 64 * c2)),
                    ],
                ]
            };
            for t in 0..N {
                // SAFETY: activation bytes 8 c2..8 c2 + 8 of the block's quants (at 2).
                let x = unsafe { bcast8(ap[t].add(2 + 8 * c2)) };
                for h in 0..2 {
                    for g in 0..2 {
                        acc[t][h][g] =
                            _mm256_add_epi16(acc[t][h][g], _mm256_maddubs_epi16(v[h][g], x));
                    }
                }
            }
        }
        for h in 0..2 {
            // SAFETY: the 8 f32 scales of half h.
            let dw = unsafe { _mm256_loadu_ps(p.add(HALF * h).cast()) };
            for t in 0..N {
                // Lane r: row r's 32 products (`vphaddd` of rows 0, 1, 4, 5 and 2, 3, 6, 7
                // gives 0..8).
                let sum = _mm256_hadd_epi32(widen(acc[t][h][0]), widen(acc[t][h][1]));
                let s = _mm256_sub_epi32(sum, _mm256_set1_epi32(16 * sa[t]));
                let v = _mm256_mul_ps(_mm256_mul_ps(dw, da[t]), _mm256_cvtepi32_ps(s));
                lanes[t][h][b % 4] = _mm256_add_ps(lanes[t][h][b % 4], v);
            }
        }
    }
    finish(&lanes, out);
}
