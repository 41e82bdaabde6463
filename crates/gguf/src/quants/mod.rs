//! GGML weight types: block layouts, reference dequantization and quantization, and scalar
//! reference dot products.
//!
//! Everything here is the *reference* that fast kernels are proven against: scalar, plain,
//! one block at a time.
//!
//! - Dequantization is bit-identical to gguf-py's `gguf.quants.dequantize` (fixtures in
//!   `tests/fixtures/quants`): it uses gguf-py's f32 arithmetic order and never fuses a
//!   multiply-add, because a fused `d*q + m` rounds once where numpy rounds twice.
//! - Quantization from f32 is byte-identical to `gguf.quants.quantize` for the types gguf-py
//!   implements (F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0); Q8_1 and Q8_K (activation formats
//!   gguf-py lacks) follow llama.cpp's reference quantizers.
//! - [`vec_dot`] multiplies one weight row with one activation row encoded in
//!   [`vec_dot_type`], the pairing llama.cpp uses: integer sums per block, then one f32 scale;
//!   block values add in [`BLOCK_LANES`] f32 lanes (float rows: [`FLOAT_DOT_LANES`] f64
//!   lanes), an order SIMD kernels (`minfer_cpu::simd`) reproduce bit for bit.
//!
//! Block layouts (byte offsets; all multi-byte fields little-endian, `f16` = IEEE half):
//!
//! | type   | elems | bytes | layout |
//! |--------|------:|------:|--------|
//! | Q4_0   | 32  | 18  | d f16, qs\[16\] (element j: low nibble of qs\[j\], element j+16: high nibble) |
//! | Q4_1   | 32  | 20  | d f16, m f16, qs\[16\] |
//! | Q5_0   | 32  | 22  | d f16, qh u32 (bit j = 5th bit of element j), qs\[16\] |
//! | Q5_1   | 32  | 24  | d f16, m f16, qh u32, qs\[16\] |
//! | Q8_0   | 32  | 34  | d f16, qs i8\[32\] |
//! | Q8_1   | 32  | 36  | d f16, s f16 (= d * sum(qs)), qs i8\[32\] |
//! | Q2_K   | 256 | 84  | scales\[16\] (low nibble scale, high nibble min), qs\[64\], d f16, dmin f16 |
//! | Q3_K   | 256 | 110 | hmask\[32\], qs\[64\], scales\[12\] (16 x 6 bit), d f16 |
//! | Q4_K   | 256 | 144 | d f16, dmin f16, scales\[12\] (8 scales + 8 mins, 6 bit), qs\[128\] |
//! | Q5_K   | 256 | 176 | d f16, dmin f16, scales\[12\], qh\[32\], qs\[128\] |
//! | Q6_K   | 256 | 210 | ql\[128\], qh\[64\], scales i8\[16\], d f16 |
//! | Q8_K   | 256 | 292 | d f32, qs i8\[256\], bsums i16\[16\] (sums of 16 qs each) |
//! | IQ4_NL | 32  | 18  | d f16, qs\[16\] (nibbles index [`KVALUES_IQ4NL`]) |
//! | IQ4_XS | 256 | 136 | d f16, scales_h u16, scales_l\[4\], qs\[128\] |

pub mod blocks;
mod float;
mod imatrix_quantize;
mod iq;
mod iq_quantize;
mod kquants;
mod kquants_quantize;
mod legacy;
mod random;

pub use blocks::Block;
pub use float::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16, FLOAT_DOT_LANES};
pub use iq::KVALUES_IQ4NL;
pub use kquants::unpack_scale_min_k4;
pub use random::{random_blocks, try_random_blocks};

use crate::{Error, GgmlType, Result};

/// Elements per block of the legacy 32-element types.
pub const QK4_0: usize = 32;
pub const QK4_1: usize = 32;
pub const QK5_0: usize = 32;
pub const QK5_1: usize = 32;
pub const QK8_0: usize = 32;
pub const QK8_1: usize = 32;
pub const QK4_NL: usize = 32;
/// Elements per super-block of the K-quants and IQ4_XS.
pub const QK_K: usize = 256;
/// Bytes of packed 6-bit scales and mins in Q4_K/Q5_K (and of the 16 6-bit scales in Q3_K).
pub const K_SCALE_SIZE: usize = 12;

/// (elements, bytes) per block of a type minfer computes with; a typed error otherwise.
fn supported_geometry(ty: GgmlType, op: &'static str) -> Result<(usize, usize)> {
    if !ty.is_supported() {
        return Err(Error::UnsupportedQuantType { ty, op });
    }
    let (bs, ts) = ty.block_geometry();
    Ok((bs as usize, ts as usize))
}

/// Checks that `n` elements are whole blocks and that `bytes` is exactly their size.
fn check_row(
    op: &'static str,
    ty: GgmlType,
    what: &'static str,
    n: usize,
    bytes: usize,
) -> Result<(usize, usize)> {
    let (bs, ts) = supported_geometry(ty, op)?;
    if !n.is_multiple_of(bs) {
        return Err(Error::PartialBlock {
            op,
            ty,
            n,
            block: bs,
        });
    }
    let expected = n / bs * ts;
    if bytes != expected {
        return Err(Error::RowBytes {
            op,
            ty,
            what,
            n,
            expected,
            got: bytes,
        });
    }
    Ok((bs, ts))
}

/// Dequantizes one row: `dst.len()` elements from exactly the row's bytes in `src`.
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<()> {
    const OP: &str = "dequantize_row";
    let (bs, ts) = check_row(OP, ty, "blocks", dst.len(), src.len())?;
    let blocks = src.chunks_exact(ts).zip(dst.chunks_exact_mut(bs));
    use GgmlType as T;
    if ty == T::F16 {
        // One element per block: a call per element would cost more than the conversion.
        float::dequant_f16_row(src, dst);
        return Ok(());
    }
    let f: fn(&[u8], &mut [f32]) = match ty {
        T::F32 => float::dequant_f32,
        T::F16 => float::dequant_f16,
        T::Bf16 => float::dequant_bf16,
        T::Q4_0 => legacy::dequant_q4_0,
        T::Q4_1 => legacy::dequant_q4_1,
        T::Q5_0 => legacy::dequant_q5_0,
        T::Q5_1 => legacy::dequant_q5_1,
        T::Q8_0 => legacy::dequant_q8_0,
        T::Q8_1 => legacy::dequant_q8_1,
        T::Q2K => kquants::dequant_q2_k,
        T::Q3K => kquants::dequant_q3_k,
        T::Q4K => kquants::dequant_q4_k,
        T::Q5K => kquants::dequant_q5_k,
        T::Q6K => kquants::dequant_q6_k,
        T::Q8K => kquants::dequant_q8_k,
        T::Iq4Nl => iq::dequant_iq4_nl,
        T::Iq4Xs => iq::dequant_iq4_xs,
        _ => return Err(Error::UnsupportedQuantType { ty, op: OP }),
    };
    for (block, out) in blocks {
        f(block, out);
    }
    Ok(())
}

/// Quantizes one row of f32 into `dst`, which must be exactly the row's size in `ty`.
/// Targets: every supported type (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K,
/// Q3_K, Q4_K, Q5_K, Q6_K, Q8_K, IQ4_NL, IQ4_XS); the K-quants and IQ4 types follow
/// llama.cpp's quantizers without an importance matrix (`kquants_quantize`).
pub fn quantize_row(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<()> {
    const OP: &str = "quantize_row";
    use GgmlType as T;
    let f: fn(&[f32], &mut [u8]) = match ty {
        T::F32 => float::quant_f32,
        T::F16 => float::quant_f16,
        T::Bf16 => float::quant_bf16,
        T::Q4_0 => legacy::quant_q4_0,
        T::Q4_1 => legacy::quant_q4_1,
        T::Q5_0 => legacy::quant_q5_0,
        T::Q5_1 => legacy::quant_q5_1,
        T::Q8_0 => legacy::quant_q8_0,
        T::Q8_1 => legacy::quant_q8_1,
        T::Q8K => kquants::quant_q8_k,
        T::Q2K => kquants_quantize::quant_q2_k,
        T::Q3K => kquants_quantize::quant_q3_k,
        T::Q4K => kquants_quantize::quant_q4_k,
        T::Q5K => kquants_quantize::quant_q5_k,
        T::Q6K => kquants_quantize::quant_q6_k,
        T::Iq4Nl => iq_quantize::quant_iq4_nl,
        T::Iq4Xs => iq_quantize::quant_iq4_xs,
        _ if ty.is_supported() => return Err(Error::NotQuantizable { ty }),
        _ => return Err(Error::UnsupportedQuantType { ty, op: OP }),
    };
    let (bs, ts) = check_row(OP, ty, "output", src.len(), dst.len())?;
    for (x, block) in src.chunks_exact(bs).zip(dst.chunks_exact_mut(ts)) {
        f(x, block);
    }
    Ok(())
}

/// Quantizes one row of f32 into `dst` with importance weights `weights` (one per element,
/// the per-column values of an importance matrix), as `llama-quantize --imatrix` does:
/// Q4_0, Q4_1, Q5_0, Q5_1, Q2_K..Q6_K, IQ4_NL and IQ4_XS take ggml's weighted quantizers
/// (`imatrix_quantize`); the other targets ignore the weights, as ggml's do, and are
/// [`quantize_row`].
pub fn quantize_row_imatrix(
    ty: GgmlType,
    src: &[f32],
    weights: &[f32],
    dst: &mut [u8],
) -> Result<()> {
    check_quantize_row(ty, src.len(), dst.len())?;
    if weights.len() != src.len() {
        return Err(Error::Invalid(format!(
            "quantize_row_imatrix: {} importance weights for a row of {} elements",
            weights.len(),
            src.len()
        )));
    }
    if imatrix_quantize::quantize_row_weighted(ty, src, weights, dst) {
        Ok(())
    } else {
        quantize_row(ty, src, dst)
    }
}

/// Encodes one row of activations for a dot product, as llama.cpp's x86 SIMD builds do: Q8_0
/// and Q8_1 use q = round-half-even(x · 127 / max|x|) (`quantize_row_q8_0`/`_q8_1` of
/// `arch/x86/quants.c`) where [`quantize_row`] follows the portable `_ref` rule that GGUF
/// weights are written with (q = round-half-away(x / d)); the two differ in a few quants per
/// row (ties, and products one ulp apart). Every other type is [`quantize_row`] (Q8_K's
/// x86 quantizer is its `_ref`).
pub fn quantize_act_row(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<()> {
    let f: fn(&[f32], &mut [u8]) = match ty {
        GgmlType::Q8_0 => legacy::quant_q8_0_act,
        GgmlType::Q8_1 => legacy::quant_q8_1_act,
        _ => return quantize_row(ty, src, dst),
    };
    let (bs, ts) = check_row("quantize_act_row", ty, "output", src.len(), dst.len())?;
    for (x, block) in src.chunks_exact(bs).zip(dst.chunks_exact_mut(ts)) {
        f(x, block);
    }
    Ok(())
}

/// The activation format llama.cpp pairs with a weight type in its dot products.
/// Unsupported types return themselves; [`vec_dot`] refuses them with a typed error.
pub fn vec_dot_type(ty: GgmlType) -> GgmlType {
    use GgmlType as T;
    match ty {
        T::F32 | T::F16 | T::Bf16 => T::F32,
        T::Q4_0 | T::Q5_0 | T::Q8_0 | T::Iq4Nl => T::Q8_0,
        T::Q4_1 | T::Q5_1 | T::Q8_1 => T::Q8_1,
        T::Q2K | T::Q3K | T::Q4K | T::Q5K | T::Q6K | T::Q8K | T::Iq4Xs => T::Q8K,
        other => other,
    }
}

/// Scalar reference dot product of one weight row (`n` elements of `ty`, bytes in `w`) with one
/// activation row already encoded in [`vec_dot_type`]`(ty)` (bytes in `act`).
///
/// Quantized types accumulate exact integer products per block, scale each block sum once in
/// f32 (llama.cpp's reference structure) and add the block values in f32 over
/// [`BLOCK_LANES`] lanes combined in a fixed order. Float
/// types multiply in f32 and accumulate in f64 over [`FLOAT_DOT_LANES`] lanes combined in a
/// fixed tree, an order SIMD kernels can reproduce bit for bit.
pub fn vec_dot(ty: GgmlType, n: usize, w: &[u8], act: &[u8]) -> Result<f32> {
    let (wts, ats) = check_vec_dot(ty, n, w.len(), act.len())?;
    use GgmlType as T;
    if matches!(ty, T::F32 | T::F16 | T::Bf16) {
        return Ok(float::dot(ty, w, act));
    }
    let f: fn(&[u8], &[u8]) -> f32 = match ty {
        T::Q4_0 => legacy::dot_q4_0_q8_0,
        T::Q4_1 => legacy::dot_q4_1_q8_1,
        T::Q5_0 => legacy::dot_q5_0_q8_0,
        T::Q5_1 => legacy::dot_q5_1_q8_1,
        T::Q8_0 => legacy::dot_q8_0_q8_0,
        T::Q8_1 => legacy::dot_q8_1_q8_1,
        T::Q2K => kquants::dot_q2_k_q8_k,
        T::Q3K => kquants::dot_q3_k_q8_k,
        T::Q4K => kquants::dot_q4_k_q8_k,
        T::Q5K => kquants::dot_q5_k_q8_k,
        T::Q6K => kquants::dot_q6_k_q8_k,
        T::Q8K => kquants::dot_q8_k_q8_k,
        T::Iq4Nl => iq::dot_iq4_nl_q8_0,
        T::Iq4Xs => iq::dot_iq4_xs_q8_k,
        _ => return Err(Error::UnsupportedQuantType { ty, op: "vec_dot" }),
    };
    let mut lanes = [0.0f32; BLOCK_LANES];
    for (b, (wb, ab)) in w.chunks_exact(wts).zip(act.chunks_exact(ats)).enumerate() {
        lanes[b % BLOCK_LANES] += f(wb, ab);
    }
    Ok((lanes[0] + lanes[2]) + (lanes[1] + lanes[3]))
}

/// Lanes of the quantized dot's f32 block accumulation: block b adds its value into lane
/// b % 4, and the lanes combine as (lane 0 + lane 2) + (lane 1 + lane 3). Why not one running
/// sum: one dependent f32 add per 32-element block was the floor of the SIMD kernels; with
/// four lanes they add four blocks' values in one vector add and reproduce this order exactly.
pub const BLOCK_LANES: usize = 4;

/// The checks [`vec_dot`] makes (supported type, whole blocks, exact byte counts of both
/// rows), for kernels that compute the same dot elsewhere; Ok gives (weight block bytes,
/// activation block bytes).
pub fn check_vec_dot(
    ty: GgmlType,
    n: usize,
    w_len: usize,
    act_len: usize,
) -> Result<(usize, usize)> {
    const OP: &str = "vec_dot";
    let (_, wts) = check_row(OP, ty, "weights", n, w_len)?;
    let (_, ats) = check_row(OP, vec_dot_type(ty), "activations", n, act_len)?;
    Ok((wts, ats))
}

/// The checks [`quantize_row`] makes for `n` elements into `dst_len` bytes of `ty`.
pub fn check_quantize_row(ty: GgmlType, n: usize, dst_len: usize) -> Result<()> {
    const OP: &str = "quantize_row";
    use GgmlType as T;
    match ty {
        T::F32
        | T::F16
        | T::Bf16
        | T::Q4_0
        | T::Q4_1
        | T::Q5_0
        | T::Q5_1
        | T::Q8_0
        | T::Q8_1
        | T::Q2K
        | T::Q3K
        | T::Q4K
        | T::Q5K
        | T::Q6K
        | T::Iq4Nl
        | T::Iq4Xs
        | T::Q8K => check_row(OP, ty, "output", n, dst_len).map(|_| ()),
        _ if ty.is_supported() => Err(Error::NotQuantizable { ty }),
        _ => Err(Error::UnsupportedQuantType { ty, op: OP }),
    }
}

/// Reads the f16 at `off` as f32.
#[inline]
fn rd_f16(b: &[u8], off: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[off], b[off + 1]]))
}

/// Writes `v` rounded to f16 at `off`.
#[inline]
fn wr_f16(b: &mut [u8], off: usize, v: f32) {
    b[off..off + 2].copy_from_slice(&f32_to_f16(v).to_le_bytes());
}

#[inline]
fn rd_f32(b: &[u8], off: usize) -> f32 {
    f32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsupported_types_are_refused_by_name_everywhere() {
        let t = GgmlType::Iq2Xxs;
        let msg = dequantize_row(t, &[0; 66], &mut [0.0; 256])
            .unwrap_err()
            .to_string();
        assert!(msg.contains("IQ2_XXS is not supported by minfer"), "{msg}");
        let msg = quantize_row(t, &[0.0; 256], &mut [0; 66])
            .unwrap_err()
            .to_string();
        assert!(msg.contains("IQ2_XXS is not supported by minfer"), "{msg}");
        let msg = vec_dot(t, 256, &[0; 66], &[0; 66]).unwrap_err().to_string();
        assert!(msg.contains("IQ2_XXS is not supported by minfer"), "{msg}");
        assert!(matches!(
            try_random_blocks(t, 1, 0),
            Err(Error::UnsupportedQuantType { .. })
        ));
    }

    #[test]
    fn every_supported_type_quantizes_and_round_trips_closely() {
        let x: Vec<f32> = (0..512)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 40.0)
            .collect();
        for ty in GgmlType::SUPPORTED {
            let bytes = ty.row_bytes(512).unwrap() as usize;
            let mut q = vec![0u8; bytes];
            quantize_row(ty, &x, &mut q).unwrap();
            let mut y = vec![0f32; 512];
            dequantize_row(ty, &q, &mut y).unwrap();
            let err = x
                .iter()
                .zip(&y)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            // Q2_K's 2-bit quants of values in [-1.25, 1.25] are off by up to ~0.4.
            assert!(err < 0.45, "{ty}: max error {err}");
        }
    }

    #[test]
    fn row_sizes_are_checked() {
        let err = dequantize_row(GgmlType::Q4_0, &[0; 18], &mut [0.0; 31]).unwrap_err();
        assert!(matches!(
            err,
            Error::PartialBlock {
                n: 31,
                block: 32,
                ..
            }
        ));
        let err = dequantize_row(GgmlType::Q4_0, &[0; 17], &mut [0.0; 32]).unwrap_err();
        assert!(matches!(
            err,
            Error::RowBytes {
                expected: 18,
                got: 17,
                ..
            }
        ));
        let err = vec_dot(GgmlType::Q4K, 256, &[0; 144], &[0; 291]).unwrap_err();
        assert!(
            err.to_string()
                .contains("Q8_K row of 256 elements takes 292 bytes"),
            "{err}"
        );
    }

    /// The block lane order, hand-computed. Q8_0 weight blocks with all quants 1 and scale
    /// d, against activation blocks with all quants 1 and scale 1, have the value 32 * d.
    /// Blocks 0 and 4 (lane 0) are 2^20 and -2^20, block 1 (lane 1) is 2^-5, so the lanes
    /// give (2^20 - 2^20 + 0) + (2^-5 + 0) = 2^-5. One running f32 sum would lose 2^-5 in
    /// 2^20 + 2^-5 (half an ulp of 2^20 is 2^-4) and return 0.
    #[test]
    fn quantized_dot_sums_blocks_in_four_lanes() {
        let block = |d: f32| {
            let mut b = [1u8; 34];
            b[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
            b
        };
        let scales = [2f32.powi(15), 2f32.powi(-10), 0.0, 0.0, -(2f32.powi(15))];
        let w: Vec<u8> = scales.iter().flat_map(|&d| block(d)).collect();
        let a: Vec<u8> = (0..5).flat_map(|_| block(1.0)).collect();
        assert_eq!(vec_dot(GgmlType::Q8_0, 160, &w, &a).unwrap(), 2f32.powi(-5));
    }

    #[test]
    fn vec_dot_type_pairs_like_llama_cpp() {
        use GgmlType as T;
        for (w, a) in [
            (T::F32, T::F32),
            (T::F16, T::F32),
            (T::Bf16, T::F32),
            (T::Q4_0, T::Q8_0),
            (T::Q5_0, T::Q8_0),
            (T::Q8_0, T::Q8_0),
            (T::Iq4Nl, T::Q8_0),
            (T::Q4_1, T::Q8_1),
            (T::Q5_1, T::Q8_1),
            (T::Q2K, T::Q8K),
            (T::Q3K, T::Q8K),
            (T::Q4K, T::Q8K),
            (T::Q5K, T::Q8K),
            (T::Q6K, T::Q8K),
            (T::Iq4Xs, T::Q8K),
        ] {
            assert_eq!(vec_dot_type(w), a, "{w}");
        }
        for t in GgmlType::SUPPORTED {
            assert!(vec_dot_type(t).is_supported());
        }
    }

    /// The weights must cover the row; types ggml quantizes without them (Q8_0) give
    /// quantize_row's bytes, and a weighted type does not (the weights are not all equal).
    #[test]
    fn imatrix_rows_check_the_weights_and_q8_0_ignores_them() {
        let x: Vec<f32> = (0..256)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        let w: Vec<f32> = (0..256).map(|i| 1.0 + (i % 5) as f32).collect();
        let (mut a, mut b) = (vec![0u8; 272], vec![0u8; 272]);
        quantize_row(GgmlType::Q8_0, &x, &mut a).unwrap();
        quantize_row_imatrix(GgmlType::Q8_0, &x, &w, &mut b).unwrap();
        assert_eq!(a, b);
        let err = quantize_row_imatrix(GgmlType::Q8_0, &x, &w[..255], &mut b).unwrap_err();
        assert!(err.to_string().contains("255 importance weights"), "{err}");
        let (mut a, mut b) = (vec![0u8; 144], vec![0u8; 144]);
        quantize_row(GgmlType::Q4K, &x, &mut a).unwrap();
        quantize_row_imatrix(GgmlType::Q4K, &x, &w, &mut b).unwrap();
        assert_ne!(a, b);
    }
}
