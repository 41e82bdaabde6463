//! The AVX2 side kernel of Q4_1 ([`crate::simd::RowSideFn`], decode): one Q8_1 activation
//! row against many weight rows, the activation's d and s from the matmul's side table
//! instead of converted from f16 for every weight row. (The Q5_0 and Q8_0 side kernels live
//! beside their plain dots in `avx2_legacy`, whose block helpers they share.) Block values
//! and lanes are the reference's, as in `avx2_legacy::dot_q4_1`: block b into lane b % 4,
//! the lanes combined as (0 + 2) + (1 + 3).

use std::arch::x86_64::*;

use super::{load32, nibbles32, side_row_bytes, widen_pairs, PREFETCH_AHEAD};

/// Q4_1 weight block: d f16 | m f16 | qs[16].
const Q4_1: usize = 20;
/// Q8_1 activation block: d f16 | s f16 | qs i8[32].
const Q8_1: usize = 36;
/// Blocks whose integer and float parts are computed together.
const GROUP: usize = 4;

/// The dots of the `out.len()` consecutive Q4_1 rows of `w` with the Q8_1 row `a`; `fs` is
/// the row's facts from the side table, its blocks' d then their s (2 x blocks f32).
#[target_feature(enable = "avx2,f16c")]
pub(super) fn dot_q4_1_side_rows(w: &[u8], a: &[u8], fs: &[f32], _: &[i32], out: &mut [f32]) {
    let Some(wrb) = side_row_bytes(w, out.len(), Q4_1, "Q4_1") else {
        return;
    };
    let blocks = wrb / Q4_1;
    let (d, s) = fs[..2 * blocks].split_at(blocks);
    let a = &a[..blocks * Q8_1];
    for (wr, o) in w.chunks_exact(wrb).zip(out.iter_mut()) {
        *o = q4_1_row(wr, a, d, s);
    }
}

#[inline]
#[target_feature(enable = "avx2,f16c")]
fn q4_1_row(w: &[u8], a: &[u8], d: &[f32], s: &[f32]) -> f32 {
    let blocks = w.len() / Q4_1;
    let mut acc = _mm_setzero_ps();
    let mut g = 0;
    while g + GROUP <= blocks {
        let p = w.as_ptr().wrapping_add(g * Q4_1 + PREFETCH_AHEAD);
        // A group spans 80 bytes: two lines ahead keep pace with it (never faults).
        _mm_prefetch::<_MM_HINT_T0>(p.cast());
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64).cast());
        let v = q4_1_group(
            &w[g * Q4_1..][..GROUP * Q4_1],
            &a[g * Q8_1..][..GROUP * Q8_1],
            &d[g..][..GROUP],
            &s[g..][..GROUP],
        );
        acc = _mm_add_ps(acc, v);
        g += GROUP;
    }
    if g < blocks {
        // The last 1..3 blocks; lanes without a block stay untouched.
        let count = blocks - g;
        let v = q4_1_group(&w[g * Q4_1..], &a[g * Q8_1..], &d[g..], &s[g..]);
        let real = _mm_cmpgt_epi32(_mm_set1_epi32(count as i32), _mm_setr_epi32(0, 1, 2, 3));
        acc = _mm_blendv_ps(acc, _mm_add_ps(acc, v), _mm_castsi128_ps(real));
    }
    // (lane 0 + lane 2) + (lane 1 + lane 3)
    let r = _mm_add_ps(acc, _mm_movehl_ps(acc, acc));
    _mm_cvtss_f32(_mm_add_ss(r, _mm_shuffle_ps::<0b01>(r, r)))
}

/// The values (d_w * d_a) * Σ + m_w * s_a of the first 4 Q4_1 blocks of `w` against the Q8_1
/// blocks of `a` with the activation facts `d`, `s`; a row's last group may hold 1..3 blocks
/// (no padded copy): a missing block's sums and facts are zero and the caller drops its lane.
/// For a whole group (slices of exactly 4 blocks) the block checks fold away.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn q4_1_group(w: &[u8], a: &[u8], d: &[f32], s: &[f32]) -> __m128 {
    let count = (w.len() / Q4_1).min(GROUP);
    let pairs = |k: usize| {
        if k < count {
            q4_1_pairs(&w[k * Q4_1..], &a[k * Q8_1..])
        } else {
            _mm256_setzero_si256()
        }
    };
    // Pair sums are |q·a + q·a| <= 2·15·128 = 3,840, so two pairs (<= 7,680) stay exact in
    // i16: one horizontal i16 add per two blocks, then one widening madd per two blocks.
    let h01 = _mm256_hadd_epi16(pairs(0), pairs(1));
    let h23 = _mm256_hadd_epi16(pairs(2), pairs(3));
    let m = _mm256_hadd_epi32(widen_pairs(h01), widen_pairs(h23));
    let sums = _mm_add_epi32(_mm256_castsi256_si128(m), _mm256_extracti128_si256::<1>(m));
    // The blocks' 4-byte headers (d | m << 16), then their d and m halves.
    let word = |k: usize| {
        if k < count {
            let b = &w[k * Q4_1..][..4];
            i32::from_le_bytes([b[0], b[1], b[2], b[3]])
        } else {
            0
        }
    };
    let fact = |f: &[f32], k: usize| if k < count { f[k] } else { 0.0 };
    let head = _mm_setr_epi32(word(0), word(1), word(2), word(3));
    let lo = _mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1);
    let hi = _mm_setr_epi8(2, 3, 6, 7, 10, 11, 14, 15, -1, -1, -1, -1, -1, -1, -1, -1);
    let dw = _mm_cvtph_ps(_mm_shuffle_epi8(head, lo));
    let mw = _mm_cvtph_ps(_mm_shuffle_epi8(head, hi));
    let da = _mm_setr_ps(fact(d, 0), fact(d, 1), fact(d, 2), fact(d, 3));
    let sa = _mm_setr_ps(fact(s, 0), fact(s, 1), fact(s, 2), fact(s, 3));
    let scaled = _mm_mul_ps(_mm_mul_ps(dw, da), _mm_cvtepi32_ps(sums));
    _mm_add_ps(scaled, _mm_mul_ps(mw, sa))
}

/// The 16 i16 pair sums q·a + q·a of one Q4_1 block (unsigned quants 0..=15).
#[inline]
#[target_feature(enable = "avx2")]
fn q4_1_pairs(wb: &[u8], ab: &[u8]) -> __m256i {
    _mm256_maddubs_epi16(nibbles32(&wb[4..]), load32(&ab[4..]))
}
