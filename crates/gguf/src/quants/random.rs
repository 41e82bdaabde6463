//! Seeded random blocks of any supported type, for tests and synthetic models.
//!
//! Quant bits are uniformly random (every pattern is valid); scales are finite and moderate so
//! dequantized values stay within about ±8 and products never overflow. Derived fields are
//! made consistent: Q8_1's `s` is f16(d * sum(q)) and Q8_K's `bsums` are the sums of its quants,
//! and 8-bit quants stay in -127..=127 as the quantizers produce them.

use super::{f32_to_bf16, f32_to_f16, supported_geometry, QK_K};
use crate::{GgmlType, Result};

/// splitmix64: tiny, seedable, good enough to spread bits over blocks.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// 2^u with u uniform in [lo, hi), optionally with a random sign.
    fn magnitude(&mut self, lo: f32, hi: f32, signed: bool) -> f32 {
        let m = (lo + (hi - lo) * self.unit()).exp2();
        if signed && self.next_u64() & 1 == 1 {
            -m
        } else {
            m
        }
    }

    fn fill(&mut self, b: &mut [u8]) {
        for chunk in b.chunks_mut(8) {
            let r = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&r[..chunk.len()]);
        }
    }

    /// An 8-bit quant in -127..=127.
    fn q8(&mut self) -> i8 {
        ((self.next_u64() % 255) as i32 - 127) as i8
    }
}

fn put_f16(b: &mut [u8], off: usize, v: f32) {
    b[off..off + 2].copy_from_slice(&f32_to_f16(v).to_le_bytes());
}

/// `n_blocks` random blocks of `ty` (for F32/F16/BF16 a block is one element).
///
/// # Panics
/// If `ty` is not a type minfer supports (a programming error in a test or generator; use
/// [`try_random_blocks`] to get the typed error instead).
pub fn random_blocks(ty: GgmlType, n_blocks: usize, seed: u64) -> Vec<u8> {
    match try_random_blocks(ty, n_blocks, seed) {
        Ok(v) => v,
        Err(e) => panic!("random_blocks: {e}"),
    }
}

/// [`random_blocks`] with unsupported types reported as [`crate::Error::UnsupportedQuantType`].
pub fn try_random_blocks(ty: GgmlType, n_blocks: usize, seed: u64) -> Result<Vec<u8>> {
    let (_, ts) = supported_geometry(ty, "random_blocks")?;
    // Mix the type into the seed so two types drawn with one seed do not share bits.
    let mut rng = Rng(seed ^ (ty.id() as u64).wrapping_mul(0x2545_f491_4f6c_dd1d));
    let mut out = vec![0u8; n_blocks * ts];
    for b in out.chunks_exact_mut(ts) {
        fill_block(ty, b, &mut rng);
    }
    Ok(out)
}

fn fill_block(ty: GgmlType, b: &mut [u8], rng: &mut Rng) {
    use GgmlType as T;
    rng.fill(b);
    // Scale ranges: legacy d in ±[2^-9, 2^-5) times quants up to 16 (IQ4: 127) stays below ~4;
    // K-quant d and dmin in [2^-12, 2^-8) times 6-bit scales times quants stays below ~8.
    let legacy = |rng: &mut Rng| rng.magnitude(-9.0, -5.0, true);
    let kd = |rng: &mut Rng| rng.magnitude(-12.0, -8.0, false);
    match ty {
        T::F32 => b.copy_from_slice(&(2.0 * rng.unit() - 1.0).to_le_bytes()),
        T::F16 => b.copy_from_slice(&f32_to_f16(2.0 * rng.unit() - 1.0).to_le_bytes()),
        T::Bf16 => b.copy_from_slice(&f32_to_bf16(2.0 * rng.unit() - 1.0).to_le_bytes()),
        T::Q4_0 | T::Q5_0 => put_f16(b, 0, legacy(rng)),
        T::Q4_1 | T::Q5_1 => {
            put_f16(b, 0, legacy(rng).abs());
            put_f16(b, 2, -8.0 * legacy(rng).abs());
        }
        T::Iq4Nl | T::Iq4Xs => put_f16(b, 0, rng.magnitude(-13.0, -9.0, true)),
        T::Q8_0 => {
            put_f16(b, 0, legacy(rng));
            for v in &mut b[2..34] {
                *v = rng.q8() as u8;
            }
        }
        T::Q8_1 => {
            let d = super::f16_to_f32(f32_to_f16(legacy(rng)));
            let mut sum = 0i32;
            for v in &mut b[4..36] {
                let q = rng.q8();
                sum += q as i32;
                *v = q as u8;
            }
            put_f16(b, 0, d);
            put_f16(b, 2, sum as f32 * d);
        }
        T::Q2K => {
            put_f16(b, 80, kd(rng));
            put_f16(b, 82, kd(rng));
        }
        T::Q3K => put_f16(b, 108, kd(rng)),
        T::Q4K | T::Q5K => {
            put_f16(b, 0, kd(rng));
            put_f16(b, 2, kd(rng));
        }
        T::Q6K => put_f16(b, 208, kd(rng)),
        T::Q8K => {
            b[0..4].copy_from_slice(&rng.magnitude(-9.0, -5.0, false).to_le_bytes());
            let q: Vec<i8> = (0..QK_K).map(|_| rng.q8()).collect();
            for (o, &q) in b[4..260].iter_mut().zip(&q) {
                *o = q as u8;
            }
            for (j, chunk) in q.chunks_exact(16).enumerate() {
                let s: i32 = chunk.iter().map(|&v| v as i32).sum();
                b[260 + 2 * j..262 + 2 * j].copy_from_slice(&(s as i16).to_le_bytes());
            }
        }
        // supported_geometry has refused every other type.
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::super::dequantize_row;
    use super::*;

    #[test]
    fn every_supported_type_gives_finite_moderate_values() {
        for ty in GgmlType::SUPPORTED {
            let (bs, _) = ty.block_geometry();
            let blocks = random_blocks(ty, 64, 7);
            let mut out = vec![0.0f32; 64 * bs as usize];
            dequantize_row(ty, &blocks, &mut out).unwrap();
            let max = out.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            assert!(out.iter().all(|v| v.is_finite()), "{ty}");
            assert!(max > 1e-4 && max < 16.0, "{ty}: max |x| = {max}");
        }
    }

    #[test]
    fn seeds_are_deterministic_and_distinct() {
        let a = random_blocks(GgmlType::Q4K, 4, 1);
        assert_eq!(a, random_blocks(GgmlType::Q4K, 4, 1));
        assert_ne!(a, random_blocks(GgmlType::Q4K, 4, 2));
    }
}
