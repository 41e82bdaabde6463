//! Seeded random tensor contents, produced row by row so a 7B-class file never needs more
//! than one row of f32 in memory. Types `quants::quantize_row` can produce are quantized
//! from random f32 values; the others (K-quants, IQ4) are random blocks rescaled so their
//! values have the same spread.

use crate::error::{Error, Result};
use minfer_gguf::{quants, GgmlType};
use std::io::Write;

/// What a tensor holds, which sets the distribution of its values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fill {
    /// A 2-D weight: uniform with standard deviation 1/sqrt(row length), so a matmul of a
    /// unit-RMS input gives unit-RMS outputs and logits have a spread of about 1.
    Matrix,
    /// An RMSNorm weight: 1 ± 0.1 (not exactly 1, so a kernel that skips the weight is seen).
    Norm,
    /// A bias: uniform with standard deviation 0.02.
    Bias,
}

/// SplitMix64: tiny, fast and good enough for test weights; the same seed gives the same
/// stream on every platform.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1) with 24 random bits.
    pub fn next_signed(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32) * (2.0 / (1u64 << 24) as f32) - 1.0
    }
}

/// The per-tensor seed: the user's seed mixed with the tensor's name (FNV-1a), so each
/// tensor's values do not depend on which other tensors exist or their order.
pub fn tensor_seed(seed: u64, name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
    }
    let mut r = Rng::new(seed ^ h);
    r.next_u64()
}

/// Fills one row of f32 values.
fn fill_row(rng: &mut Rng, fill: Fill, row: &mut [f32]) {
    // A uniform on [-a, a] has standard deviation a / sqrt(3).
    let (center, half_width) = match fill {
        Fill::Matrix => (0.0, 3f32.sqrt() / (row.len() as f32).sqrt()),
        Fill::Norm => (1.0, 0.1),
        Fill::Bias => (0.0, 3f32.sqrt() * 0.02),
    };
    for x in row.iter_mut() {
        *x = center + half_width * rng.next_signed();
    }
}

/// Byte offsets of the f16 super-block scales (d, and dmin where there is one) of the types
/// `quantize_row` cannot produce: random blocks of these are rescaled by multiplying these
/// fields, which scales every value of the block (value = d * scale * q - dmin * min).
fn block_scale_fields(ty: GgmlType) -> Option<&'static [usize]> {
    use GgmlType as T;
    Some(match ty {
        T::Q2K => &[80, 82],
        T::Q3K => &[108],
        T::Q4K | T::Q5K => &[0, 2],
        T::Q6K => &[208],
        T::Iq4Nl | T::Iq4Xs => &[0],
        _ => return None,
    })
}

/// How a tensor of a given type gets its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Encoding {
    /// Random f32 values quantized with `quants::quantize_row`.
    Quantize,
    /// `quants::try_random_blocks`, rescaled to the fill's spread.
    RandomBlocks,
}

fn encoding(ty: GgmlType) -> Option<Encoding> {
    if !ty.is_supported() {
        return None;
    }
    // Ask quantize_row itself (one block of zeros) so this follows whatever it supports.
    let n = ty.block_size() as usize;
    let mut out = vec![0u8; ty.type_size() as usize];
    match quants::quantize_row(ty, &vec![0.0; n], &mut out) {
        Ok(()) => Some(Encoding::Quantize),
        Err(_) => block_scale_fields(ty).map(|_| Encoding::RandomBlocks),
    }
}

/// Whether a tensor of this type can be synthesized at all.
pub fn can_encode(ty: GgmlType) -> bool {
    encoding(ty).is_some()
}

fn f16_at(b: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// One row of random blocks whose values have the fill's RMS (measured by dequantizing,
/// then corrected by scaling each block's super-block scales).
fn random_row(
    ty: GgmlType,
    fill: Fill,
    row_len: usize,
    rng: &mut Rng,
    scratch: &mut [f32],
) -> std::result::Result<Vec<u8>, minfer_gguf::Error> {
    let n_blocks = row_len / ty.block_size() as usize;
    let mut bytes = quants::try_random_blocks(ty, n_blocks, rng.next_u64())?;
    quants::dequantize_row(ty, &bytes, scratch)?;
    let rms = (scratch.iter().map(|x| x * x).sum::<f32>() / row_len as f32).sqrt();
    let want = match fill {
        Fill::Matrix => 1.0 / (row_len as f32).sqrt(),
        Fill::Norm => 1.0,
        Fill::Bias => 0.02,
    };
    let fields = block_scale_fields(ty).expect("RandomBlocks types have scale fields");
    if rms > 0.0 && rms.is_finite() {
        let k = want / rms;
        for b in bytes.chunks_exact_mut(ty.type_size() as usize) {
            for &at in fields {
                let v = half::f16::from_f32(f16_at(b, at) * k);
                b[at..at + 2].copy_from_slice(&v.to_le_bytes());
            }
        }
    }
    Ok(bytes)
}

/// Writes `rows` rows of `row_len` values of type `ty` to `out`.
pub fn write_tensor(
    name: &str,
    ty: GgmlType,
    row_len: usize,
    rows: usize,
    fill: Fill,
    seed: u64,
    out: &mut dyn Write,
) -> Result<()> {
    let io = |source| Error::Io {
        what: format!("writing tensor {name}"),
        source,
    };
    let gguf = |source| Error::Encode {
        tensor: name.into(),
        ty: ty.name().into(),
        source: Box::new(source),
    };
    let Some(enc) = encoding(ty) else {
        return Err(Error::UnsupportedWeightType {
            tensor: name.into(),
            ty: ty.name().into(),
        });
    };
    let row_bytes = ty
        .row_bytes(row_len as u64)
        .ok_or_else(|| Error::RowNotWholeBlocks {
            tensor: name.into(),
            row_len: row_len as u64,
            ty: ty.name().into(),
            block: ty.block_size(),
            fallback: None,
        })? as usize;
    let mut rng = Rng::new(tensor_seed(seed, name));
    let mut row = vec![0f32; row_len];
    let mut bytes = vec![0u8; row_bytes];
    for _ in 0..rows {
        match enc {
            Encoding::Quantize => {
                fill_row(&mut rng, fill, &mut row);
                quants::quantize_row(ty, &row, &mut bytes).map_err(gguf)?;
            }
            Encoding::RandomBlocks => {
                bytes = random_row(ty, fill, row_len, &mut rng, &mut row).map_err(gguf)?;
            }
        }
        out.write_all(&bytes).map_err(io)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_matches_its_published_first_outputs() {
        // Reference values of SplitMix64 seeded with 1234567 (from the algorithm's
        // reference C implementation, Vigna 2015).
        let mut r = Rng::new(1234567);
        assert_eq!(r.next_u64(), 6457827717110365317);
        assert_eq!(r.next_u64(), 3203168211198807973);
    }

    #[test]
    fn fills_have_the_intended_spread() {
        let mut rng = Rng::new(7);
        let mut row = vec![0f32; 4096];
        fill_row(&mut rng, Fill::Matrix, &mut row);
        let var = row.iter().map(|x| x * x).sum::<f32>() / row.len() as f32;
        // Target variance 1/4096; 4096 samples put the estimate within a few percent.
        assert!((var * 4096.0 - 1.0).abs() < 0.1, "variance {var}");
        fill_row(&mut rng, Fill::Norm, &mut row);
        assert!(row.iter().all(|x| (0.9..=1.1).contains(x)));
    }
}
