//! Seeded random tensor contents, produced row by row so a 7B-class file never needs more
//! than one row of f32 in memory per thread. Types `quants::quantize_row` can produce are
//! quantized from random f32 values; the others are random blocks rescaled so their values
//! have the same spread.
//!
//! Each tensor has one RNG stream, drawn row after row. A row's draws are a fixed count, so
//! any range of rows can be encoded on its own by jumping the stream to its first row
//! ([`Rng::skip`]): the bytes do not depend on how rows are split between threads.

use super::parallel;
use crate::error::{Error, Result};
use minfer_gguf::{quants, GgmlType};
use std::io::Write;
use std::num::NonZeroUsize;

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

/// SplitMix64's state increment (the golden-ratio "gamma").
const GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GAMMA);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1) with 24 random bits.
    pub fn next_signed(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32) * (2.0 / (1u64 << 24) as f32) - 1.0
    }

    /// Jumps over `n` draws in O(1): the state only ever grows by `GAMMA` per draw (mod 2^64),
    /// so `n` draws add `n * GAMMA`.
    pub fn skip(&mut self, n: u64) {
        self.0 = self.0.wrapping_add(n.wrapping_mul(GAMMA));
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

/// One tensor's row encoder: everything that fixes its bytes, so any range of its rows can
/// be encoded independently (and on any thread) with the same result.
#[derive(Clone, Debug)]
pub struct TensorRows {
    name: String,
    ty: GgmlType,
    row_len: usize,
    rows: usize,
    fill: Fill,
    enc: Encoding,
    row_bytes: usize,
    /// The tensor's stream seed ([`tensor_seed`]).
    stream: u64,
}

impl TensorRows {
    /// Checks that `ty` can be synthesized and that a row is whole blocks of it.
    pub fn new(
        name: &str,
        ty: GgmlType,
        row_len: usize,
        rows: usize,
        fill: Fill,
        seed: u64,
    ) -> Result<TensorRows> {
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
        Ok(TensorRows {
            name: name.into(),
            ty,
            row_len,
            rows,
            fill,
            enc,
            row_bytes,
            stream: tensor_seed(seed, name),
        })
    }

    /// RNG draws one row takes: one per value when quantizing random f32, one block-stream
    /// seed per row for random blocks.
    fn draws_per_row(&self) -> u64 {
        match self.enc {
            Encoding::Quantize => self.row_len as u64,
            Encoding::RandomBlocks => 1,
        }
    }

    /// Replaces `out` with the bytes of rows `range` (`scratch` is one row of f32, resized
    /// here, kept by the caller so each thread allocates it once).
    pub fn encode(
        &self,
        range: std::ops::Range<usize>,
        scratch: &mut Vec<f32>,
        out: &mut Vec<u8>,
    ) -> Result<()> {
        let gguf = |source| Error::Encode {
            tensor: self.name.clone(),
            ty: self.ty.name().into(),
            source: Box::new(source),
        };
        let mut rng = Rng::new(self.stream);
        rng.skip(range.start as u64 * self.draws_per_row());
        scratch.resize(self.row_len, 0.0);
        out.resize(range.len() * self.row_bytes, 0);
        for bytes in out.chunks_exact_mut(self.row_bytes) {
            match self.enc {
                Encoding::Quantize => {
                    fill_row(&mut rng, self.fill, scratch);
                    quants::quantize_row(self.ty, scratch, bytes).map_err(gguf)?;
                }
                Encoding::RandomBlocks => {
                    let row = random_row(self.ty, self.fill, self.row_len, &mut rng, scratch)
                        .map_err(gguf)?;
                    bytes.copy_from_slice(&row);
                }
            }
        }
        Ok(())
    }
}

/// Writes all rows of `t` to `out` on `threads` threads, in row order, calling
/// `progress(bytes)` after each piece written. Rows go in pieces of about [`PIECE_BYTES`]
/// (at most `2 * threads` pieces in flight), so memory stays bounded whatever the tensor.
pub fn write_tensor(
    t: &TensorRows,
    threads: NonZeroUsize,
    out: &mut dyn Write,
    progress: &mut dyn FnMut(u64),
) -> Result<()> {
    let rows_per_piece = rows_per_piece(t.rows, t.row_bytes, threads.get());
    let n_pieces = t.rows.div_ceil(rows_per_piece);
    let piece = |j: usize| j * rows_per_piece..((j + 1) * rows_per_piece).min(t.rows);
    let encode =
        |j: usize, scratch: &mut Vec<f32>, buf: &mut Vec<u8>| t.encode(piece(j), scratch, buf);
    let mut sink = |bytes: &[u8]| -> Result<()> {
        out.write_all(bytes).map_err(|source| Error::Io {
            what: format!("writing tensor {}", t.name),
            source,
        })?;
        progress(bytes.len() as u64);
        Ok(())
    };
    parallel::encode_in_order(n_pieces, threads, &encode, &mut sink)
}

/// Target bytes of one piece of rows: big enough that handing pieces between threads costs
/// nothing next to encoding them, small enough to stay in a core's L2 cache until written
/// (1 MiB pieces made one-thread f16 synthesis ~10% slower than the row-at-a-time writer).
pub const PIECE_BYTES: usize = 1 << 18;

/// Rows per piece: about [`PIECE_BYTES`], and at least four pieces per thread when the
/// tensor is smaller than that, so small tensors are spread too.
fn rows_per_piece(rows: usize, row_bytes: usize, threads: usize) -> usize {
    let by_size = (PIECE_BYTES / row_bytes.max(1)).max(1);
    let by_spread = rows.div_ceil(4 * threads).max(1);
    by_size.min(by_spread)
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
    fn skip_lands_where_stepping_does() {
        for n in [0u64, 1, 2, 895, 4864 * 1000 + 3] {
            let (mut jumped, mut stepped) = (Rng::new(99), Rng::new(99));
            jumped.skip(n);
            for _ in 0..n {
                stepped.next_u64();
            }
            assert_eq!(jumped.next_u64(), stepped.next_u64(), "skip({n})");
        }
    }

    #[test]
    fn pieces_are_bounded_and_spread() {
        // A 7B token embedding in Q4_K: 2016-byte rows, 1 MiB pieces.
        assert_eq!(rows_per_piece(152_064, 2016, 16), PIECE_BYTES / 2016);
        // A small tensor is split four ways per thread; one row never goes below one.
        assert_eq!(rows_per_piece(256, 144, 4), 16);
        assert_eq!(rows_per_piece(1, 3584 * 4, 16), 1);
        assert_eq!(rows_per_piece(3, 1 << 24, 1), 1);
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
