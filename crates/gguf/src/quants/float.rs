//! F32, F16 and BF16: conversions and their (one-element "block") rows.

use super::rd_f32;
use crate::GgmlType;

/// IEEE half to f32 (exact).
#[inline]
pub fn f16_to_f32(bits: u16) -> f32 {
    half::f16::from_bits(bits).to_f32()
}

/// f32 to IEEE half, round to nearest even (numpy's `astype(np.float16)`, ggml's FP32_TO_FP16).
#[inline]
pub fn f32_to_f16(v: f32) -> u16 {
    half::f16::from_f32(v).to_bits()
}

/// bfloat16 to f32 (exact: the top half of an f32).
#[inline]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// f32 to bfloat16 as ggml (`ggml_compute_fp32_to_bf16`) and gguf-py do it: NaN becomes a quiet
/// NaN keeping sign and top payload bits; everything else rounds to nearest even, overflowing
/// to infinity.
#[inline]
pub fn f32_to_bf16(v: f32) -> u16 {
    let n = v.to_bits();
    if n & 0x7fff_ffff > 0x7f80_0000 {
        return ((n >> 16) | 0x40) as u16;
    }
    ((n as u64 + 0x7fff + ((n >> 16) & 1) as u64) >> 16) as u16
}

pub(super) fn dequant_f32(b: &[u8], out: &mut [f32]) {
    out[0] = rd_f32(b, 0);
}

pub(super) fn dequant_f16(b: &[u8], out: &mut [f32]) {
    out[0] = f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
}

/// A whole F16 row in `half` slice conversions (F16C where the CPU has it): the
/// per-element path costs a call per element, and an f16 KV cache is dequantized through
/// here for every attention head. Same values: the conversion is exact.
pub(super) fn dequant_f16_row(src: &[u8], dst: &mut [f32]) {
    use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
    #[cfg(target_endian = "little")]
    {
        // SAFETY: every bit pattern is a valid u16; `align_to` only hands out whole,
        // aligned u16s in `mid`.
        let (pre, mid, _) = unsafe { src.align_to::<u16>() };
        if pre.is_empty() && mid.len() >= dst.len() {
            // Little-endian: the u16s are the stored f16 bit patterns.
            mid[..dst.len()]
                .reinterpret_cast::<half::f16>()
                .convert_to_f32_slice(dst);
            return;
        }
    }
    // Unaligned rows (or big-endian hosts): through a stack buffer, 64 elements at a time.
    let mut bits = [0u16; 64];
    for (s, d) in src.chunks(128).zip(dst.chunks_mut(64)) {
        for (b, c) in bits.iter_mut().zip(s.chunks_exact(2)) {
            *b = u16::from_le_bytes([c[0], c[1]]);
        }
        bits[..d.len()]
            .reinterpret_cast::<half::f16>()
            .convert_to_f32_slice(d);
    }
}

pub(super) fn dequant_bf16(b: &[u8], out: &mut [f32]) {
    out[0] = bf16_to_f32(u16::from_le_bytes([b[0], b[1]]));
}

pub(super) fn quant_f32(x: &[f32], b: &mut [u8]) {
    b.copy_from_slice(&x[0].to_le_bytes());
}

pub(super) fn quant_f16(x: &[f32], b: &mut [u8]) {
    b.copy_from_slice(&f32_to_f16(x[0]).to_le_bytes());
}

pub(super) fn quant_bf16(x: &[f32], b: &mut [u8]) {
    b.copy_from_slice(&f32_to_bf16(x[0]).to_le_bytes());
}

/// Lanes of the float dot's f64 partial sums. Element i adds into lane i % 16 and the lanes
/// combine in a fixed halving tree (lane k += lane k + 8 for k < 8, then + 4, + 2, + 1).
/// Why not one running sum: a single f64 chain cannot be vectorised, while four 4-wide f64
/// accumulators (AVX2) or eight 2-wide ones (NEON) reproduce this order exactly.
pub const FLOAT_DOT_LANES: usize = 16;

/// Float weights times f32 activations: products in f32 (never fused), summed in f64 over
/// [`FLOAT_DOT_LANES`] lanes.
pub(super) fn dot(ty: GgmlType, w: &[u8], act: &[u8]) -> f32 {
    let a = act.chunks_exact(4).map(|c| rd_f32(c, 0));
    match ty {
        GgmlType::F16 => lane_sum(
            w.chunks_exact(2)
                .zip(a)
                .map(|(c, a)| f16_to_f32(u16::from_le_bytes([c[0], c[1]])) * a),
        ),
        GgmlType::Bf16 => lane_sum(
            w.chunks_exact(2)
                .zip(a)
                .map(|(c, a)| bf16_to_f32(u16::from_le_bytes([c[0], c[1]])) * a),
        ),
        _ => lane_sum(w.chunks_exact(4).zip(a).map(|(c, a)| rd_f32(c, 0) * a)),
    }
}

fn lane_sum(products: impl Iterator<Item = f32>) -> f32 {
    let mut lanes = [0.0f64; FLOAT_DOT_LANES];
    for (i, p) in products.enumerate() {
        lanes[i % FLOAT_DOT_LANES] += p as f64;
    }
    let mut width = FLOAT_DOT_LANES / 2;
    while width > 0 {
        for k in 0..width {
            lanes[k] += lanes[k + width];
        }
        width /= 2;
    }
    lanes[0] as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The row conversion gives the per-element conversion's bits for aligned and unaligned
    /// rows, every length from 0 to 200 (partial chunks), every f16 class (all 65536 bit
    /// patterns go through both paths). Control: swapping the bytes of each f16 fails it.
    #[test]
    fn f16_rows_match_the_per_element_conversion_aligned_or_not() {
        let all: Vec<u8> = (0..=u16::MAX).flat_map(|v| v.to_le_bytes()).collect();
        let want: Vec<u32> = (0..=u16::MAX).map(|v| f16_to_f32(v).to_bits()).collect();
        for offset in [0usize, 1] {
            let mut buf = vec![0u8; all.len() + 2];
            buf[offset..offset + all.len()].copy_from_slice(&all);
            let src = &buf[offset..offset + all.len()];
            let mut out = vec![0f32; want.len()];
            dequant_f16_row(src, &mut out);
            let got: Vec<u32> = out.iter().map(|v| v.to_bits()).collect();
            assert!(got == want, "offset {offset}");
            for n in 0..200 {
                let mut out = vec![0f32; n];
                dequant_f16_row(&src[2 * 1000..2 * (1000 + n)], &mut out);
                let got: Vec<u32> = out.iter().map(|v| v.to_bits()).collect();
                assert_eq!(got, want[1000..1000 + n], "offset {offset} n {n}");
            }
        }
    }

    #[test]
    fn bf16_nan_is_quieted_and_ties_go_to_even() {
        // Hand-computed from the rule: NaN keeps sign and top bits and gains the quiet bit.
        assert_eq!(f32_to_bf16(f32::from_bits(0x7f80_0001)), 0x7fc0);
        assert_eq!(f32_to_bf16(f32::from_bits(0xff81_2345)), 0xffc1);
        assert_eq!(f32_to_bf16(f32::from_bits(0x7fc0_0000)), 0x7fc0);
        // Exactly half an ulp: 0x3f80_8000 -> even 0x3f80; 0x3f81_8000 -> even 0x3f82.
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(f32_to_bf16(f32::MAX), 0x7f80);
        assert_eq!(f32_to_bf16(f32::NEG_INFINITY), 0xff80);
        assert_eq!(bf16_to_f32(0x3f80), 1.0);
    }

    /// The lane order, hand-computed: element 0 (2^60) and element 16 (-2^60) share lane 0
    /// and cancel there; element 1 (1.0) sits alone in lane 1, so the dot is 1. A single
    /// running f64 sum would lose the 1 in 2^60 + 1 and return 0.
    #[test]
    fn float_dot_sums_in_sixteen_lanes() {
        let mut w = vec![0.0f32; 17];
        w[0] = 2f32.powi(30);
        w[16] = -(2f32.powi(30));
        w[1] = 1.0;
        let a: Vec<f32> = (0..17)
            .map(|i| if i == 1 { 1.0 } else { 2f32.powi(30) })
            .collect();
        let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        assert_eq!(dot(GgmlType::F32, &bytes(&w), &bytes(&a)), 1.0);
    }

    #[test]
    fn f16_round_trip_of_every_finite_value() {
        for bits in 0..=u16::MAX {
            if bits & 0x7c00 == 0x7c00 {
                continue;
            }
            assert_eq!(f32_to_f16(f16_to_f32(bits)), bits, "{bits:#06x}");
        }
    }
}
