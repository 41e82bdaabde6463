//! One small seeded generator for test inputs, no dependency.
//!
//! The tests drew their inputs from four algorithms, and some depend on the exact numbers
//! (inputs staged for a remote run and recomputed here, controls measured on given draws,
//! fixtures), so each is kept, chosen by the constructor:
//!
//! | constructor | algorithm | used by |
//! |---|---|---|
//! | [`Rng::splitmix64`] | splitmix64 | cpu attention, split, SIMD and llama.cpp-harness gates; engine batch invariance; gguf mutation |
//! | [`Rng::xorshift64`], [`Rng::xorshift64_raw`] | xorshift64 (13, 7, 17) | cpu `simd_models`, `attn_f16`; gguf `quants`; the `synth::Tiny` weights |
//! | [`Rng::xorshift64star`] | xorshift64* (12, 25, 27) | tokenizer fuzzing |
//! | [`Rng::xorshift32`] | xorshift32 (13, 17, 5) | the engine tests' token ids |
//!
//! The derived draws ([`Rng::below`], [`Rng::signed`], [`Rng::unit`], [`Rng::normal`]) are the
//! ones the tests computed, to the bit (pinned against the original formulas below).

/// The golden-ratio constant: splitmix64's increment, and the xorshift64 seed scrambler.
const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Alg {
    SplitMix64,
    XorShift64,
    XorShift64Star,
    XorShift32,
}

/// A seeded generator; see the module docs for which constructor to use.
#[derive(Clone, Debug)]
pub struct Rng {
    state: u64,
    alg: Alg,
}

impl Rng {
    /// splitmix64 from `seed` (any value, 0 included): the state advances by the golden
    /// ratio and each output is the state's mix.
    pub fn splitmix64(seed: u64) -> Rng {
        Rng {
            state: seed,
            alg: Alg::SplitMix64,
        }
    }

    /// xorshift64 (shifts 13, 7, 17) whose first state is `seed * golden | 1` (never zero, and
    /// nearby seeds start far apart).
    pub fn xorshift64(seed: u64) -> Rng {
        Rng::xorshift64_raw(seed.wrapping_mul(GOLDEN) | 1)
    }

    /// xorshift64 from exactly `state`, which must not be zero (zero is a fixed point).
    pub fn xorshift64_raw(state: u64) -> Rng {
        assert_ne!(state, 0, "xorshift64 state must not be zero");
        Rng {
            state,
            alg: Alg::XorShift64,
        }
    }

    /// xorshift64* (shifts 12, 25, 27, multiplier 0x2545F4914F6CDD1D) from `seed.max(1)`.
    pub fn xorshift64star(seed: u64) -> Rng {
        Rng {
            state: seed.max(1),
            alg: Alg::XorShift64Star,
        }
    }

    /// xorshift32 (shifts 13, 17, 5) from exactly `state` (zero stays zero, as it did in the
    /// token helper). Its outputs are 32-bit: [`Rng::next_u64`] returns them in the low half,
    /// so use it and [`Rng::below`] only (the float draws read the high bits).
    pub fn xorshift32(state: u32) -> Rng {
        Rng {
            state: state as u64,
            alg: Alg::XorShift32,
        }
    }

    /// The state the next draw starts from (a seed for something else, as `Tiny` does for
    /// its random K-quant blocks).
    pub fn state(&self) -> u64 {
        self.state
    }

    /// The next raw output.
    pub fn next_u64(&mut self) -> u64 {
        match self.alg {
            Alg::SplitMix64 => {
                self.state = self.state.wrapping_add(GOLDEN);
                let mut z = self.state;
                z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                z ^ (z >> 31)
            }
            Alg::XorShift64 => {
                let mut s = self.state;
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                self.state = s;
                s
            }
            Alg::XorShift64Star => {
                let mut x = self.state;
                x ^= x >> 12;
                x ^= x << 25;
                x ^= x >> 27;
                self.state = x;
                x.wrapping_mul(0x2545_f491_4f6c_dd1d)
            }
            Alg::XorShift32 => {
                let mut x = self.state as u32;
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                self.state = x as u64;
                x as u64
            }
        }
    }

    /// `next_u64() % n` as an index below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    /// Uniform in [-1, 1), a multiple of 2^-23: the top 24 bits of the next output.
    pub fn signed(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    /// Uniform in (0, 1): the top 53 bits of the next output, plus one half.
    pub fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// A standard normal sample (Box-Muller from two [`Rng::unit`] draws, cosine branch).
    pub fn normal(&mut self) -> f32 {
        let (u, v) = (self.unit(), self.unit());
        ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
    }
}

/// `n` floats in [-1, 1) from splitmix64 seeded with `seed` ([`Rng::signed`] draws).
pub fn floats(n: usize, seed: u64) -> Vec<f32> {
    let mut r = Rng::splitmix64(seed);
    (0..n).map(|_| r.signed()).collect()
}

#[cfg(test)]
mod tests {
    //! Each generator against the formula the tests carried before the kit, verbatim.
    use super::*;

    const N: usize = 10_000;

    fn splitmix_ref(s: &mut u64) -> u64 {
        *s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = *s;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn xorshift64_ref(s: &mut u64) -> u64 {
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        *s
    }

    #[test]
    fn splitmix64_and_its_draws_match_the_old_formulas() {
        for seed in [0u64, 1, 42, 0x5eed, 0x6767_7566_5EED, u64::MAX] {
            let (mut s, mut r) = (seed, Rng::splitmix64(seed));
            for _ in 0..N {
                assert_eq!(r.next_u64(), splitmix_ref(&mut s));
            }
            // attn_flash / split_exact `floats`.
            let mut s = seed;
            let want: Vec<f32> = (0..N)
                .map(|_| {
                    s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
                    let mut z = s;
                    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                    z ^= z >> 31;
                    (z >> 40) as f32 / (1u64 << 23) as f32 - 1.0
                })
                .collect();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&floats(N, seed)), bits(&want));
            // ggml_q4k / ggml_q6k_tiled `unit` and `normal`; batch_invariance / mutation `below`.
            let (mut s, mut r) = (seed, Rng::splitmix64(seed));
            let unit = |s: &mut u64| ((splitmix_ref(s) >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
            for i in 0..N {
                assert_eq!(r.unit().to_bits(), unit(&mut s).to_bits());
                let (u, v) = (unit(&mut s), unit(&mut s));
                let n = ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32;
                assert_eq!(r.normal().to_bits(), n.to_bits());
                let m = 1 + i % 1000;
                assert_eq!(r.below(m), (splitmix_ref(&mut s) % m as u64) as usize);
            }
        }
    }

    #[test]
    fn xorshift64_and_its_draws_match_the_old_formulas() {
        for seed in [0u64, 1, 7, 33, u64::MAX] {
            // engine common / gguf quants / simd_models: state `seed * golden | 1`.
            let mut s = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
            let (mut r, mut f) = (Rng::xorshift64(seed), Rng::xorshift64(seed));
            for _ in 0..N {
                let x = xorshift64_ref(&mut s);
                assert_eq!(r.next_u64(), x);
                // engine common / attn_f16: `((s >> 40) / 2^24) * 2 - 1`.
                let old = ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0;
                let new = f.signed();
                assert_eq!(new.to_bits(), old.to_bits());
                // simd_models: `(s >> 40) / 2^22 - 2` is exactly twice it.
                let old2 = ((x >> 40) as f32 / (1u64 << 22) as f32) - 2.0;
                assert_eq!((2.0 * new).to_bits(), old2.to_bits());
            }
        }
        // attn_f16 / mixed_workload: a given state.
        let mut s = 0x2545_f491_4f6c_dd1d;
        let mut r = Rng::xorshift64_raw(s);
        for _ in 0..N {
            assert_eq!(r.next_u64(), xorshift64_ref(&mut s));
        }
    }

    #[test]
    fn xorshift64star_matches_the_tokenizer_fuzzer() {
        for seed in [0u64, 1, 12345] {
            let mut s = seed.max(1);
            let mut r = Rng::xorshift64star(seed);
            for _ in 0..N {
                let mut x = s;
                x ^= x >> 12;
                x ^= x << 25;
                x ^= x >> 27;
                s = x;
                assert_eq!(r.next_u64(), x.wrapping_mul(0x2545_F491_4F6C_DD1D));
            }
        }
    }

    #[test]
    fn xorshift32_matches_the_engine_token_ids() {
        for seed in [1u32, 5, 100, 9_999] {
            let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
            let mut r = Rng::xorshift32(x);
            for _ in 0..N {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                assert_eq!(r.next_u64(), x as u64);
            }
        }
    }

    #[test]
    fn zero_index_bound_gives_zero() {
        assert_eq!(Rng::splitmix64(3).below(0), 0);
    }
}
