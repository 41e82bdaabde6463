//! AVX-512 dots of the 32-element types with Q8_0 / Q8_1 activations, for 1 or 4
//! activation rows. Blocks go in groups of 8: two blocks per 512-bit vector, whose exact
//! integer sums come from VNNI's `vpdpbusd` (unsigned x signed bytes, 4 products per i32
//! lane, no saturation). Signed weights are biased to unsigned (w + bias) and the bias is
//! taken back exactly: Σ w·a = Σ (w + bias)·a - bias·Σ a, all in i32 (|lane| <= 4·255·128).
//!
//! The f32 part repeats the reference expression of `minfer_gguf::quants` lane-wise over the
//! 8 blocks (each lane rounds like the scalar expression). Block b's value adds into lane
//! b % 4 of one f32 vector (the reference's `BLOCK_LANES` order): blocks g..g+4 first, then
//! g+4..g+8; the lanes combine as (0 + 2) + (1 + 3), as in the AVX2 kernels.

use std::arch::x86_64::*;

use super::avx512_dispatch::{join256, pair32};
use super::load16;

/// Q8_0 activation block: d f16 | qs i8[32].
const Q8_0: usize = 34;
/// Q8_1 activation block: d f16 | s f16 | qs i8[32].
const Q8_1: usize = 36;
/// Blocks whose integer and float parts are computed together.
const GROUP: usize = 8;
/// The largest block of this file (Q8_1), for the zero-padded tail group.
const MAX_BLOCK: usize = 36;

/// Block sums of 8 blocks, given as 4 vectors of block pairs (block 2k in the low 256 bits
/// of `v[k]`, block 2k + 1 in the high ones), in lane order 0..8.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
pub(super) fn hsum8(v: [__m512i; 4]) -> __m256i {
    // 128-bit chunk c of `quad` holds 4 partial lanes of block c of the quad.
    let quad = |x: __m512i, y: __m512i| {
        let first = _mm512_shuffle_i32x4::<0b10_00_10_00>(x, y);
        let second = _mm512_shuffle_i32x4::<0b11_01_11_01>(x, y);
        _mm512_add_epi32(first, second)
    };
    let p = quad(v[0], v[1]); // blocks 0..4
    let q = quad(v[2], v[3]); // blocks 4..8
                              // Chunk c: [p0 + p2, q0 + q2, p1 + p3, q1 + q3], then lanes 0 and 1 the full sums.
    let r = _mm512_add_epi32(_mm512_unpacklo_epi32(p, q), _mm512_unpackhi_epi32(p, q));
    let r = _mm512_add_epi32(r, _mm512_shuffle_epi32::<0b01_00_11_10>(r));
    let order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0);
    _mm512_castsi512_si256(_mm512_permutexvar_epi32(order, r))
}

/// The f16 at byte `off` of each of 8 consecutive `stride`-byte blocks, as f32 lanes: eight
/// scalar loads into one vector. A hardware gather of 8 lanes cost more than that on the AMD
/// cores measured (Q4_1 decode matmuls +25%, docs/PERFORMANCE.md "SmolLM2 decode").
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
fn f16x8(b: &[u8], stride: usize, off: usize) -> __m256 {
    let b = &b[off..off + 7 * stride + 2];
    let h = |k: usize| u16::from_le_bytes([b[k * stride], b[k * stride + 1]]) as i16;
    _mm256_cvtph_ps(_mm_setr_epi16(
        h(0),
        h(1),
        h(2),
        h(3),
        h(4),
        h(5),
        h(6),
        h(7),
    ))
}

/// `acc + v` in the lanes of real blocks (the first `count`), `acc` elsewhere: lanes without
/// a block stay untouched, as in the reference (adding 0.0 would turn -0.0 into +0.0).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
pub(super) fn add_real(acc: __m128, v: __m128, count: usize) -> __m128 {
    let sum = _mm_add_ps(acc, v);
    if count >= 4 {
        sum
    } else {
        let real = (1u8 << count) - 1;
        _mm_mask_blend_ps(real, acc, sum)
    }
}

/// The shared loop over `T` activation rows: `unpack(w2)` turns two weight blocks into 64
/// unsigned quant bytes (once per weight block, for every row); `isum(u, a2)` gives the exact
/// sums of the two blocks against two activation blocks (block 0 in the low 256 bits);
/// `value(w8, a8, s)` the 8 block values from their sums as f32. A last group of fewer than
/// 8 blocks runs zero-padded and adds only its real lanes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
fn dot_rows<const T: usize>(
    w: &[u8],
    a: [&[u8]; T],
    (wb, ab): (usize, usize),
    unpack: impl Fn(&[u8]) -> __m512i,
    isum: impl Fn(__m512i, &[u8]) -> __m512i,
    value: impl Fn(&[u8], &[u8], __m256) -> __m256,
) -> [f32; T] {
    let blocks = w.len() / wb;
    let mut wpad = [0u8; GROUP * MAX_BLOCK];
    let mut apad = [0u8; GROUP * MAX_BLOCK];
    let mut acc = [_mm_setzero_ps(); T];
    let mut g = 0;
    while g < blocks {
        let count = (blocks - g).min(GROUP);
        let w8: &[u8] = if count == GROUP {
            &w[g * wb..][..GROUP * wb]
        } else {
            wpad[..count * wb].copy_from_slice(&w[g * wb..][..count * wb]);
            &wpad[..GROUP * wb]
        };
        let u = [
            unpack(w8),
            unpack(&w8[2 * wb..]),
            unpack(&w8[4 * wb..]),
            unpack(&w8[6 * wb..]),
        ];
        for (at, acc) in a.iter().zip(acc.iter_mut()) {
            let a8: &[u8] = if count == GROUP {
                &at[g * ab..][..GROUP * ab]
            } else {
                apad[..count * ab].copy_from_slice(&at[g * ab..][..count * ab]);
                &apad[..GROUP * ab]
            };
            let parts = [
                isum(u[0], a8),
                isum(u[1], &a8[2 * ab..]),
                isum(u[2], &a8[4 * ab..]),
                isum(u[3], &a8[6 * ab..]),
            ];
            let v = value(w8, a8, _mm256_cvtepi32_ps(hsum8(parts)));
            *acc = add_real(*acc, _mm256_castps256_ps128(v), count);
            if count > 4 {
                *acc = add_real(*acc, _mm256_extractf128_ps::<1>(v), count - 4);
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

/// The 32 nibbles of each of two 4-bit blocks (16 packed bytes at `off` of blocks of
/// `stride` bytes) in element order: per block, low nibbles (elements 0..16) then high
/// nibbles (elements 16..32).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
fn nibbles_pair(b: &[u8], stride: usize, off: usize) -> __m512i {
    let q0 = _mm256_broadcastsi128_si256(load16(&b[off..]));
    let q1 = _mm256_broadcastsi128_si256(load16(&b[stride + off..]));
    let q = join256(q0, q1);
    // 16-bit lanes 8..16 and 24..32 (the second copy of each block) shifted by 4.
    let shifted = _mm512_mask_srli_epi16::<4>(q, 0xff00_ff00, q);
    _mm512_and_si512(shifted, _mm512_set1_epi8(0x0f))
}

/// [`nibbles_pair`] plus 16 for every element whose bit is set in the blocks' 32-bit `qh`
/// (at `qh_off`): the 5-bit quants of Q5_0 / Q5_1, 0..=31.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
fn five_bits_pair(b: &[u8], stride: usize, qh_off: usize) -> __m512i {
    let u = nibbles_pair(b, stride, qh_off + 4);
    let high: __mmask64 = le_u32(b, qh_off) as u64 | ((le_u32(b, stride + qh_off) as u64) << 32);
    _mm512_mask_add_epi8(u, high, u, _mm512_set1_epi8(16))
}

/// The little-endian u32 at `b[o..o + 4]`.
#[inline(always)]
fn le_u32(b: &[u8], o: usize) -> u32 {
    let mut v = [0u8; 4];
    v.copy_from_slice(&b[o..o + 4]);
    u32::from_le_bytes(v)
}

/// Σ (u - bias)·a per i32 lane (4 elements), exact: u unsigned bytes, a signed.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
fn biased_dot(u: __m512i, a: __m512i, bias: i8) -> __m512i {
    let zero = _mm512_setzero_si512();
    let ua = _mm512_dpbusd_epi32(zero, u, a);
    let ba = _mm512_dpbusd_epi32(zero, _mm512_set1_epi8(bias), a);
    _mm512_sub_epi32(ua, ba)
}

/// s * d_w * d_a
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
fn value_s_dw_da(w8: &[u8], wb: usize, a8: &[u8], s: __m256) -> __m256 {
    _mm256_mul_ps(_mm256_mul_ps(s, f16x8(w8, wb, 0)), f16x8(a8, Q8_0, 0))
}

/// (d_w * d_a) * s
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
fn value_dd_s(w8: &[u8], wb: usize, a8: &[u8], s: __m256) -> __m256 {
    _mm256_mul_ps(_mm256_mul_ps(f16x8(w8, wb, 0), f16x8(a8, Q8_0, 0)), s)
}

/// (d_w * d_a) * s + m_w * s_a, the Q4_1/Q5_1 block value.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
fn value_with_min(w8: &[u8], wb: usize, a8: &[u8], s: __m256) -> __m256 {
    let scaled = _mm256_mul_ps(_mm256_mul_ps(f16x8(w8, wb, 0), f16x8(a8, Q8_1, 0)), s);
    _mm256_add_ps(scaled, _mm256_mul_ps(f16x8(w8, wb, 2), f16x8(a8, Q8_1, 2)))
}

/// Declares the 1-row and 4-row kernels of one type from its generic `$rows` function.
macro_rules! one_and_four {
    ($one:ident, $four:ident, $rows:ident) => {
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
        pub(super) fn $one(w: &[u8], a: &[u8]) -> f32 {
            let [v] = $rows(w, [a]);
            v
        }

        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
        pub(super) fn $four(w: &[u8], a: [&[u8]; 4]) -> [f32; 4] {
            $rows(w, a)
        }
    };
}

one_and_four!(dot_q4_0, dot4_q4_0, q4_0_rows);
one_and_four!(dot_q4_1, dot4_q4_1, q4_1_rows);
one_and_four!(dot_q5_0, dot4_q5_0, q5_0_rows);
one_and_four!(dot_q5_1, dot4_q5_1, q5_1_rows);
one_and_four!(dot_q8_0, dot4_q8_0, q8_0_rows);
one_and_four!(dot_iq4_nl, dot4_iq4_nl, iq4_nl_rows);

/// Q4_0: d f16 | qs[16]; quants u - 8 with u in 0..=15.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
fn q4_0_rows<const T: usize>(w: &[u8], a: [&[u8]; T]) -> [f32; T] {
    dot_rows(
        w,
        a,
        (18, Q8_0),
        |w2| nibbles_pair(w2, 18, 2),
        |u, a2| biased_dot(u, pair32(a2, Q8_0, 2), 8),
        |w8, a8, s| value_s_dw_da(w8, 18, a8, s),
    )
}

/// Q4_1: d f16 | m f16 | qs[16]; unsigned quants 0..=15.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
fn q4_1_rows<const T: usize>(w: &[u8], a: [&[u8]; T]) -> [f32; T] {
    dot_rows(
        w,
        a,
        (20, Q8_1),
        |w2| nibbles_pair(w2, 20, 4),
        |u, a2| _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, pair32(a2, Q8_1, 4)),
        |w8, a8, s| value_with_min(w8, 20, a8, s),
    )
}

/// Q5_0: d f16 | qh u32 | qs[16]; quants u - 16 with u in 0..=31.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
fn q5_0_rows<const T: usize>(w: &[u8], a: [&[u8]; T]) -> [f32; T] {
    dot_rows(
        w,
        a,
        (22, Q8_0),
        |w2| five_bits_pair(w2, 22, 2),
        |u, a2| biased_dot(u, pair32(a2, Q8_0, 2), 16),
        |w8, a8, s| value_dd_s(w8, 22, a8, s),
    )
}

/// Q5_1: d f16 | m f16 | qh u32 | qs[16]; unsigned quants 0..=31.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
fn q5_1_rows<const T: usize>(w: &[u8], a: [&[u8]; T]) -> [f32; T] {
    dot_rows(
        w,
        a,
        (24, Q8_1),
        |w2| five_bits_pair(w2, 24, 4),
        |u, a2| _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, pair32(a2, Q8_1, 4)),
        |w8, a8, s| value_with_min(w8, 24, a8, s),
    )
}

/// Q8_0: d f16 | qs i8[32]; weights from a file may hold -128, so every byte is biased by
/// 128 (w ^ 0x80 = w + 128 as an unsigned byte).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
fn q8_0_rows<const T: usize>(w: &[u8], a: [&[u8]; T]) -> [f32; T] {
    dot_rows(
        w,
        a,
        (34, Q8_0),
        |w2| _mm512_xor_si512(pair32(w2, 34, 2), _mm512_set1_epi8(-128)),
        |u, a2| biased_dot(u, pair32(a2, Q8_0, 2), -128),
        // s * (d_w * d_a)
        |w8, a8, s| _mm256_mul_ps(s, _mm256_mul_ps(f16x8(w8, 34, 0), f16x8(a8, Q8_0, 0))),
    )
}

/// IQ4_NL: d f16 | qs[16] indexing the IQ4 table (-127..=113), biased by 128 in the table.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
fn iq4_nl_rows<const T: usize>(w: &[u8], a: [&[u8]; T]) -> [f32; T] {
    let table = iq4_table_biased();
    dot_rows(
        w,
        a,
        (18, Q8_0),
        |w2| _mm512_shuffle_epi8(table, nibbles_pair(w2, 18, 2)),
        |u, a2| biased_dot(u, pair32(a2, Q8_0, 2), -128),
        |w8, a8, s| value_dd_s(w8, 18, a8, s),
    )
}

/// The IQ4 value table plus 128 (as unsigned bytes) in every 128-bit lane, for byte
/// shuffle lookups.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
fn iq4_table_biased() -> __m512i {
    let t = &minfer_gguf::quants::KVALUES_IQ4NL;
    let mut bytes = [0u8; 16];
    for (b, &v) in bytes.iter_mut().zip(t) {
        *b = (v as u8) ^ 0x80;
    }
    _mm512_broadcast_i32x4(load16(&bytes))
}
