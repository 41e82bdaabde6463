//! The sampler chain, in llama.cpp's order and with its defaults:
//! logit bias → penalties (repeat / frequency / presence over the last N tokens) → greedy
//! shortcut at temperature ≤ 0 → top-k → top-p → min-p → temperature → seeded draw.
//!
//! Top-p and min-p see the untempered distribution because temperature comes after them,
//! as in llama.cpp's default chain. The RNG is our own (SplitMix64 → xoshiro256**): the
//! same seed gives the same tokens on every machine, but not llama.cpp's tokens (it uses
//! std::mt19937), so sampled output is only comparable to llama.cpp at temperature 0.

use std::collections::HashMap;

/// Sampling settings. `Default` is llama.cpp's `common_params_sampling` default.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerConfig {
    /// ≤ 0 means greedy (argmax after bias and penalties).
    pub temperature: f32,
    /// ≤ 0 disables.
    pub top_k: i32,
    /// ≥ 1 disables.
    pub top_p: f32,
    /// ≤ 0 disables.
    pub min_p: f32,
    /// Window of previous tokens the penalties look at; 0 disables them.
    pub repeat_last_n: usize,
    /// 1.0 disables.
    pub repeat_penalty: f32,
    pub frequency_penalty: f32,
    pub presence_penalty: f32,
    /// Added to the logit of a token id before anything else (−inf bans it).
    pub logit_bias: Vec<(u32, f32)>,
    pub seed: u64,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_last_n: 64,
            repeat_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            logit_bias: Vec::new(),
            seed: 0x5eed,
        }
    }
}

#[derive(Clone, Debug, thiserror::Error, PartialEq)]
pub enum SamplerError {
    #[error("sampler setting {name} = {value} is out of range ({why})")]
    BadSetting {
        name: &'static str,
        value: String,
        why: &'static str,
    },
    #[error("logit bias names token {id}, but the vocabulary has {vocab} tokens")]
    BiasTokenOutOfRange { id: u32, vocab: usize },
    #[error("no candidate token is left to sample (every logit is -inf or NaN)")]
    NoCandidates,
}

impl SamplerConfig {
    /// Refuses settings llama.cpp would misbehave on, naming the setting.
    pub fn validate(&self) -> Result<(), SamplerError> {
        let bad = |name, value: f32, why| SamplerError::BadSetting {
            name,
            value: value.to_string(),
            why,
        };
        if !self.temperature.is_finite() {
            return Err(bad("temperature", self.temperature, "must be finite"));
        }
        if !(0.0..=1.0).contains(&self.top_p) || self.top_p.is_nan() {
            return Err(bad("top_p", self.top_p, "0 to 1"));
        }
        if !(0.0..=1.0).contains(&self.min_p) || self.min_p.is_nan() {
            return Err(bad("min_p", self.min_p, "0 to 1"));
        }
        if !(self.repeat_penalty > 0.0 && self.repeat_penalty.is_finite()) {
            return Err(bad("repeat_penalty", self.repeat_penalty, "must be > 0"));
        }
        if !self.frequency_penalty.is_finite() {
            return Err(bad(
                "frequency_penalty",
                self.frequency_penalty,
                "must be finite",
            ));
        }
        if !self.presence_penalty.is_finite() {
            return Err(bad(
                "presence_penalty",
                self.presence_penalty,
                "must be finite",
            ));
        }
        Ok(())
    }
}

/// xoshiro256** seeded through SplitMix64: small, fast, reproducible everywhere.
#[derive(Clone, Debug)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Rng {
            s: [next(), next(), next(), next()],
        }
    }
    pub fn next_u64(&mut self) -> u64 {
        let r = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        r
    }
    /// Uniform in [0, 1) with 53 bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

#[derive(Clone, Copy, Debug)]
struct Candidate {
    id: u32,
    logit: f32,
}

/// A configured chain with its RNG state and candidate buffer (reused across steps).
#[derive(Clone, Debug)]
pub struct Sampler {
    cfg: SamplerConfig,
    rng: Rng,
    cands: Vec<Candidate>,
}

impl Sampler {
    pub fn new(cfg: SamplerConfig) -> Result<Sampler, SamplerError> {
        cfg.validate()?;
        let rng = Rng::new(cfg.seed);
        Ok(Sampler {
            cfg,
            rng,
            cands: Vec::new(),
        })
    }

    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    /// Picks the next token from `logits` (one per vocabulary entry) given the tokens so
    /// far (`history`, prompt included, oldest first). `logits` is modified in place by
    /// bias and penalties.
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> Result<u32, SamplerError> {
        let vocab = logits.len();
        for &(id, b) in &self.cfg.logit_bias {
            let slot = logits
                .get_mut(id as usize)
                .ok_or(SamplerError::BiasTokenOutOfRange { id, vocab })?;
            *slot += b;
        }
        apply_penalties(&self.cfg, logits, history);
        if self.cfg.temperature <= 0.0 {
            return greedy(logits);
        }
        self.cands.clear();
        self.cands.extend(
            logits
                .iter()
                .enumerate()
                .filter(|(_, l)| !l.is_nan() && **l > f32::NEG_INFINITY)
                .map(|(i, &l)| Candidate {
                    id: i as u32,
                    logit: l,
                }),
        );
        if self.cands.is_empty() {
            return Err(SamplerError::NoCandidates);
        }
        // Sorted best first (ties by id for determinism); every later stage keeps a prefix.
        let by_logit =
            |a: &Candidate, b: &Candidate| b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id));
        let k = self.cfg.top_k;
        if k > 0 && (k as usize) < self.cands.len() {
            self.cands.select_nth_unstable_by(k as usize - 1, by_logit);
            self.cands.truncate(k as usize);
        }
        self.cands.sort_unstable_by(by_logit);
        if self.cfg.top_p < 1.0 {
            let probs = softmax(&self.cands, 1.0);
            let mut cum = 0.0f64;
            let mut keep = probs.len();
            for (i, p) in probs.iter().enumerate() {
                cum += p;
                if cum >= self.cfg.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
            self.cands.truncate(keep.max(1));
        }
        if self.cfg.min_p > 0.0 {
            // p_i ≥ min_p · p_max  ⇔  logit_i ≥ logit_max + ln(min_p)
            let floor = self.cands[0].logit + self.cfg.min_p.ln();
            let keep = self.cands.iter().take_while(|c| c.logit >= floor).count();
            self.cands.truncate(keep.max(1));
        }
        let probs = softmax(&self.cands, self.cfg.temperature);
        let r = self.rng.next_f64();
        let mut cum = 0.0;
        for (c, p) in self.cands.iter().zip(&probs) {
            cum += p;
            if r < cum {
                return Ok(c.id);
            }
        }
        Ok(self.cands[self.cands.len() - 1].id)
    }
}

/// llama.cpp's penalty semantics: for each distinct token in the window with count c, the
/// repeat penalty divides a positive logit or multiplies a negative one, then
/// `c · frequency + presence` is subtracted.
fn apply_penalties(cfg: &SamplerConfig, logits: &mut [f32], history: &[u32]) {
    let n = cfg.repeat_last_n.min(history.len());
    if n == 0
        || (cfg.repeat_penalty == 1.0
            && cfg.frequency_penalty == 0.0
            && cfg.presence_penalty == 0.0)
    {
        return;
    }
    let mut counts: HashMap<u32, u32> = HashMap::new();
    for &t in &history[history.len() - n..] {
        *counts.entry(t).or_default() += 1;
    }
    for (&t, &c) in &counts {
        let Some(l) = logits.get_mut(t as usize) else {
            continue;
        };
        if *l > 0.0 {
            *l /= cfg.repeat_penalty;
        } else {
            *l *= cfg.repeat_penalty;
        }
        *l -= c as f32 * cfg.frequency_penalty + cfg.presence_penalty;
    }
}

/// Index of the largest logit; the lowest id wins a tie.
pub fn greedy(logits: &[f32]) -> Result<u32, SamplerError> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &l) in logits.iter().enumerate() {
        if l.is_nan() {
            continue;
        }
        if best.is_none_or(|(_, b)| l > b) {
            best = Some((i, l));
        }
    }
    match best {
        Some((i, l)) if l > f32::NEG_INFINITY => Ok(i as u32),
        _ => Err(SamplerError::NoCandidates),
    }
}

fn softmax(c: &[Candidate], temperature: f32) -> Vec<f64> {
    let max = c.iter().map(|c| c.logit).fold(f32::NEG_INFINITY, f32::max) as f64;
    let t = temperature as f64;
    let mut v: Vec<f64> = c
        .iter()
        .map(|c| ((c.logit as f64 - max) / t).exp())
        .collect();
    let s: f64 = v.iter().sum();
    v.iter_mut().for_each(|p| *p /= s);
    v
}

/// Log-softmax probabilities of the full vocabulary (what llama.cpp's `n_probs` reports
/// with `post_sampling_probs: false`), as natural logs.
pub fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = logits
        .iter()
        .map(|&l| (l as f64 - max).exp())
        .sum::<f64>()
        .ln()
        + max;
    logits.iter().map(|&l| l as f64 - lse).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> SamplerConfig {
        SamplerConfig {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            ..SamplerConfig::default()
        }
    }

    #[test]
    fn greedy_picks_argmax_and_lowest_id_on_tie() {
        let mut s = Sampler::new(SamplerConfig {
            temperature: 0.0,
            ..cfg()
        })
        .unwrap();
        assert_eq!(s.sample(&mut [1.0, 3.0, 3.0, -1.0], &[]).unwrap(), 1);
    }

    #[test]
    fn penalties_follow_llama_cpp_semantics() {
        // Token 0 seen twice (positive logit divided), token 1 once (negative multiplied).
        let c = SamplerConfig {
            repeat_penalty: 2.0,
            frequency_penalty: 0.5,
            presence_penalty: 0.25,
            ..cfg()
        };
        let mut l = [4.0f32, -1.0, 7.0];
        apply_penalties(&c, &mut l, &[0, 1, 0]);
        assert_eq!(l, [4.0 / 2.0 - 2.0 * 0.5 - 0.25, -2.0 - 0.5 - 0.25, 7.0]);
    }

    #[test]
    fn penalty_window_is_the_last_n_tokens() {
        let c = SamplerConfig {
            repeat_last_n: 1,
            repeat_penalty: 2.0,
            ..cfg()
        };
        let mut l = [4.0f32, 4.0];
        apply_penalties(&c, &mut l, &[0, 1]);
        assert_eq!(l, [4.0, 2.0]);
    }

    #[test]
    fn top_k_one_is_greedy_whatever_the_seed() {
        for seed in 0..20 {
            let mut s = Sampler::new(SamplerConfig {
                top_k: 1,
                seed,
                ..cfg()
            })
            .unwrap();
            assert_eq!(s.sample(&mut [0.0, 0.1, 5.0, 4.9], &[]).unwrap(), 2);
        }
    }

    #[test]
    fn top_p_keeps_the_smallest_set_reaching_p() {
        // probs ∝ e^l: 0.665, 0.245, 0.090 → top_p 0.7 keeps two, 0.6 keeps one.
        let l = [2.0f32, 1.0, 0.0];
        let mut seen = [false; 3];
        let mut s = Sampler::new(SamplerConfig {
            top_p: 0.7,
            ..cfg()
        })
        .unwrap();
        for _ in 0..500 {
            seen[s.sample(&mut l.clone(), &[]).unwrap() as usize] = true;
        }
        assert_eq!(seen, [true, true, false]);
        let mut s = Sampler::new(SamplerConfig {
            top_p: 0.6,
            ..cfg()
        })
        .unwrap();
        for _ in 0..100 {
            assert_eq!(s.sample(&mut l.clone(), &[]).unwrap(), 0);
        }
    }

    #[test]
    fn min_p_drops_tokens_below_fraction_of_max() {
        // p1/p0 = e^-1 ≈ 0.37, p2/p0 = e^-3 ≈ 0.05: min_p 0.1 keeps {0, 1}.
        let l = [3.0f32, 2.0, 0.0];
        let mut seen = [false; 3];
        let mut s = Sampler::new(SamplerConfig {
            min_p: 0.1,
            ..cfg()
        })
        .unwrap();
        for _ in 0..500 {
            seen[s.sample(&mut l.clone(), &[]).unwrap() as usize] = true;
        }
        assert_eq!(seen, [true, true, false]);
    }

    #[test]
    fn draws_follow_the_distribution() {
        // Control: with probs 0.665/0.245/0.090, 20k draws land within 1.5% of each.
        let l = [2.0f32, 1.0, 0.0];
        let mut s = Sampler::new(cfg()).unwrap();
        let mut n = [0usize; 3];
        for _ in 0..20_000 {
            n[s.sample(&mut l.clone(), &[]).unwrap() as usize] += 1;
        }
        let want = softmax(
            &l.iter()
                .enumerate()
                .map(|(i, &logit)| Candidate {
                    id: i as u32,
                    logit,
                })
                .collect::<Vec<_>>(),
            1.0,
        );
        for i in 0..3 {
            assert!((n[i] as f64 / 20_000.0 - want[i]).abs() < 0.015, "{n:?}");
        }
    }

    #[test]
    fn same_seed_same_tokens() {
        let run = |seed| {
            let mut s = Sampler::new(SamplerConfig { seed, ..cfg() }).unwrap();
            (0..50)
                .map(|_| s.sample(&mut [0.5, 0.4, 0.3, 0.2], &[]).unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }

    #[test]
    fn logit_bias_bans_and_out_of_range_is_refused() {
        let mut s = Sampler::new(SamplerConfig {
            temperature: 0.0,
            logit_bias: vec![(2, f32::NEG_INFINITY)],
            ..cfg()
        })
        .unwrap();
        assert_eq!(s.sample(&mut [0.0, 1.0, 9.0], &[]).unwrap(), 1);
        let mut s = Sampler::new(SamplerConfig {
            logit_bias: vec![(5, 1.0)],
            ..cfg()
        })
        .unwrap();
        assert_eq!(
            s.sample(&mut [0.0; 3], &[]),
            Err(SamplerError::BiasTokenOutOfRange { id: 5, vocab: 3 })
        );
    }

    #[test]
    fn bad_settings_are_refused_by_name() {
        let e = Sampler::new(SamplerConfig {
            top_p: 1.5,
            ..cfg()
        })
        .unwrap_err();
        assert!(e.to_string().contains("top_p"));
        assert!(Sampler::new(SamplerConfig {
            repeat_penalty: 0.0,
            ..cfg()
        })
        .is_err());
    }
}
