//! The AVX2 prompt form of the Q6_K packed kernel (`avx2_q6k_x16`, [`crate::simd::X16Wide`]):
//! a packed group is expanded once ([`expand`]) into what its kernel builds from the packed
//! bytes for every four tokens (the six-bit quants u = 0..64 from their `ql` and `qh` quads,
//! five instructions per 32 bytes of 8 rows; each sub-block scale sign-extended into the i16
//! lanes of its row, two more), and [`dots`] reads them: in a prompt every group meets every
//! token, and that unpacking was about a third of the kernel's instructions with four tokens
//! a call (docs/PERFORMANCE.md, session 26).
//!
//! The expansion of a super-block ([`WIDE_BLOCK`] bytes, 1.7 times the packed 3360) is per
//! half h (rows 8h..8h + 8) at h · [`HALF`]: the 8 rows' d as f32 (the exact conversion of
//! the f16); at [`PAIRS`] + 32 (2w + k) the scales of sub-blocks 4w + 2k and 4w + 2k + 1 in
//! the two i16 of each row's lane (the offsets' `vpmaddwd` operand); at [`SUBS`] + 32s
//! sub-block s's scale in both i16 of each row's lane; at [`QUANTS`] + 64 (16n + 4m + i) +
//! 32j the u of elements 128n + 32i + 8m + 4j.. (4 a lane) of each row: the vectors the
//! packed kernel's registers hold, in the order it uses them.
//!
//! [`dots`] is the packed kernel without the unpacking (its per-token steps are the packed
//! kernel's own functions, `add_offsets`, `add_products` and `add_block`): the same integers (two `vpmaddubsw`
//! of a sub-block summed in i16, at most 2 · 2 · 63 · 128 = 32256; `vpmaddwd` against the
//! scale; the -32 offset taken back once a super-block as 32 · Σ_s sc_s · bsum_s) and the
//! same float steps, one row per lane, never fused: (d_w · d_a) · isum, super-block b added
//! into block lane b % 4, the lanes combined as (0 + 2) + (1 + 3). So each dot is the packed
//! kernel's, which is the reference's. The activations' facts are not read (Q8_K carries its
//! own block sums).
//!
//! Gate: `tests/packed_exact.rs` (`packed_kernels_are_exact_on_every_isa` expands every
//! group it checks and holds this form to the reference too; the matmul tests with 8 tokens
//! and more take this path).

use std::arch::x86_64::*;

use super::avx2_q6k_x16::{
    add_block, add_offsets, add_products, six_bits, GROUP_BLOCK, PAIR_IDX, SCALES, SCALE_IDX,
    TRIPLES,
};
use super::avx2_x16::{f16x8, finish, load, q8k_d, table};
use super::x16::{Blocks, Dots, Q8K};
use crate::simd::ActFacts;

/// Tokens from which a matmul takes this form (expanding a group costs about one pass of the
/// packed kernel's unpacking, which the expansion saves on every further four tokens).
pub(super) const FROM: usize = 8;

/// [`dots`] does not read the activations' facts.
pub(super) const FACTS: bool = false;

/// Where the pieces of a half's expansion start, and its size.
const PAIRS: usize = 32;
const SUBS: usize = PAIRS + 8 * 32;
const QUANTS: usize = SUBS + 16 * 32;
const HALF: usize = QUANTS + 64 * 32;

/// Bytes of one super-block's expansion.
pub(super) const WIDE_BLOCK: usize = 2 * HALF;

/// Expands the packed Q6_K group `g` into `e` (see the module docs); panics unless `g` is
/// whole packed super-blocks and `e` holds [`WIDE_BLOCK`] bytes for each.
///
/// # Safety
/// The CPU must support AVX2 and F16C.
// The word, pair and quad indices also give byte offsets.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn expand(g: &[u8], e: &mut [u8]) {
    let blocks = g.len() / GROUP_BLOCK;
    assert!(
        g.len() == blocks * GROUP_BLOCK && e.len() == blocks * WIDE_BLOCK,
        "a packed Q6_K group of {} bytes into {} bytes",
        g.len(),
        e.len()
    );
    let sidx: [__m256i; 4] = std::array::from_fn(|k| table(&SCALE_IDX[k]));
    let pidx = [table(&PAIR_IDX[0]), table(&PAIR_IDX[1])];
    for (p, o) in g
        .chunks_exact(GROUP_BLOCK)
        .zip(e.chunks_exact_mut(WIDE_BLOCK))
    {
        let (p, o) = (p.as_ptr(), o.as_mut_ptr());
        for h in 0..2 {
            // SAFETY: offsets inside the packed super-block (see `avx2_q6k_x16`), rows
            // 8h..8h + 8; the expansion's half at HALF · h holds HALF bytes.
            unsafe {
                let o = o.add(HALF * h);
                _mm256_storeu_ps(o.cast(), f16x8(p.add(16 * h)));
                let sw: [__m256i; 4] =
                    std::array::from_fn(|w| load(p.add(SCALES + 64 * w + 32 * h)));
                for w in 0..4 {
                    for k in 0..2 {
                        let sc = _mm256_srai_epi16::<8>(_mm256_shuffle_epi8(sw[w], pidx[k]));
                        _mm256_storeu_si256(o.add(PAIRS + 32 * (2 * w + k)).cast(), sc);
                    }
                }
                for s in 0..16 {
                    let sc = _mm256_srai_epi16::<8>(_mm256_shuffle_epi8(sw[s / 4], sidx[s % 4]));
                    _mm256_storeu_si256(o.add(SUBS + 32 * s).cast(), sc);
                }
                for n in 0..2 {
                    for m in 0..4 {
                        let t0 = p.add(TRIPLES + 192 * (8 * n + 2 * m) + 32 * h);
                        let t1 = t0.add(192);
                        let tr = [
                            [load(t0), load(t0.add(64)), load(t0.add(128))],
                            [load(t1), load(t1.add(64)), load(t1.add(128))],
                        ];
                        for i in 0..4 {
                            let at = o.add(QUANTS + 64 * (16 * n + 4 * m + i));
                            for (j, tr) in tr.iter().enumerate() {
                                let u = six_bits(i, tr[0], tr[1], tr[2]);
                                _mm256_storeu_si256(at.add(32 * j).cast(), u);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The 16 dots of the expanded group `e` ([`expand`]) with each of the `N` Q8_K rows `a`
/// (`_facts` unread): the bits of `avx2_q6k_x16::dot_q6k_x16` on the packed group.
///
/// # Safety
/// The CPU must support AVX2 and F16C.
// The half, token and lane indices also give byte offsets and walk several arrays in step.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn dots<const N: usize>(
    e: &[u8],
    a: [&[u8]; N],
    _facts: [ActFacts<'_>; N],
    out: &mut Dots<N>,
) {
    let zero = _mm256_setzero_si256();
    let mut lanes = [[[_mm256_setzero_ps(); 4]; 2]; N];
    for (b, p, ap) in Blocks::new(e, a, WIDE_BLOCK, Q8K, "expanded Q6_K") {
        // SAFETY: each of `ap` starts a whole Q8_K block.
        let da = unsafe { q8k_d(&ap) };
        for h in 0..2 {
            // SAFETY: half h of the super-block's expansion (HALF bytes at HALF · h).
            let p = unsafe { p.add(HALF * h) };
            // SAFETY: its 8 f32 scales.
            let d = unsafe { _mm256_loadu_ps(p.cast()) };
            let mut isum = [zero; N];
            // Σ_s sc_s · bsum_s, pairs of sub-blocks at a time.
            let mut offs = [zero; N];
            for w in 0..4 {
                for k in 0..2 {
                    // SAFETY: the pair's scale vector; each of `ap` starts a whole Q8_K block.
                    unsafe {
                        let sc = load(p.add(PAIRS + 32 * (2 * w + k)));
                        add_offsets(sc, &ap, w, k, &mut offs);
                    }
                }
            }
            for n in 0..2 {
                for m in 0..4 {
                    for i in 0..4 {
                        // SAFETY: the u of elements 128n + 32i + 8m.. (two vectors) and the
                        // scale of their sub-block 8n + 2i + m / 2.
                        let (u0, u1, sc) = unsafe {
                            let at = p.add(QUANTS + 64 * (16 * n + 4 * m + i));
                            let s = 8 * n + 2 * i + m / 2;
                            (load(at), load(at.add(32)), load(p.add(SUBS + 32 * s)))
                        };
                        // SAFETY: each of `ap` starts a whole Q8_K block.
                        unsafe { add_products((u0, u1, sc), &ap, (n, i, m), &mut isum) };
                    }
                }
            }
            add_block((d, &da), (&isum, &offs), (h, b), &mut lanes);
        }
    }
    finish(&lanes, out);
}
