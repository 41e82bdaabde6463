//! The sampler chain, in llama.cpp's order and with its defaults: logit bias → the
//! configurable stages (default: penalties → DRY → top-n-σ → top-k → typical-p → top-p →
//! min-p → XTC → temperature; llama.cpp's `--samplers`) → seeded draw. With mirostat on,
//! the chain is logit bias → temperature → mirostat, as in llama.cpp.
//!
//! At temperature ≤ 0 the chain is greedy: the pick is the best token left where the first
//! temperature stage stands (llama.cpp's temperature ≤ 0 keeps only that token, so later
//! stages cannot change it), or at the end without one. Top-k, top-p, min-p and top-n-σ
//! keep the best token, so the candidate list is built only when a typical-p (which may
//! drop it) or a penalty or DRY after a truncation could change the pick; otherwise the
//! pick is the argmax of the penalised logits. XTC does not run for a greedy pick (it would
//! make it random; llama.cpp runs it). Stages that read
//! probabilities see the temperature in force at their place in the order
//! (`stages::softmax`); in the default order top-p and min-p see the untempered
//! distribution, as in llama.cpp. The RNG is our own (SplitMix64 → xoshiro256**): the same
//! seed gives the same tokens on every machine, but not llama.cpp's tokens (it uses
//! std::mt19937), so sampled output is only comparable to llama.cpp at temperature 0.
//! XTC and mirostat draw from the same stream, so they leave it untouched while off.
//!
//! Files: `config` (settings, defaults, validation), `order` (stage names and letters),
//! `stages` (truncation stages), `dry` (DRY and its sequence breakers).

mod config;
mod dry;
pub mod order;
mod stages;

pub use config::{default_dry_breakers, Mirostat, SamplerConfig, SamplerError};
pub use order::{Stage, DEFAULT_ORDER};

use dry::{Breakers, Dry};
use stages::{by_logit, softmax};
use std::collections::HashMap;

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
pub(crate) struct Candidate {
    pub(crate) id: u32,
    pub(crate) logit: f32,
}

/// Where the chain's working set is: still the full logits, or a candidate list.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Set {
    Logits,
    Unsorted,
    Sorted,
}

/// A configured chain with its RNG state, mirostat's μ, DRY's breaker table (built from
/// the vocabulary on first use) and a candidate buffer reused across steps.
#[derive(Clone, Debug)]
pub struct Sampler {
    cfg: SamplerConfig,
    rng: Rng,
    cands: Vec<Candidate>,
    breakers: Option<Breakers>,
    /// Mirostat's running surprise bound μ (starts at 2τ).
    mu: f32,
}

/// Token id → its bytes, for DRY's sequence breakers.
pub type Bytes<'a> = &'a dyn Fn(u32) -> Vec<u8>;

impl Sampler {
    pub fn new(cfg: SamplerConfig) -> Result<Sampler, SamplerError> {
        cfg.validate()?;
        let rng = Rng::new(cfg.seed);
        let mu = 2.0 * cfg.mirostat_tau;
        Ok(Sampler {
            cfg,
            rng,
            cands: Vec::new(),
            breakers: None,
            mu,
        })
    }

    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    /// Picks the next token from `logits` (one per vocabulary entry) given the tokens so
    /// far (`history`, prompt included, oldest first). `logits` is modified in place by
    /// bias and the stages that run on the full vocabulary. `bytes` spells tokens for
    /// DRY's sequence breakers.
    pub fn sample(
        &mut self,
        logits: &mut [f32],
        history: &[u32],
        bytes: Bytes,
    ) -> Result<u32, SamplerError> {
        match self.distribution(logits, history, bytes)? {
            Pick::Token(id) => Ok(id),
            Pick::Draw(t) => {
                let probs = softmax(&self.cands, t);
                let i = self.draw(&probs);
                if self.cfg.mirostat != Mirostat::Off {
                    // Observed surprise in bits moves μ toward τ.
                    let surprise = -(probs[i].log2()) as f32;
                    self.mu -= self.cfg.mirostat_eta * (surprise - self.cfg.mirostat_tau);
                }
                Ok(self.cands[i].id)
            }
        }
    }

    /// Verifies the drafted token `draft`, proposed from `q`, against this row's final
    /// distribution: the chain runs exactly as [`Sampler::sample`] runs it (bias, stages,
    /// penalties over `history`), then speculative sampling's rule decides
    /// ([`crate::speculative`]). A greedy pick is the rule's one-hot case: the draft holds
    /// when it is the pick, and the pick replaces it otherwise (no draw is taken).
    /// Mirostat's running μ is not updated here: a request that speculates with mirostat is
    /// refused before it runs.
    pub fn verify(
        &mut self,
        logits: &mut [f32],
        history: &[u32],
        bytes: Bytes,
        draft: u32,
        q: &crate::speculative::Dist,
    ) -> Result<crate::speculative::Verdict, SamplerError> {
        use crate::speculative::{verify, Verdict};
        match self.distribution(logits, history, bytes)? {
            Pick::Token(t) if t == draft => Ok(Verdict::Accepted(t)),
            Pick::Token(t) => Ok(Verdict::Rejected(t)),
            Pick::Draw(t) => {
                let probs = softmax(&self.cands, t);
                let p: Vec<(u32, f64)> = self.cands.iter().map(|c| c.id).zip(probs).collect();
                Ok(verify(&p, q, draft, &mut self.rng))
            }
        }
    }

    /// Runs the chain up to the draw: either a token (greedy) or the candidates left in
    /// `self.cands`, best first, to be drawn at temperature `t`.
    fn distribution(
        &mut self,
        logits: &mut [f32],
        history: &[u32],
        bytes: Bytes,
    ) -> Result<Pick, SamplerError> {
        let vocab = logits.len();
        for &(id, b) in &self.cfg.logit_bias {
            let slot = logits
                .get_mut(id as usize)
                .ok_or(SamplerError::BiasTokenOutOfRange { id, vocab })?;
            *slot += b;
        }
        let greedy_pick = self.cfg.temperature <= 0.0;
        if self.cfg.mirostat != Mirostat::Off {
            if greedy_pick {
                return greedy(logits).map(Pick::Token);
            }
            self.fill(logits)?;
            self.cands.sort_unstable_by(by_logit);
            let t = self.cfg.temperature;
            if self.cfg.mirostat == Mirostat::V1 {
                self.mirostat_v1_truncate(t, vocab);
            } else {
                self.mirostat_v2_truncate(t);
            }
            return Ok(Pick::Draw(t));
        }
        let order = std::mem::take(&mut self.cfg.samplers);
        let r = self.run_stages(&order, logits, history, bytes, greedy_pick);
        self.cfg.samplers = order;
        r
    }

    fn run_stages(
        &mut self,
        order: &[Stage],
        logits: &mut [f32],
        history: &[u32],
        bytes: Bytes,
        greedy_pick: bool,
    ) -> Result<Pick, SamplerError> {
        let cfg = self.cfg.clone();
        let mut set = Set::Logits;
        let mut t = 1.0f32;
        let list = greedy_pick && greedy_needs_list(&cfg, order, history);
        for &stage in order {
            match stage {
                Stage::Penalties => {
                    let counts = penalty_counts(&cfg, history);
                    // After a temperature the penalty acts on tempered logits (llama.cpp's
                    // temperature divides them): subtracted here, before the division, it
                    // is scaled by the temperature in force (1 for a greedy pick, which
                    // stops at the first temperature stage).
                    let scale = t;
                    if set == Set::Logits {
                        for (&id, &n) in &counts {
                            if let Some(l) = logits.get_mut(id as usize) {
                                *l = penalize(&cfg, *l, n, scale);
                            }
                        }
                    } else if !counts.is_empty() {
                        for c in self.cands.iter_mut() {
                            if let Some(&n) = counts.get(&c.id) {
                                c.logit = penalize(&cfg, c.logit, n, scale);
                            }
                        }
                        set = Set::Unsorted;
                    }
                }
                Stage::Dry => {
                    if !cfg.dry_enabled() {
                        continue;
                    }
                    let n = if cfg.dry_penalty_last_n < 0 {
                        history.len()
                    } else {
                        (cfg.dry_penalty_last_n as usize).min(history.len())
                    };
                    let window = &history[history.len() - n..];
                    let breakers = self.breakers.get_or_insert_with(|| {
                        Breakers::build(&cfg.dry_sequence_breakers, vocab_len(logits), bytes)
                    });
                    let dry = Dry {
                        multiplier: cfg.dry_multiplier,
                        base: cfg.dry_base,
                        allowed_length: cfg.dry_allowed_length,
                    };
                    let pen = dry.penalties(window, breakers, bytes);
                    if pen.is_empty() {
                        continue;
                    }
                    // As the penalties: DRY subtracts from tempered logits.
                    let scale = t;
                    if set == Set::Logits {
                        for (&id, &p) in &pen {
                            if let Some(l) = logits.get_mut(id as usize) {
                                *l -= p * scale;
                            }
                        }
                    } else {
                        for c in self.cands.iter_mut() {
                            if let Some(&p) = pen.get(&c.id) {
                                c.logit -= p * scale;
                            }
                        }
                        set = Set::Unsorted;
                    }
                }
                // The pick is made where the first temperature stands.
                Stage::Temperature if greedy_pick => break,
                // Truncation that cannot change the pick, and XTC, do not run for it.
                Stage::Xtc if greedy_pick => {}
                _ if greedy_pick && !list => {}
                Stage::TopNSigma => {
                    if cfg.top_n_sigma > 0.0 {
                        self.ensure(logits, &mut set, false)?;
                        stages::top_n_sigma(&mut self.cands, cfg.top_n_sigma);
                    }
                }
                Stage::TopK => {
                    self.ensure(logits, &mut set, false)?;
                    stages::top_k(&mut self.cands, cfg.top_k);
                    set = Set::Sorted;
                }
                Stage::TypicalP => {
                    if cfg.typical_p < 1.0 {
                        self.ensure(logits, &mut set, true)?;
                        stages::typical(&mut self.cands, cfg.typical_p, t);
                        set = Set::Unsorted;
                    }
                }
                Stage::TopP => {
                    if cfg.top_p < 1.0 {
                        self.ensure(logits, &mut set, true)?;
                        stages::top_p(&mut self.cands, cfg.top_p, t);
                    }
                }
                Stage::MinP => {
                    if cfg.min_p > 0.0 {
                        self.ensure(logits, &mut set, true)?;
                        stages::min_p(&mut self.cands, cfg.min_p, t);
                    }
                }
                Stage::Xtc => {
                    if cfg.xtc_probability > 0.0 && cfg.xtc_threshold <= 0.5 {
                        self.ensure(logits, &mut set, true)?;
                        if self.cands.len() >= 2
                            && self.rng.next_f64() <= cfg.xtc_probability as f64
                        {
                            stages::xtc(&mut self.cands, cfg.xtc_threshold, t);
                        }
                    }
                }
                Stage::Temperature => t *= cfg.temperature,
            }
        }
        if greedy_pick {
            if set == Set::Logits {
                return greedy(logits).map(Pick::Token);
            }
            let best = self.cands.iter().min_by(|a, b| by_logit(a, b));
            return best
                .map(|c| Pick::Token(c.id))
                .ok_or(SamplerError::NoCandidates);
        }
        self.ensure(logits, &mut set, true)?;
        Ok(Pick::Draw(t))
    }

    /// Makes the working set a candidate list (from the logits, finite ones only), sorted
    /// when `sorted`.
    fn ensure(&mut self, logits: &[f32], set: &mut Set, sorted: bool) -> Result<(), SamplerError> {
        if *set == Set::Logits {
            self.fill(logits)?;
            *set = Set::Unsorted;
        }
        if sorted && *set == Set::Unsorted {
            self.cands.sort_unstable_by(by_logit);
            *set = Set::Sorted;
        }
        Ok(())
    }

    fn fill(&mut self, logits: &[f32]) -> Result<(), SamplerError> {
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
        Ok(())
    }

    /// Mirostat 1 (Basu et al. 2021, alg. 1): estimate the Zipf exponent ŝ from the top
    /// m = 100 probabilities, then keep the top k = (ε̂·2^μ / (1 − N^−ε̂))^(1/ŝ), ε̂ = ŝ − 1.
    fn mirostat_v1_truncate(&mut self, t: f32, n_vocab: usize) {
        const M: usize = 100;
        let probs = softmax(&self.cands, t);
        let (mut tb, mut tt) = (0.0f64, 0.0f64);
        for i in 0..(M - 1).min(probs.len().saturating_sub(1)) {
            let ti = ((i + 2) as f64 / (i + 1) as f64).ln();
            let bi = (probs[i] / probs[i + 1]).ln();
            tb += ti * bi;
            tt += ti * ti;
        }
        let s_hat = tb / tt;
        let eps = s_hat - 1.0;
        let k = ((eps * 2f64.powf(self.mu as f64)) / (1.0 - (n_vocab as f64).powf(-eps)))
            .powf(1.0 / s_hat);
        let k = if k.is_finite() {
            (k as usize).max(1)
        } else {
            1
        };
        self.cands.truncate(k.max(1));
    }

    /// Mirostat 2: keep the best tokens whose surprise −log2 p is at most μ (at least one).
    fn mirostat_v2_truncate(&mut self, t: f32) {
        let probs = softmax(&self.cands, t);
        let keep = probs
            .iter()
            .take_while(|&&p| -(p.log2()) as f32 <= self.mu)
            .count();
        self.cands.truncate(keep.max(1));
    }

    fn draw(&mut self, probs: &[f64]) -> usize {
        let r = self.rng.next_f64();
        let mut cum = 0.0;
        for (i, p) in probs.iter().enumerate() {
            cum += p;
            if r < cum {
                return i;
            }
        }
        probs.len() - 1
    }
}

enum Pick {
    Token(u32),
    /// Draw from `Sampler::cands` at this temperature.
    Draw(f32),
}

/// Whether a greedy pick needs the candidate list: before the first temperature stage, a
/// typical-p (it may drop the best token), or a penalty or DRY stage that changes logits
/// after a truncation (the best of what is left may not be the best of the vocabulary).
fn greedy_needs_list(cfg: &SamplerConfig, order: &[Stage], history: &[u32]) -> bool {
    let mut truncated = false;
    for &stage in order {
        match stage {
            Stage::Temperature => return false,
            Stage::TypicalP if cfg.typical_p < 1.0 => return true,
            Stage::TopK if cfg.top_k > 0 => truncated = true,
            Stage::TopP if cfg.top_p < 1.0 => truncated = true,
            Stage::MinP if cfg.min_p > 0.0 => truncated = true,
            Stage::TopNSigma if cfg.top_n_sigma > 0.0 => truncated = true,
            Stage::Penalties if truncated && !penalty_counts(cfg, history).is_empty() => {
                return true
            }
            Stage::Dry if truncated && cfg.dry_enabled() => return true,
            _ => {}
        }
    }
    false
}

fn vocab_len(logits: &[f32]) -> usize {
    logits.len()
}

/// Occurrences of each token in the penalty window (empty when the penalties are off).
fn penalty_counts(cfg: &SamplerConfig, history: &[u32]) -> HashMap<u32, u32> {
    let n = cfg.repeat_last_n.min(history.len());
    let mut counts: HashMap<u32, u32> = HashMap::new();
    if n == 0
        || (cfg.repeat_penalty == 1.0
            && cfg.frequency_penalty == 0.0
            && cfg.presence_penalty == 0.0)
    {
        return counts;
    }
    for &t in &history[history.len() - n..] {
        *counts.entry(t).or_default() += 1;
    }
    counts
}

/// llama.cpp's penalty semantics: for a token seen c times in the window, the repeat
/// penalty divides a positive logit or multiplies a negative one, then
/// `c · frequency + presence` is subtracted. `scale` is the temperature the chain has
/// applied so far (`l` is untempered; the subtraction acts on `l / scale`).
fn penalize(cfg: &SamplerConfig, l: f32, c: u32, scale: f32) -> f32 {
    let l = if l > 0.0 {
        l / cfg.repeat_penalty
    } else {
        l * cfg.repeat_penalty
    };
    l - (c as f32 * cfg.frequency_penalty + cfg.presence_penalty) * scale
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
mod chain_props;
#[cfg(test)]
mod tests;
