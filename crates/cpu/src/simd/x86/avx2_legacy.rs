//! AVX2 dots of the 32-element types with Q8_0 / Q8_1 activations. Each block's integer sum
//! is exact; the f32 part repeats the reference expression of `minfer_gguf::quants` (same
//! operands, same association, lane-wise over 4 blocks at once, which rounds each lane
//! exactly like the scalar expression). Block b's value adds into lane b % 4 of one f32
//! vector, the reference's `BLOCK_LANES` order, and the lanes combine as (0 + 2) + (1 + 3).

use std::arch::x86_64::*;

use super::{bits_to_bytes, dot_i8_any, iq4_table, load32, nibbles32};
use super::{pairs_small_w, side_row_bytes, widen_pairs, PREFETCH_AHEAD};

/// Q8_0 activation block: d f16 | qs i8[32].
const Q8_0: usize = 34;
/// Q8_1 activation block: d f16 | s f16 | qs i8[32].
const Q8_1: usize = 36;
/// Blocks whose float part is computed together.
const GROUP: usize = 4;
/// The largest block of this file (Q8_1), for the zero-padded tail group.
const MAX_BLOCK: usize = 36;

/// Lane b = Σ of the 8 lanes of `v[b]`.
#[inline]
#[target_feature(enable = "avx2")]
fn hsum4(v: [__m256i; GROUP]) -> __m128i {
    let s01 = _mm256_hadd_epi32(v[0], v[1]);
    let s23 = _mm256_hadd_epi32(v[2], v[3]);
    let s = _mm256_hadd_epi32(s01, s23);
    _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s))
}

/// The f16 at byte `off` of each of 4 consecutive `stride`-byte blocks, as f32 lanes.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn f16x4(b: &[u8], stride: usize, off: usize) -> __m128 {
    let h = |k: usize| i16::from_le_bytes([b[k * stride + off], b[k * stride + off + 1]]);
    _mm_cvtph_ps(_mm_setr_epi16(h(0), h(1), h(2), h(3), 0, 0, 0, 0))
}

/// The shared loop: `isum(w_block, a_block)` gives a block's exact integer sum spread over
/// 8 i32 lanes; `value(w_group, a_group, isums)` the 4 block values of a group from their
/// sums as f32. A last group of fewer than 4 blocks runs zero-padded and adds only its real
/// lanes. (One loop body, so the closures inline into it.)
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn dot_blocks(
    w: &[u8],
    a: &[u8],
    (wb, ab): (usize, usize),
    isum: impl Fn(&[u8], &[u8]) -> __m256i,
    value: impl Fn(&[u8], &[u8], __m128) -> __m128,
) -> f32 {
    let blocks = w.len() / wb;
    // The panic indexing a short activation row gave, checked once instead of per group.
    assert!(
        a.len() >= blocks * ab,
        "activation row shorter than the weight row"
    );
    let mut wpad = [0u8; GROUP * MAX_BLOCK];
    let mut apad = [0u8; GROUP * MAX_BLOCK];
    let mut acc = _mm_setzero_ps();
    let mut g = 0;
    while g < blocks {
        let count = (blocks - g).min(GROUP);
        let (w4, a4) = if count == GROUP {
            // SAFETY: g + GROUP <= blocks, so both ranges end within w (blocks * wb bytes)
            // and a (at least blocks * ab bytes, asserted above).
            unsafe {
                (
                    w.get_unchecked(g * wb..(g + GROUP) * wb),
                    a.get_unchecked(g * ab..(g + GROUP) * ab),
                )
            }
        } else {
            wpad[..count * wb].copy_from_slice(&w[g * wb..][..count * wb]);
            apad[..count * ab].copy_from_slice(&a[g * ab..][..count * ab]);
            (&wpad[..GROUP * wb], &apad[..GROUP * ab])
        };
        prefetch(w, g * wb);
        let parts = [
            isum(w4, a4),
            isum(&w4[wb..], &a4[ab..]),
            isum(&w4[2 * wb..], &a4[2 * ab..]),
            isum(&w4[3 * wb..], &a4[3 * ab..]),
        ];
        let v = value(w4, a4, _mm_cvtepi32_ps(hsum4(parts)));
        if count == GROUP {
            acc = _mm_add_ps(acc, v);
        } else {
            // Lanes without a block stay untouched, as in the reference.
            let real = _mm_cmpgt_epi32(_mm_set1_epi32(count as i32), _mm_setr_epi32(0, 1, 2, 3));
            acc = _mm_blendv_ps(acc, _mm_add_ps(acc, v), _mm_castsi128_ps(real));
        }
        g += GROUP;
    }
    // (lane 0 + lane 2) + (lane 1 + lane 3)
    let s = _mm_add_ps(acc, _mm_movehl_ps(acc, acc));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps::<0b01>(s, s)))
}

/// [`dot_blocks`] of one weight row with `T` activation rows: each weight block is unpacked
/// once (`unpack`) and used by every row; `isum(unpacked, a_block)` and `value` are the
/// single-row closures' halves, so each row's sums, lanes and additions are exactly those of
/// [`dot_blocks`] (checked bit for bit by `crates/cpu/tests/split_exact.rs`).
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn dot_blocks_multi<const T: usize>(
    w: &[u8],
    a: [&[u8]; T],
    (wb, ab): (usize, usize),
    unpack: impl Fn(&[u8]) -> __m256i,
    isum: impl Fn(__m256i, &[u8]) -> __m256i,
    value: impl Fn(&[u8], &[u8], __m128) -> __m128,
) -> [f32; T] {
    let blocks = w.len() / wb;
    let mut wpad = [0u8; GROUP * MAX_BLOCK];
    let mut apad = [0u8; GROUP * MAX_BLOCK];
    let mut acc = [_mm_setzero_ps(); T];
    let mut g = 0;
    while g < blocks {
        let count = (blocks - g).min(GROUP);
        let w4: &[u8] = if count == GROUP {
            &w[g * wb..][..GROUP * wb]
        } else {
            wpad[..count * wb].copy_from_slice(&w[g * wb..][..count * wb]);
            &wpad[..GROUP * wb]
        };
        let q = [
            unpack(w4),
            unpack(&w4[wb..]),
            unpack(&w4[2 * wb..]),
            unpack(&w4[3 * wb..]),
        ];
        for (at, acc) in a.iter().zip(acc.iter_mut()) {
            let a4: &[u8] = if count == GROUP {
                &at[g * ab..][..GROUP * ab]
            } else {
                apad[..count * ab].copy_from_slice(&at[g * ab..][..count * ab]);
                &apad[..GROUP * ab]
            };
            let parts = [
                isum(q[0], a4),
                isum(q[1], &a4[ab..]),
                isum(q[2], &a4[2 * ab..]),
                isum(q[3], &a4[3 * ab..]),
            ];
            let v = value(w4, a4, _mm_cvtepi32_ps(hsum4(parts)));
            if count == GROUP {
                *acc = _mm_add_ps(*acc, v);
            } else {
                let real =
                    _mm_cmpgt_epi32(_mm_set1_epi32(count as i32), _mm_setr_epi32(0, 1, 2, 3));
                *acc = _mm_blendv_ps(*acc, _mm_add_ps(*acc, v), _mm_castsi128_ps(real));
            }
        }
        g += GROUP;
    }
    acc.map(|acc| {
        // (lane 0 + lane 2) + (lane 1 + lane 3)
        let s = _mm_add_ps(acc, _mm_movehl_ps(acc, acc));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps::<0b01>(s, s)))
    })
}

/// Software prefetch of the weight bytes [`PREFETCH_AHEAD`] past `w[at]` (addresses past the
/// row are fine: a prefetch never faults, and rows of a matrix are contiguous).
#[inline]
#[target_feature(enable = "avx2")]
fn prefetch(w: &[u8], at: usize) {
    let p = w.as_ptr().wrapping_add(at + PREFETCH_AHEAD);
    // A group of 4 blocks spans at most 144 bytes: two lines ahead keep pace with it.
    _mm_prefetch::<_MM_HINT_T0>(p.cast());
    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64).cast());
}

/// The 5-bit quants of a Q5 block: nibbles plus bit j of `qh` as bit 4 of element j.
#[inline]
#[target_feature(enable = "avx2")]
fn five_bits(qh: &[u8], qs: &[u8]) -> __m256i {
    let qh = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    let high = _mm256_and_si256(bits_to_bytes(qh), _mm256_set1_epi8(0x10));
    _mm256_or_si256(nibbles32(qs), high)
}

#[target_feature(enable = "avx2,f16c")]
pub(super) fn dot_q4_0(w: &[u8], a: &[u8]) -> f32 {
    dot_blocks(
        w,
        a,
        (18, Q8_0),
        |wb, ab| {
            let q = _mm256_sub_epi8(nibbles32(&wb[2..]), _mm256_set1_epi8(8));
            widen_pairs(pairs_small_w(q, load32(&ab[2..])))
        },
        // s * d_w * d_a
        |w4, a4, s| _mm_mul_ps(_mm_mul_ps(s, f16x4(w4, 18, 0)), f16x4(a4, Q8_0, 0)),
    )
}

/// (d_w * d_a) * s + m_w * s_a, the Q4_1/Q5_1 block value.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn value_with_min(w4: &[u8], wb: usize, a4: &[u8], s: __m128) -> __m128 {
    let scaled = _mm_mul_ps(_mm_mul_ps(f16x4(w4, wb, 0), f16x4(a4, Q8_1, 0)), s);
    _mm_add_ps(scaled, _mm_mul_ps(f16x4(w4, wb, 2), f16x4(a4, Q8_1, 2)))
}

#[target_feature(enable = "avx2,f16c")]
pub(super) fn dot_q4_1(w: &[u8], a: &[u8]) -> f32 {
    dot_blocks(
        w,
        a,
        (20, Q8_1),
        |wb, ab| widen_pairs(_mm256_maddubs_epi16(nibbles32(&wb[4..]), load32(&ab[4..]))),
        |w4, a4, s| value_with_min(w4, 20, a4, s),
    )
}

/// (d_w * d_a) * s.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn value_dd_s(w4: &[u8], wb: usize, a4: &[u8], s: __m128) -> __m128 {
    _mm_mul_ps(_mm_mul_ps(f16x4(w4, wb, 0), f16x4(a4, Q8_0, 0)), s)
}

/// The Q5_0 quants minus 16 as signed bytes: nibble | 0xf0 where the high bit is clear
/// (nibble - 16 in two's complement), the nibble where it is set.
#[inline]
#[target_feature(enable = "avx2")]
fn q5_0_signed(wb: &[u8]) -> __m256i {
    let qh = u32::from_le_bytes([wb[2], wb[3], wb[4], wb[5]]);
    let minus16 = _mm256_andnot_si256(bits_to_bytes(qh), _mm256_set1_epi8(0xf0u8 as i8));
    _mm256_or_si256(nibbles32(&wb[6..]), minus16)
}

/// Q5_0 block's exact integer sum as 8 i32 lanes.
#[inline]
#[target_feature(enable = "avx2")]
fn q5_0_isum(wb: &[u8], ab: &[u8]) -> __m256i {
    widen_pairs(pairs_small_w(q5_0_signed(wb), load32(&ab[2..])))
}

#[target_feature(enable = "avx2,f16c")]
pub(super) fn dot_q5_0(w: &[u8], a: &[u8]) -> f32 {
    dot_blocks(
        w,
        a,
        (22, Q8_0),
        |wb, ab| q5_0_isum(wb, ab),
        |w4, a4, s| value_dd_s(w4, 22, a4, s),
    )
}

/// The Q5_0 quants as unsigned bytes 0..=31: nibble | 0x10 where the high bit is set.
#[inline]
#[target_feature(enable = "avx2")]
fn q5_0_unsigned(wb: &[u8]) -> __m256i {
    let wb = &wb[..22];
    // Both loads as broadcasts from memory (vbroadcastss / vbroadcastf128: load-port only),
    // where a scalar or 128-bit load and a register broadcast cost one shuffle uop each.
    // SAFETY: wb holds 22 bytes (sliced above): qh at 2..6, qs at 6..22; the reads are
    // unaligned-safe (read_unaligned / broadcast intrinsics take no alignment).
    let (qh4, qs) = unsafe {
        let qh = wb.as_ptr().add(2).cast::<f32>().read_unaligned();
        let qs = wb.as_ptr().add(6).cast::<__m128>().read_unaligned();
        (
            _mm256_castps_si256(_mm256_broadcast_ss(&qh)),
            _mm256_castps_si256(_mm256_broadcast_ps(&qs)),
        )
    };
    let spread = _mm256_shuffle_epi8(
        qh4,
        _mm256_set_epi64x(
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
            0x0101_0101_0101_0101,
            0,
        ),
    );
    let mask = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let high = _mm256_and_si256(
        _mm256_cmpeq_epi8(_mm256_and_si256(spread, mask), mask),
        _mm256_set1_epi8(0x10),
    );
    let nib = _mm256_and_si256(
        _mm256_srlv_epi64(qs, _mm256_set_epi64x(4, 4, 0, 0)),
        _mm256_set1_epi8(0x0f),
    );
    _mm256_or_si256(nib, high)
}

/// The 16 i16 pair sums q·a + q·a of one Q5_0 block with unsigned quants (0..=31).
#[inline]
#[target_feature(enable = "avx2")]
fn q5_0_unsigned_pairs(wb: &[u8], ab: &[u8]) -> __m256i {
    _mm256_maddubs_epi16(q5_0_unsigned(wb), load32(&ab[2..]))
}

/// The 4 block values of one group of [`dot_q5_0_side`] (a function, not a closure, so that
/// it compiles with AVX2 enabled and inlines).
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn q5_0_side_group(w4: &[u8], a4: &[u8], d4: &[f32], s4: &[i32]) -> __m128 {
    const WB: usize = 22;
    let (w4, a4) = (&w4[..GROUP * WB], &a4[..GROUP * Q8_0]);
    // Pair sums are |q·a + q·a| ≤ 2·31·128 = 7,936, so sums of two pairs (≤ 15,872) stay
    // exact in i16: one horizontal i16 add per two blocks, then one widening madd per two
    // blocks instead of one per block. Lanes of h01 per 128-bit half: 4 sums of block 0,
    // 4 of block 1; after the madd 2 i32 of each block; hadd_epi32 gives per half
    // [b0, b1, b2, b3], and the halves add up to the 4 block sums.
    let h01 = _mm256_hadd_epi16(
        q5_0_unsigned_pairs(w4, a4),
        q5_0_unsigned_pairs(&w4[WB..], &a4[Q8_0..]),
    );
    let h23 = _mm256_hadd_epi16(
        q5_0_unsigned_pairs(&w4[2 * WB..], &a4[2 * Q8_0..]),
        q5_0_unsigned_pairs(&w4[3 * WB..], &a4[3 * Q8_0..]),
    );
    let m = _mm256_hadd_epi32(widen_pairs(h01), widen_pairs(h23));
    let qa = _mm_add_epi32(_mm256_castsi256_si128(m), _mm256_extracti128_si256::<1>(m));
    let (s4, d4) = (&s4[..GROUP], &d4[..GROUP]);
    // SAFETY: s4 and d4 hold 4 elements each (sliced above); loadu needs no alignment.
    let (sa, da) = unsafe {
        (
            _mm_loadu_si128(s4.as_ptr().cast()),
            _mm_loadu_ps(d4.as_ptr()),
        )
    };
    let s = _mm_cvtepi32_ps(_mm_sub_epi32(qa, _mm_slli_epi32::<4>(sa)));
    _mm_mul_ps(_mm_mul_ps(f16x4(w4, WB, 0), da), s)
}

/// [`dot_q5_0`] with the activation row's block facts from the matmul's side table (`d`:
/// scales as f32, `sums`: Σ a per block). Σ (q - 16)·a = Σ q·a - 16·Σ a exactly, so the
/// unsigned quants (≤ 31, pairs ≤ 2·31·128: no i16 saturation) meet the activations in one
/// maddubs, without the abs/sign pair, and no activation scale is converted from f16 per
/// weight row. Block values (d_w · d_a) · s and their lanes are [`dot_q5_0`]'s.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn dot_q5_0_side(w: &[u8], a: &[u8], d: &[f32], sums: &[i32]) -> f32 {
    const WB: usize = 22;
    let blocks = w.len() / WB;
    // The panic indexing a short row gave, checked once instead of per group.
    assert!(
        a.len() >= blocks * Q8_0 && d.len() >= blocks && sums.len() >= blocks,
        "activation row or side table shorter than the weight row"
    );
    let mut acc = _mm_setzero_ps();
    let full = blocks - blocks % GROUP;
    let mut g = 0;
    while g < full {
        // SAFETY: g + GROUP <= blocks, so the ranges end within w (blocks * WB bytes),
        // a (at least blocks * Q8_0 bytes), d and sums (at least blocks each), asserted above.
        let (w4, a4, d4, s4) = unsafe {
            (
                w.get_unchecked(g * WB..(g + GROUP) * WB),
                a.get_unchecked(g * Q8_0..(g + GROUP) * Q8_0),
                d.get_unchecked(g..g + GROUP),
                sums.get_unchecked(g..g + GROUP),
            )
        };
        prefetch(w, g * WB);
        acc = _mm_add_ps(acc, q5_0_side_group(w4, a4, d4, s4));
        g += GROUP;
    }
    if g < blocks {
        // The last group, zero-padded; lanes without a block stay untouched.
        let count = blocks - g;
        let mut wpad = [0u8; GROUP * WB];
        let mut apad = [0u8; GROUP * Q8_0];
        let (mut dpad, mut spad) = ([0f32; GROUP], [0i32; GROUP]);
        wpad[..count * WB].copy_from_slice(&w[g * WB..][..count * WB]);
        apad[..count * Q8_0].copy_from_slice(&a[g * Q8_0..][..count * Q8_0]);
        dpad[..count].copy_from_slice(&d[g..][..count]);
        spad[..count].copy_from_slice(&sums[g..][..count]);
        let v = q5_0_side_group(&wpad, &apad, &dpad, &spad);
        let real = _mm_cmpgt_epi32(_mm_set1_epi32(count as i32), _mm_setr_epi32(0, 1, 2, 3));
        acc = _mm_blendv_ps(acc, _mm_add_ps(acc, v), _mm_castsi128_ps(real));
    }
    // (lane 0 + lane 2) + (lane 1 + lane 3)
    let s = _mm_add_ps(acc, _mm_movehl_ps(acc, acc));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps::<0b01>(s, s)))
}

/// [`dot_q5_0_side`] of `out.len()` consecutive weight rows (`w` split evenly) with one
/// activation row: `out[r]` = dot of row r.
#[target_feature(enable = "avx2,f16c")]
pub(super) fn dot_q5_0_side_rows(w: &[u8], a: &[u8], d: &[f32], sums: &[i32], out: &mut [f32]) {
    let Some(wrb) = side_row_bytes(w, out.len(), 22, "Q5_0") else {
        return;
    };
    for (wr, o) in w.chunks_exact(wrb).zip(out.iter_mut()) {
        *o = dot_q5_0_side(wr, a, d, sums);
    }
}

/// [`dot_q8_0_side`] of `out.len()` consecutive weight rows (`w` split evenly) with one
/// activation row: `out[r]` = dot of row r.
#[target_feature(enable = "avx2,f16c")]
pub(super) fn dot_q8_0_side_rows(w: &[u8], a: &[u8], d: &[f32], sums: &[i32], out: &mut [f32]) {
    let Some(wrb) = side_row_bytes(w, out.len(), 34, "Q8_0") else {
        return;
    };
    for (wr, o) in w.chunks_exact(wrb).zip(out.iter_mut()) {
        *o = dot_q8_0_side(wr, a, d, sums);
    }
}

/// [`dot_q5_0`] of one weight row with 4 activation rows (prefill).
#[target_feature(enable = "avx2,f16c")]
pub(super) fn dot_q5_0_x4(w: &[u8], a: [&[u8]; 4]) -> [f32; 4] {
    dot_blocks_multi(
        w,
        a,
        (22, Q8_0),
        |wb| q5_0_signed(wb),
        |q, ab| widen_pairs(pairs_small_w(q, load32(&ab[2..]))),
        |w4, a4, s| value_dd_s(w4, 22, a4, s),
    )
}

#[target_feature(enable = "avx2,f16c")]
pub(super) fn dot_q5_1(w: &[u8], a: &[u8]) -> f32 {
    dot_blocks(
        w,
        a,
        (24, Q8_1),
        |wb, ab| {
            let q = five_bits(&wb[4..8], &wb[8..]);
            widen_pairs(_mm256_maddubs_epi16(q, load32(&ab[4..])))
        },
        |w4, a4, s| value_with_min(w4, 24, a4, s),
    )
}

/// s * (d_w * d_a), the Q8_0 block value.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn value_q8_0(w4: &[u8], a4: &[u8], s: __m128) -> __m128 {
    _mm_mul_ps(s, _mm_mul_ps(f16x4(w4, 34, 0), f16x4(a4, Q8_0, 0)))
}

/// Q8_0 block's exact integer sum. Weights from a file may hold -128: the widening dot is
/// exact for every byte.
#[inline]
#[target_feature(enable = "avx2")]
fn q8_0_isum(wb: &[u8], ab: &[u8]) -> __m256i {
    dot_i8_any(&wb[2..], &ab[2..])
}

#[target_feature(enable = "avx2,f16c")]
pub(super) fn dot_q8_0(w: &[u8], a: &[u8]) -> f32 {
    dot_blocks(
        w,
        a,
        (34, Q8_0),
        |wb, ab| q8_0_isum(wb, ab),
        |w4, a4, s| value_q8_0(w4, a4, s),
    )
}

/// The 4 block sums of one Q8_0 group as i32 lanes, for activations without -128 (each byte of
/// activation -128 sets its lane of `bad`, which the caller checks): |w| is the unsigned
/// operand (a weight of -128 becomes the byte 128, still exact as unsigned) and w's sign moves
/// onto a, so a pair is at most 2·128·127 = 32,512 and `maddubs` never saturates.
#[inline]
#[target_feature(enable = "avx2")]
fn q8_0_side_sums(w4: &[u8], a4: &[u8], bad: &mut __m256i) -> __m128i {
    let (w4, a4) = (&w4[..GROUP * 34], &a4[..GROUP * Q8_0]);
    let b0 = q8_0_side_block(w4, a4, bad);
    let b1 = q8_0_side_block(&w4[34..], &a4[Q8_0..], bad);
    let b2 = q8_0_side_block(&w4[2 * 34..], &a4[2 * Q8_0..], bad);
    let b3 = q8_0_side_block(&w4[3 * 34..], &a4[3 * Q8_0..], bad);
    hsum4([b0, b1, b2, b3])
}

/// One block of [`q8_0_side_sums`] as 8 i32 lanes.
#[inline]
#[target_feature(enable = "avx2")]
fn q8_0_side_block(wb: &[u8], ab: &[u8], bad: &mut __m256i) -> __m256i {
    let w = load32(&wb[2..]);
    let a = load32(&ab[2..]);
    *bad = _mm256_or_si256(*bad, _mm256_cmpeq_epi8(a, _mm256_set1_epi8(i8::MIN)));
    widen_pairs(_mm256_maddubs_epi16(
        _mm256_abs_epi8(w),
        _mm256_sign_epi8(a, w),
    ))
}

/// s · (d_w · d_a) of one Q8_0 group, d_a from the side table.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn q8_0_side_value(w4: &[u8], s: __m128i, d4: &[f32]) -> __m128 {
    let d4 = &d4[..GROUP];
    // SAFETY: d4 holds 4 elements (sliced above); loadu needs no alignment.
    let da = unsafe { _mm_loadu_ps(d4.as_ptr()) };
    _mm_mul_ps(_mm_cvtepi32_ps(s), _mm_mul_ps(f16x4(w4, 34, 0), da))
}

/// [`dot_q8_0`] with the activation row's block scales as f32 from the matmul's side table
/// (`d`; the sums are unused): no activation scale is converted from f16 per weight row, and
/// the integer part takes one `maddubs` per block instead of four widenings and two `madd`s.
/// That needs activations without -128 (quantized activations lie in -127..=127); a row that
/// holds one is redone by [`dot_q8_0`], so the result is exact for any bytes. Block values
/// s · (d_w · d_a) and their lanes are [`dot_q8_0`]'s.
#[target_feature(enable = "avx2,f16c")]
pub(super) fn dot_q8_0_side(w: &[u8], a: &[u8], d: &[f32], _sums: &[i32]) -> f32 {
    const WB: usize = 34;
    let blocks = w.len() / WB;
    // The panic indexing a short row gave, checked once instead of per group.
    assert!(
        a.len() >= blocks * Q8_0 && d.len() >= blocks,
        "activation row or side table shorter than the weight row"
    );
    let mut bad = _mm256_setzero_si256();
    let mut acc = _mm_setzero_ps();
    let full = blocks - blocks % GROUP;
    let mut g = 0;
    while g < full {
        // SAFETY: g + GROUP <= blocks, so both ranges end within w (blocks * WB bytes) and
        // a (at least blocks * Q8_0 bytes, asserted above).
        let (w4, a4) = unsafe {
            (
                w.get_unchecked(g * WB..(g + GROUP) * WB),
                a.get_unchecked(g * Q8_0..(g + GROUP) * Q8_0),
            )
        };
        prefetch(w, g * WB);
        // SAFETY: g + GROUP <= blocks <= d.len() (asserted above).
        let d4 = unsafe { d.get_unchecked(g..g + GROUP) };
        let s = q8_0_side_sums(w4, a4, &mut bad);
        acc = _mm_add_ps(acc, q8_0_side_value(w4, s, d4));
        g += GROUP;
    }
    if g < blocks {
        // The last group, zero-padded; lanes without a block stay untouched.
        let count = blocks - g;
        let mut wpad = [0u8; GROUP * WB];
        let mut apad = [0u8; GROUP * Q8_0];
        let mut dpad = [0f32; GROUP];
        wpad[..count * WB].copy_from_slice(&w[g * WB..][..count * WB]);
        apad[..count * Q8_0].copy_from_slice(&a[g * Q8_0..][..count * Q8_0]);
        dpad[..count].copy_from_slice(&d[g..][..count]);
        let s = q8_0_side_sums(&wpad, &apad, &mut bad);
        let v = q8_0_side_value(&wpad, s, &dpad);
        let real = _mm_cmpgt_epi32(_mm_set1_epi32(count as i32), _mm_setr_epi32(0, 1, 2, 3));
        acc = _mm_blendv_ps(acc, _mm_add_ps(acc, v), _mm_castsi128_ps(real));
    }
    if _mm256_testz_si256(bad, bad) == 0 {
        return dot_q8_0(w, a);
    }
    // (lane 0 + lane 2) + (lane 1 + lane 3)
    let s = _mm_add_ps(acc, _mm_movehl_ps(acc, acc));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps::<0b01>(s, s)))
}

#[target_feature(enable = "avx2,f16c")]
pub(super) fn dot_iq4_nl(w: &[u8], a: &[u8]) -> f32 {
    let table = iq4_table();
    dot_blocks(
        w,
        a,
        (18, Q8_0),
        |wb, ab| {
            // Table values lie in -127..=113.
            let v = _mm256_shuffle_epi8(table, nibbles32(&wb[2..]));
            widen_pairs(pairs_small_w(v, load32(&ab[2..])))
        },
        |w4, a4, s| value_dd_s(w4, 18, a4, s),
    )
}
