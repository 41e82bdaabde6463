//! AVX-512 side kernels ([`crate::simd::RowSideFn`], decode): one activation row against
//! many weight rows, the activation's block facts read from the matmul's side table instead
//! of converted from f16 for every weight row. The integer part is `avx512_legacy`'s (two
//! blocks per 512-bit vector through VNNI), the float part the reference expression per
//! block in its lane order (block b into lane b % 4, blocks g..g+4 then g+4..g+8), so every
//! dot is bit-identical to the reference and to `avx512_legacy`'s.

use std::arch::x86_64::*;

use super::avx512_legacy::{add_real, hsum8};
use super::side_row_bytes;

/// Q4_0 weight block: d f16 | qs[16].
const Q4_0: usize = 18;
/// Q4_1 weight block: d f16 | m f16 | qs[16].
const Q4_1: usize = 20;
/// Q8_0 block (weights and activations): d f16 | qs i8[32].
const Q8_0: usize = 34;
/// Q8_1 activation block: d f16 | s f16 | qs i8[32].
const Q8_1: usize = 36;
/// Blocks whose integer and float parts are computed together.
const GROUP: usize = 8;

/// The dots of the `out.len()` consecutive Q4_1 rows of `w` with the Q8_1 row `a`; `fs` is
/// the row's facts from the side table, its blocks' d then their s (2 x blocks f32).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
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

/// The body of one row's dot in the reference's lane order, from its groups' block values:
/// `$group::<PAIRS>(w, a, facts..)` gives the values of a group's first 2 x PAIRS blocks
/// (PAIRS 4, or 2 for a last group of at most 4 blocks; blocks past the row's end read as
/// zeros there and their lanes are dropped here). A macro, not a function taking a closure:
/// the closure would not inline into the target-feature code.
macro_rules! side_row {
    ($w:expr, $a:expr, ($wb:expr, $ab:expr), $group:ident, $($fact:expr),+) => {{
        let (w, a) = ($w, $a);
        let blocks = w.len() / $wb;
        let mut acc = _mm_setzero_ps();
        let mut g = 0;
        while g + GROUP <= blocks {
            let v = $group::<4>(
                &w[g * $wb..][..GROUP * $wb],
                &a[g * $ab..][..GROUP * $ab],
                $(&$fact[g..][..GROUP]),+
            );
            acc = _mm_add_ps(acc, _mm256_castps256_ps128(v));
            acc = _mm_add_ps(acc, _mm256_extractf128_ps::<1>(v));
            g += GROUP;
        }
        // The last blocks (1..7) by masked loads: the bytes past the row read as zero, and
        // lanes without a block stay untouched.
        let count = blocks - g;
        if count > 0 && count <= 4 {
            let v = $group::<2>(&w[g * $wb..], &a[g * $ab..], $(&$fact[g..]),+);
            acc = add_real(acc, _mm256_castps256_ps128(v), count);
        } else if count > 4 {
            let v = $group::<4>(&w[g * $wb..], &a[g * $ab..], $(&$fact[g..]),+);
            acc = _mm_add_ps(acc, _mm256_castps256_ps128(v));
            acc = add_real(acc, _mm256_extractf128_ps::<1>(v), count - 4);
        }
        // (lane 0 + lane 2) + (lane 1 + lane 3)
        let r = _mm_add_ps(acc, _mm_movehl_ps(acc, acc));
        _mm_cvtss_f32(_mm_add_ss(r, _mm_shuffle_ps::<0b01>(r, r)))
    }};
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
fn q4_1_row(w: &[u8], a: &[u8], d: &[f32], s: &[f32]) -> f32 {
    side_row!(w, a, (Q4_1, Q8_1), q4_1_group, d, s)
}

/// The values (d_w * d_a) * Σ + m_w * s_a of the first 2 x `PAIRS` Q4_1 blocks of `w`
/// against the Q8_1 blocks of `a`, with the activation facts `d`, `s`, in lanes 0..8 (the
/// lanes past 2 x `PAIRS` are 0). Blocks past the end of the slices (a row's last group) read
/// as zero bytes; their lanes hold values the caller drops.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
fn q4_1_group<const PAIRS: usize>(w: &[u8], a: &[u8], d: &[f32], s: &[f32]) -> __m256 {
    // The blocks' 4-byte headers (d | m << 16) by one two-source permute: blocks 0..4 sit at
    // bytes 0, 20, 40, 60 of the 64 at 0 (dwords 0, 5, 10, 15), blocks 4..8 likewise in the
    // 64 at 80.
    let lo = load_part(w, 0);
    let hi = if PAIRS > 2 {
        load_part(w, 4 * Q4_1)
    } else {
        _mm512_setzero_si512()
    };
    let idx = _mm512_setr_epi32(0, 5, 10, 15, 16, 21, 26, 31, 0, 0, 0, 0, 0, 0, 0, 0);
    let head = _mm512_castsi512_si256(_mm512_permutex2var_epi32(lo, idx, hi));
    let dw = _mm256_cvtph_ps(_mm256_cvtepi32_epi16(head));
    let mw = _mm256_cvtph_ps(_mm256_cvtepi32_epi16(_mm256_srli_epi32::<16>(head)));
    let mut pairs = [_mm512_setzero_si512(); 4];
    for (k, p) in pairs.iter_mut().enumerate().take(PAIRS) {
        *p = q4_1_pair(w, a, 2 * k);
    }
    let sums = _mm256_cvtepi32_ps(hsum8(pairs));
    let (da, sa) = (load_f32x8(d), load_f32x8(s));
    _mm256_add_ps(
        _mm256_mul_ps(_mm256_mul_ps(dw, da), sums),
        _mm256_mul_ps(mw, sa),
    )
}

/// The exact integer sums of Q4_1 blocks `b`, `b + 1` of `w` against the Q8_1 blocks `b`,
/// `b + 1` of `a`, 4 elements per i32 lane (block `b` in the low 256 bits). A function, not
/// a closure: a closure would not carry the target features and stays a call.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
fn q4_1_pair(w: &[u8], a: &[u8], b: usize) -> __m512i {
    // Per block: low nibbles (elements 0..16) then high nibbles (16..32).
    let q0 = _mm256_broadcastsi128_si256(load_part16(w, b * Q4_1 + 4));
    let q1 = _mm256_broadcastsi128_si256(load_part16(w, (b + 1) * Q4_1 + 4));
    let q = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(q0), q1);
    let shifted = _mm512_mask_srli_epi16::<4>(q, 0xff00_ff00, q);
    let u = _mm512_and_si512(shifted, _mm512_set1_epi8(0x0f));
    let a0 = load_part32(a, b * Q8_1 + 4);
    let a1 = load_part32(a, (b + 1) * Q8_1 + 4);
    let x = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(a0), a1);
    _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, x)
}

/// The dots of the `out.len()` consecutive Q4_0 rows of `w` with the Q8_0 row `a`; `d` and
/// `sums` are the row's facts from the side table (scales as f32, Σ a per block).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
pub(super) fn dot_q4_0_side_rows(w: &[u8], a: &[u8], d: &[f32], sums: &[i32], out: &mut [f32]) {
    let Some(wrb) = side_row_bytes(w, out.len(), Q4_0, "Q4_0") else {
        return;
    };
    let blocks = wrb / Q4_0;
    let (a, d, sums) = (&a[..blocks * Q8_0], &d[..blocks], &sums[..blocks]);
    for (wr, o) in w.chunks_exact(wrb).zip(out.iter_mut()) {
        *o = q4_0_row(wr, a, d, sums);
    }
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
fn q4_0_row(w: &[u8], a: &[u8], d: &[f32], sums: &[i32]) -> f32 {
    side_row!(w, a, (Q4_0, Q8_0), q4_0_group, d, sums)
}

/// The values (Σ q·a · d_w) · d_a (the reference's order) of the first 2 x `PAIRS` Q4_0
/// blocks of `w` against the Q8_0 blocks of `a`, as [`q4_1_group`]. The quants go into VNNI
/// as the unsigned nibbles u = q + 8 and Σ q·a = Σ u·a - 8·Σ a exactly (i32).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
fn q4_0_group<const PAIRS: usize>(w: &[u8], a: &[u8], d: &[f32], sums: &[i32]) -> __m256 {
    let dw = f16x8_words::<PAIRS>(w, Q4_0);
    let mut pairs = [_mm512_setzero_si512(); 4];
    for (k, p) in pairs.iter_mut().enumerate().take(PAIRS) {
        *p = q4_0_pair(w, a, 2 * k);
    }
    let isum = _mm256_sub_epi32(hsum8(pairs), _mm256_slli_epi32::<3>(load_i32x8(sums)));
    _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(isum), dw), load_f32x8(d))
}

/// The exact sums Σ u·a of Q4_0 blocks `b`, `b + 1` of `w` (u the unsigned nibbles) against
/// Q8_0 blocks `b`, `b + 1` of `a`, 4 elements per i32 lane (block `b` in the low 256 bits).
/// A missing block reads as zero bytes on both sides: its sum is 0.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
fn q4_0_pair(w: &[u8], a: &[u8], b: usize) -> __m512i {
    // Per block: low nibbles (elements 0..16) then high nibbles (16..32).
    let q0 = _mm256_broadcastsi128_si256(load_part16(w, b * Q4_0 + 2));
    let q1 = _mm256_broadcastsi128_si256(load_part16(w, (b + 1) * Q4_0 + 2));
    let q = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(q0), q1);
    let shifted = _mm512_mask_srli_epi16::<4>(q, 0xff00_ff00, q);
    let u = _mm512_and_si512(shifted, _mm512_set1_epi8(0x0f));
    let a0 = load_part32(a, b * Q8_0 + 2);
    let a1 = load_part32(a, (b + 1) * Q8_0 + 2);
    let x = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(a0), a1);
    _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, x)
}

/// The dots of the `out.len()` consecutive Q8_0 rows of `w` with the Q8_0 row `a`; `d` and
/// `sums` are the row's facts from the side table (scales as f32, Σ a per block).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
pub(super) fn dot_q8_0_side_rows(w: &[u8], a: &[u8], d: &[f32], sums: &[i32], out: &mut [f32]) {
    let Some(wrb) = side_row_bytes(w, out.len(), Q8_0, "Q8_0") else {
        return;
    };
    let blocks = wrb / Q8_0;
    let (a, d, sums) = (&a[..blocks * Q8_0], &d[..blocks], &sums[..blocks]);
    for (wr, o) in w.chunks_exact(wrb).zip(out.iter_mut()) {
        *o = q8_0_row(wr, a, d, sums);
    }
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
fn q8_0_row(w: &[u8], a: &[u8], d: &[f32], sums: &[i32]) -> f32 {
    side_row!(w, a, (Q8_0, Q8_0), q8_0_group, d, sums)
}

/// The values Σ w·a * (d_w * d_a) of the first 2 x `PAIRS` Q8_0 blocks of `w` against the
/// Q8_0 blocks of `a`, as [`q4_1_group`]. The weights go into VNNI biased to unsigned (w ^
/// 0x80 = w + 128, exact for -128 too) and Σ w·a = Σ (w + 128)·a - 128·Σ a exactly (i32).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
fn q8_0_group<const PAIRS: usize>(w: &[u8], a: &[u8], d: &[f32], sums: &[i32]) -> __m256 {
    let dw = f16x8_words::<PAIRS>(w, Q8_0);
    let mut pairs = [_mm512_setzero_si512(); 4];
    for (k, p) in pairs.iter_mut().enumerate().take(PAIRS) {
        *p = q8_0_pair(w, a, 2 * k);
    }
    let isum = _mm256_sub_epi32(hsum8(pairs), _mm256_slli_epi32::<7>(load_i32x8(sums)));
    _mm256_mul_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, load_f32x8(d)))
}

/// The exact sums Σ (w + 128)·a of Q8_0 blocks `b`, `b + 1` of `w` against Q8_0 blocks `b`,
/// `b + 1` of `a`, 4 elements per i32 lane (block `b` in the low 256 bits). A missing block
/// reads as zero bytes: its w + 128 is 128 against a = 0, so its sum is 0 too.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
fn q8_0_pair(w: &[u8], a: &[u8], b: usize) -> __m512i {
    let w0 = load_part32(w, b * Q8_0 + 2);
    let w1 = load_part32(w, (b + 1) * Q8_0 + 2);
    let u = _mm512_xor_si512(
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(w0), w1),
        _mm512_set1_epi8(-128),
    );
    let a0 = load_part32(a, b * Q8_0 + 2);
    let a1 = load_part32(a, (b + 1) * Q8_0 + 2);
    let x = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(a0), a1);
    _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, x)
}

/// The f16 scales at byte 0 of the first 2 x `PAIRS` `stride`-byte blocks of `w` as f32
/// (blocks past its end 0), by two-source word permutes: blocks 0..4 from the 128 bytes at
/// 0, blocks 4..8 from the 128 at 4 x stride (`stride` even, 3 x stride + 2 <= 128).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
fn f16x8_words<const PAIRS: usize>(w: &[u8], stride: usize) -> __m256 {
    let h = (stride / 2) as i16;
    // Only the low 4 words are used.
    let idx = _mm512_zextsi128_si512(_mm_setr_epi16(0, h, 2 * h, 3 * h, 0, 0, 0, 0));
    let lo = _mm512_permutex2var_epi16(load_part(w, 0), idx, load_part(w, 64));
    let hi = if PAIRS > 2 {
        let at = 4 * stride;
        _mm512_permutex2var_epi16(load_part(w, at), idx, load_part(w, at + 64))
    } else {
        _mm512_setzero_si512()
    };
    let words = _mm_unpacklo_epi64(_mm512_castsi512_si128(lo), _mm512_castsi512_si128(hi));
    _mm256_cvtph_ps(words)
}

/// `v[0..8]`, the lanes past its end zero.
#[inline]
#[target_feature(enable = "avx512f,avx512vl")]
fn load_i32x8(v: &[i32]) -> __m256i {
    let m = first_lanes(v.len(), 0, 8) as u8;
    // SAFETY: as in `load_part`, for i32 lanes.
    unsafe { _mm256_maskz_loadu_epi32(m, v.as_ptr().cast()) }
}

/// The mask of the first `n` of `lanes` lanes of `len`-element data read from element `at`.
#[inline(always)]
fn first_lanes(len: usize, at: usize, lanes: usize) -> u64 {
    let n = len.saturating_sub(at).min(lanes);
    if n >= 64 {
        u64::MAX
    } else {
        (1u64 << n) - 1
    }
}

/// Bytes `at..at + 64` of `b`, those past its end zero.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn load_part(b: &[u8], at: usize) -> __m512i {
    let m = first_lanes(b.len(), at, 64);
    // SAFETY: a masked load reads only the lanes its mask selects, here bytes inside `b`;
    // the others are neither read nor faulted on. The address is computed without offsetting
    // out of the slice's provenance (wrapping_add).
    unsafe { _mm512_maskz_loadu_epi8(m, b.as_ptr().wrapping_add(at).cast()) }
}

/// Bytes `at..at + 32` of `b`, those past its end zero.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn load_part32(b: &[u8], at: usize) -> __m256i {
    let m = first_lanes(b.len(), at, 32) as u32;
    // SAFETY: as in `load_part`.
    unsafe { _mm256_maskz_loadu_epi8(m, b.as_ptr().wrapping_add(at).cast()) }
}

/// Bytes `at..at + 16` of `b`, those past its end zero.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn load_part16(b: &[u8], at: usize) -> __m128i {
    let m = first_lanes(b.len(), at, 16) as u16;
    // SAFETY: as in `load_part`.
    unsafe { _mm_maskz_loadu_epi8(m, b.as_ptr().wrapping_add(at).cast()) }
}

/// `f[0..8]`, the lanes past its end zero.
#[inline]
#[target_feature(enable = "avx512f,avx512vl")]
fn load_f32x8(f: &[f32]) -> __m256 {
    let m = first_lanes(f.len(), 0, 8) as u8;
    // SAFETY: as in `load_part`, for f32 lanes.
    unsafe { _mm256_maskz_loadu_ps(m, f.as_ptr().cast()) }
}
