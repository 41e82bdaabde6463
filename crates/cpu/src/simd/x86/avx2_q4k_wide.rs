//! The AVX2 prompt form of the Q4_K packed kernel (`avx2_q4k_x16`, [`crate::simd::X16Wide`]):
//! a packed group is expanded once ([`expand`]) into what its kernel builds from the packed
//! bytes for every four tokens, laid out so that one activation broadcast serves four
//! vectors, and [`dots`] reads it for every four activation rows.
//!
//! Why: the packed kernel splits each quad's nibbles (three instructions per 32 bytes of 8
//! rows) and unpacks the rows' six-bit scales and mins for every four tokens, and meets each
//! 8-row vector with its own 4-byte broadcast of the activations (docs/PERFORMANCE.md,
//! sessions 26 and 27). In a prompt every group meets every token.
//!
//! The expansion of a super-block ([`WIDE_BLOCK`] bytes, 2.2 times the packed 2304) is per
//! half h (rows 8h..8h + 8) at h · [`HALF`]: the 8 rows' d, then their dmin, as f32 (the
//! exact conversions of the f16); at [`SCALES`] + 32s sub-block s's six-bit scale of row r
//! in both i16 of lane r (the packed kernel's `vpmaddwd` operand); at [`MINS`] + 32k the
//! mins of sub-blocks 2k and 2k + 1 of row r in the two i16 of lane r. After both halves,
//! at [`QUANTS`] + 32 (16s + 4c + 2h + g), the nibbles (one a byte) of elements 8c..8c + 8
//! of sub-block s of the half's 8 rows, row r in lane r as in the packed kernel, but 4 of
//! each row's 8 in vector g = 0 and the other 4 in g = 1: vector 0 holds elements 8c..8c + 4
//! in the even lanes and 8c + 4..8c + 8 in the odd ones, vector 1 the other way round. So
//! one 8-byte broadcast of the activations (elements 8c..8c + 4 in the even lanes, the next
//! 4 in the odd ones) meets vector 0 of both halves, and the same broadcast with the two
//! i32 of each 64-bit lane swapped (`vpshufd`) vector 1: two instructions a token for four
//! `vpmaddubsw`, where the packed kernel broadcasts once for each.
//!
//! [`dots`] takes two tokens a pass over both halves (4 i16 accumulators). Per sub-block and
//! half, a row's lane sums the 8 `vpmaddubsw` pairs of its 32 products in i16, as the packed
//! kernel's (pairs at most 2 · 15 · 128 = 3840 in magnitude: Q8_K activations reach -128;
//! 8 of them at most 30720 < 32767), and one `vpmaddwd` against the scale adds sc · Σ q·a
//! of the sub-block into isum: the packed kernel's exact integer. msum = Σ_j bsum_j ·
//! mn_{j/2} is summed as Σ_k (mn_2k · B_2k + mn_2k+1 · B_2k+1) with B_s = bsum_2s +
//! bsum_2s+1 (at most 2 · 16 · 128 in magnitude, `vphaddw` of the stored i16 sums, each
//! pair put in every lane by `vpermd`), one `vpmaddwd` for two sub-blocks: the same exact
//! integer. The float part is the packed kernel's, one row per lane, never fused: (d_w ·
//! d_a) · isum - (dmin_w · d_a) · msum, super-block b added into block lane b % 4, the lanes
//! combined as (0 + 2) + (1 + 3). So each dot is the packed kernel's, which is the
//! reference's. The activations' facts are not read (Q8_K carries its own block sums).
//!
//! Gate: `tests/packed_exact.rs` (`packed_kernels_are_exact_on_every_isa` expands every
//! group it checks and holds this form to the reference too; the matmul tests with
//! [`FROM`] tokens and more take this path).

use std::arch::x86_64::*;

use super::avx2_q4k_x16::{scales_mins, BYTE_IDX, GROUP_BLOCK};
use super::avx2_x16::{bcast8, f16x8, finish, lane_bytes, load, q8k_d, table};
use super::x16::{Blocks, Dots, Q8K};
use crate::simd::ActFacts;

/// Bytes k and k + 1 of each lane as its two i16, zero-extended (mins 2k and 2k + 1 of a
/// row, for `vpmaddwd` against two activation pair sums).
const PAIR_IDX: [[u8; 32]; 2] = [lane_bytes(0, 1, 0), lane_bytes(2, 3, 0)];

/// Lanes 0, 1, 4 and 5 of a vector, each in every lane (`vpermd` indices).
const PAIR_LANE: [i32; 4] = [0, 1, 4, 5];

/// Tokens from which a matmul takes this form: expanding a group (k = 4864: ~1.2 µs on the
/// Zen 4 VM) costs what [`dots`] saves over the packed kernel on ~12 tokens (~0.1 µs a
/// token; docs/PERFORMANCE.md, session 27).
pub(super) const FROM: usize = 16;

/// [`dots`] does not read the activations' facts.
pub(super) const FACTS: bool = false;

/// Where the pieces of a half's expansion start (after its 8 d and 8 dmin), and its size.
const SCALES: usize = 64;
const MINS: usize = SCALES + 8 * 32;
const HALF: usize = MINS + 4 * 32;
/// Where the quants of a super-block's expansion start (after both halves).
const QUANTS: usize = 2 * HALF;

/// Bytes of one super-block's expansion.
pub(super) const WIDE_BLOCK: usize = QUANTS + 128 * 32;

/// Expands the packed Q4_K group `g` into `e` (see the module docs); panics unless `g` is
/// whole packed super-blocks and `e` holds [`WIDE_BLOCK`] bytes for each.
///
/// # Safety
/// The CPU must support AVX2 and F16C.
// The sub-block and quad indices also give byte offsets.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn expand(g: &[u8], e: &mut [u8]) {
    let blocks = g.len() / GROUP_BLOCK;
    assert!(
        g.len() == blocks * GROUP_BLOCK && e.len() == blocks * WIDE_BLOCK,
        "a packed Q4_K group of {} bytes into {} bytes",
        g.len(),
        e.len()
    );
    let m4 = _mm256_set1_epi8(0x0f);
    let idx: [__m256i; 4] = std::array::from_fn(|k| table(&BYTE_IDX[k]));
    let pidx = [table(&PAIR_IDX[0]), table(&PAIR_IDX[1])];
    for (p, o) in g
        .chunks_exact(GROUP_BLOCK)
        .zip(e.chunks_exact_mut(WIDE_BLOCK))
    {
        let (p, o) = (p.as_ptr(), o.as_mut_ptr());
        for h in 0..2 {
            // SAFETY: offsets inside the packed super-block (see `avx2_q4k_x16`: d at 16h,
            // dmin at 32 + 16h, the scale words at 64, 128 and 192 (+ 32h), quad q of
            // sub-blocks 2j and 2j + 1 at 256 + 64 (8j + q) + 32h), rows 8h..8h + 8; the
            // expansion's half at HALF · h holds HALF bytes, its quants 128 vectors at
            // QUANTS.
            unsafe {
                let half = o.add(HALF * h);
                _mm256_storeu_ps(half.cast(), f16x8(p.add(16 * h)));
                _mm256_storeu_ps(half.add(32).cast(), f16x8(p.add(32 + 16 * h)));
                let [sl, sh, ml, mh] = scales_mins(
                    load(p.add(64 + 32 * h)),
                    load(p.add(128 + 32 * h)),
                    load(p.add(192 + 32 * h)),
                );
                for s in 0..8 {
                    let sc = _mm256_shuffle_epi8(if s < 4 { sl } else { sh }, idx[s % 4]);
                    _mm256_storeu_si256(half.add(SCALES + 32 * s).cast(), sc);
                }
                for k in 0..4 {
                    let mn = _mm256_shuffle_epi8(if k < 2 { ml } else { mh }, pidx[k % 2]);
                    _mm256_storeu_si256(half.add(MINS + 32 * k).cast(), mn);
                }
                for j in 0..4 {
                    // Lane r of nib[n][q]: row 8h + r's elements 4q..4q + 4 of sub-block
                    // 2j + n.
                    let mut nib = [[_mm256_setzero_si256(); 8]; 2];
                    for q in 0..8 {
                        let v = load(p.add(256 + 64 * (8 * j + q) + 32 * h));
                        nib[0][q] = _mm256_and_si256(v, m4);
                        nib[1][q] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4);
                    }
                    for n in 0..2 {
                        let s = 2 * j + n;
                        // Quads 2c and 2c + 1 (elements 8c.. and 8c + 4..): vector 0 takes
                        // the even lanes of the first and the odd of the second, vector 1
                        // the rest.
                        for c in 0..4 {
                            let (a, b) = (nib[n][2 * c], nib[n][2 * c + 1]);
                            let at = o.add(QUANTS + 32 * (16 * s + 4 * c + 2 * h));
                            _mm256_storeu_si256(at.cast(), _mm256_blend_epi32::<0xaa>(a, b));
                            _mm256_storeu_si256(
                                at.add(32).cast(),
                                _mm256_blend_epi32::<0xaa>(b, a),
                            );
                        }
                    }
                }
            }
        }
    }
}

/// The 16 dots of the expanded group `e` with each of the `N` Q8_K rows `a` (`_facts`
/// unread; see [`pass`]), by passes of two tokens (one for an odd last token).
///
/// # Safety
/// The CPU must support AVX2 and F16C.
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn dots<const N: usize>(
    e: &[u8],
    a: [&[u8]; N],
    _facts: [ActFacts<'_>; N],
    out: &mut Dots<N>,
) {
    let mut t = 0;
    while t < N {
        // SAFETY: the caller's.
        unsafe {
            if N - t >= 2 {
                let mut o = [[0f32; 16]; 2];
                pass::<2>(e, [a[t], a[t + 1]], &mut o);
                out[t..t + 2].copy_from_slice(&o);
                t += 2;
            } else {
                pass::<1>(e, [a[t]], std::array::from_mut(&mut out[t]));
                t += 1;
            }
        }
    }
}

/// The 16 dots of the expanded group `e` ([`expand`]) with each of the `N` Q8_K rows `a`:
/// the bits of `avx2_q4k_x16::dot_q4k_x16` on the packed group.
///
/// # Safety
/// The CPU must support AVX2 and F16C.
// The half, group, token and lane indices also give byte offsets and walk several arrays in
// step.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,f16c")]
unsafe fn pass<const N: usize>(e: &[u8], a: [&[u8]; N], out: &mut Dots<N>) {
    let zero = _mm256_setzero_si256();
    let mut lanes = [[[_mm256_setzero_ps(); 4]; 2]; N];
    for (b, p, ap) in Blocks::new(e, a, WIDE_BLOCK, Q8K, "expanded Q4_K") {
        // SAFETY: each of `ap` starts a whole Q8_K block.
        let da = unsafe { q8k_d(&ap) };
        let mut isum = [[zero; 2]; N];
        for s in 0..8 {
            let mut acc = [[zero; 2]; N];
            for c in 0..4 {
                // No closure here: one does not inherit the target features.
                let mut x = [[zero; 2]; N];
                for t in 0..N {
                    // SAFETY: activation bytes 32s + 8c..32s + 8c + 8 (+ 4 for d), in the
                    // block.
                    let v = unsafe { bcast8(ap[t].add(4 + 32 * s + 8 * c)) };
                    x[t] = [v, _mm256_shuffle_epi32::<0xb1>(v)];
                }
                for h in 0..2 {
                    for g in 0..2 {
                        // SAFETY: vector g of half h, sub-block s, chunk c.
                        let v = unsafe { load(p.add(QUANTS + 32 * (16 * s + 4 * c + 2 * h + g))) };
                        for t in 0..N {
                            let m = _mm256_maddubs_epi16(v, x[t][g]);
                            acc[t][h] = _mm256_add_epi16(acc[t][h], m);
                        }
                    }
                }
            }
            for h in 0..2 {
                // SAFETY: sub-block s's scale vector of half h.
                let sc = unsafe { load(p.add(HALF * h + SCALES + 32 * s)) };
                for t in 0..N {
                    isum[t][h] = _mm256_add_epi32(isum[t][h], _mm256_madd_epi16(acc[t][h], sc));
                }
            }
        }
        // Each token's pair sums B_s = bsum_2s + bsum_2s+1 (at most 2 · 16 · 128 in
        // magnitude), (B_2k, B_2k+1) in i32 lanes 0, 1, 4, 5 for k = 0..4.
        let mut pairs = [zero; N];
        for t in 0..N {
            // SAFETY: the 16 i16 bsums (32 bytes at 260 of the block).
            let bs = unsafe { load(ap[t].add(260)) };
            pairs[t] = _mm256_hadd_epi16(bs, bs);
        }
        let mut msum = [[zero; 2]; N];
        for k in 0..4 {
            let lane = _mm256_set1_epi32(PAIR_LANE[k]);
            // SAFETY: the min pair vectors of sub-blocks 2k and 2k + 1 of both halves.
            let mn = unsafe {
                [
                    load(p.add(MINS + 32 * k)),
                    load(p.add(HALF + MINS + 32 * k)),
                ]
            };
            for t in 0..N {
                let b = _mm256_permutevar8x32_epi32(pairs[t], lane);
                for h in 0..2 {
                    msum[t][h] = _mm256_add_epi32(msum[t][h], _mm256_madd_epi16(mn[h], b));
                }
            }
        }
        for h in 0..2 {
            // SAFETY: the 8 f32 d and 8 f32 dmin of half h.
            let (d, dmin) = unsafe {
                let at = p.add(HALF * h);
                (
                    _mm256_loadu_ps(at.cast()),
                    _mm256_loadu_ps(at.add(32).cast()),
                )
            };
            for t in 0..N {
                let v = _mm256_sub_ps(
                    _mm256_mul_ps(_mm256_mul_ps(d, da[t]), _mm256_cvtepi32_ps(isum[t][h])),
                    _mm256_mul_ps(_mm256_mul_ps(dmin, da[t]), _mm256_cvtepi32_ps(msum[t][h])),
                );
                lanes[t][h][b % 4] = _mm256_add_ps(lanes[t][h][b % 4], v);
            }
        }
    }
    finish(&lanes, out);
}
