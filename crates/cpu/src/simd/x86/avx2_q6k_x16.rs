//! The AVX2 decode and prefill kernel for Q6_K rows packed 16 at a time
//! ([`crate::ops::matmul::packed`], `Layout::Q6kX16`), the AVX2 form of `avx512_q6k_x16`:
//! one or four Q8_K activation rows against the 16 rows of a group, in two halves of 8 rows
//! (`avx2_x16`).
//!
//! Per super-block, exact integers as the reference's (`quants::kquants::dot_q6_k_q8_k`):
//! the six-bit quants u (0..64) of 8 rows are assembled from their `ql` and `qh` quads, 4 at
//! a time per lane, and meet 4 broadcast activations in one `vpmaddubsw`. A pair is at most
//! 2 · 63 · 128 = 16128 in magnitude (Q8_K activations reach -128), so two `vpmaddubsw` of a
//! 16-element sub-block (two neighbouring triples) sum in i16 to at most 32256 < 32767; one
//! `vpmaddwd` against the row's i8 scale (sign-extended, in both i16 of its lane) then adds
//! sc · Σ u·a of those 8 elements into isum. The reference's q = u - 32 is taken back once
//! per super-block: Σ_s sc_s · Σ q·a = Σ_s sc_s · Σ u·a - 32 · Σ_s sc_s · bsum_s, the last
//! sum by one `vpmaddwd` per pair of sub-blocks (their scales against their two stored i16
//! activation sums). Every partial sum is an exact i32 (at most 16 · 128 · 129024 in
//! magnitude, and 32 · 16 · 128 · 2048 for the offsets).
//!
//! The float part is the AVX-512 kernel's (the reference's), one row per lane, never fused:
//! (d_w · d_a) · isum, super-block b added into block lane b % 4, the lanes combined as
//! (0 + 2) + (1 + 3).
//!
//! Gate: `tests/split_exact.rs` (`packed_kernels_are_exact_on_every_isa`, and
//! `packed_matmul_is_exact_for_every_thread_count` under `MINFER_CPU_ISA=avx2`).

use std::arch::x86_64::*;

use super::avx2_x16::{bcast4, f16x8, finish, lane_bytes, load, q8k_d, table};
use super::x16::{Blocks, Dots, Q8K};

/// Bytes of one packed group's super-block (16 rows of 210 bytes).
pub(super) const GROUP_BLOCK: usize = 3360;
/// Where the packed pieces start in a group's super-block.
pub(super) const SCALES: usize = 32;
pub(super) const TRIPLES: usize = 288;

/// Scale byte k of each lane in the high byte of both its i16 (an arithmetic shift by 8
/// sign-extends it).
pub(super) const SCALE_IDX: [[u8; 32]; 4] = [
    lane_bytes(0, 0, 1),
    lane_bytes(1, 1, 1),
    lane_bytes(2, 2, 1),
    lane_bytes(3, 3, 1),
];
/// Scale bytes k and k + 1 of each lane in the high bytes of its two i16.
pub(super) const PAIR_IDX: [[u8; 32]; 2] = [lane_bytes(0, 1, 1), lane_bytes(2, 3, 1)];

/// The six-bit quants `i` (0..4: elements + 32i of the triple's 4) of one triple of 8 rows.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) fn six_bits(i: usize, la: __m256i, lb: __m256i, qh: __m256i) -> __m256i {
    let m4 = _mm256_set1_epi8(0x0f);
    let m30 = _mm256_set1_epi8(0x30);
    let (low, high) = match i {
        0 => (la, _mm256_slli_epi16::<4>(qh)),
        1 => (lb, _mm256_slli_epi16::<2>(qh)),
        2 => (_mm256_srli_epi16::<4>(la), qh),
        _ => (_mm256_srli_epi16::<4>(lb), _mm256_srli_epi16::<2>(qh)),
    };
    _mm256_or_si256(_mm256_and_si256(low, m4), _mm256_and_si256(high, m30))
}

/// Adds into each token's `offs` Σ sc_s · bsum_s of sub-blocks 4w + 2k and 4w + 2k + 1
/// (`sc`: their scales in the two i16 of each row's lane) against the two stored activation
/// sums of the Q8_K block at each of `ap`.
///
/// # Safety
/// Each of `ap` must start a whole Q8_K block.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn add_offsets<const N: usize>(
    sc: __m256i,
    ap: &[*const u8; N],
    w: usize,
    k: usize,
    offs: &mut [__m256i; N],
) {
    for (o, p) in offs.iter_mut().zip(ap) {
        // SAFETY: bsums 4w + 2k and 4w + 2k + 1 (4 bytes at 260 + 8w + 4k of the block).
        let bs = unsafe { bcast4(p.add(260 + 8 * w + 4 * k)) };
        *o = _mm256_add_epi32(*o, _mm256_madd_epi16(sc, bs));
    }
}

/// Adds into each token's `isum` sc · Σ u·a of elements 128n + 32i + 8m..+ 8 of the 8 rows
/// (`u0` the first 4 of each row's lane, `u1` the next 4; `sc` their sub-block's scale in
/// both i16 of each row's lane), against those of the Q8_K block at each of `ap`: the two
/// `vpmaddubsw` summed in i16 (see the module docs' bound), then one `vpmaddwd`.
///
/// # Safety
/// Each of `ap` must start a whole Q8_K block; `n < 2`, `i < 4`, `m < 4`.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn add_products<const N: usize>(
    (u0, u1, sc): (__m256i, __m256i, __m256i),
    ap: &[*const u8; N],
    (n, i, m): (usize, usize, usize),
    isum: &mut [__m256i; N],
) {
    for (s, p) in isum.iter_mut().zip(ap) {
        // SAFETY: activation bytes 128n + 32i + 8m (+ 4 for d) and the 4 after, in the block.
        let (a0, a1) = unsafe {
            let at = p.add(4 + 128 * n + 32 * i + 8 * m);
            (bcast4(at), bcast4(at.add(4)))
        };
        let pair = _mm256_add_epi16(_mm256_maddubs_epi16(u0, a0), _mm256_maddubs_epi16(u1, a1));
        *s = _mm256_add_epi32(*s, _mm256_madd_epi16(pair, sc));
    }
}

/// Half h of super-block b into each token's block lanes: (d_w · d_a) · (isum - 32 · offs),
/// never fused, added into lane b % 4.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) fn add_block<const N: usize>(
    (d, da): (__m256, &[__m256; N]),
    (isum, offs): (&[__m256i; N], &[__m256i; N]),
    (h, b): (usize, usize),
    lanes: &mut [[[__m256; 4]; 2]; N],
) {
    for t in 0..N {
        let q = _mm256_sub_epi32(isum[t], _mm256_slli_epi32::<5>(offs[t]));
        let v = _mm256_mul_ps(_mm256_mul_ps(d, da[t]), _mm256_cvtepi32_ps(q));
        lanes[t][h][b % 4] = _mm256_add_ps(lanes[t][h][b % 4], v);
    }
}

/// The 16 dots of the group `g` (`blocks · GROUP_BLOCK` bytes) with each of the `N` Q8_K
/// rows `a` (see `x16`).
///
/// # Safety
/// The CPU must support AVX2 and F16C.
// The half, token and lane indices also give byte offsets and walk several arrays in step.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn dot_q6k_x16<const N: usize>(g: &[u8], a: [&[u8]; N], out: &mut Dots<N>) {
    // No closures below: a closure does not inherit the target features.
    let zero = _mm256_setzero_si256();
    let mut sidx = [zero; 4];
    for k in 0..4 {
        sidx[k] = table(&SCALE_IDX[k]);
    }
    let pidx = [table(&PAIR_IDX[0]), table(&PAIR_IDX[1])];
    let mut lanes = [[[_mm256_setzero_ps(); 4]; 2]; N];
    for (b, p, ap) in Blocks::new(g, a, GROUP_BLOCK, Q8K, "Q6_K") {
        // SAFETY: each of `ap` starts a whole Q8_K block.
        let da = unsafe { q8k_d(&ap) };
        for h in 0..2 {
            // SAFETY: offsets inside the super-block (see the layout), rows 8h..8h + 8.
            let (d, sw) = unsafe {
                let mut sw = [zero; 4];
                for (w, v) in sw.iter_mut().enumerate() {
                    *v = load(p.add(SCALES + 64 * w + 32 * h));
                }
                (f16x8(p.add(16 * h)), sw)
            };
            let mut isum = [zero; N];
            // Σ_s sc_s · bsum_s, pairs of sub-blocks at a time.
            let mut offs = [zero; N];
            for w in 0..4 {
                for k in 0..2 {
                    let sc = _mm256_srai_epi16::<8>(_mm256_shuffle_epi8(sw[w], pidx[k]));
                    // SAFETY: each of `ap` starts a whole Q8_K block.
                    unsafe { add_offsets(sc, &ap, w, k, &mut offs) };
                }
            }
            for n in 0..2 {
                // Triples 2m and 2m + 1 of half n: elements 128n + 32i + 8m + [0, 8), in
                // sub-block 8n + 2i + m / 2.
                for m in 0..4 {
                    // SAFETY: triples 8n + 2m and 8n + 2m + 1 of rows 8h..8h + 8 (ql quads,
                    // then the qh quad, 64 bytes apart), in the super-block.
                    let tr = unsafe {
                        let t0 = p.add(TRIPLES + 192 * (8 * n + 2 * m) + 32 * h);
                        let t1 = t0.add(192);
                        [
                            [load(t0), load(t0.add(64)), load(t0.add(128))],
                            [load(t1), load(t1.add(64)), load(t1.add(128))],
                        ]
                    };
                    for i in 0..4 {
                        let u0 = six_bits(i, tr[0][0], tr[0][1], tr[0][2]);
                        let u1 = six_bits(i, tr[1][0], tr[1][1], tr[1][2]);
                        let s = 8 * n + 2 * i + m / 2;
                        let sc =
                            _mm256_srai_epi16::<8>(_mm256_shuffle_epi8(sw[s / 4], sidx[s % 4]));
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
