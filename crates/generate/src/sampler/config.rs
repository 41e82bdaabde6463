//! Sampling settings, their llama.cpp defaults and validation.

use super::order::{Stage, DEFAULT_ORDER};

/// Which mirostat, if any, replaces the chain (llama.cpp's `--mirostat N`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Mirostat {
    #[default]
    Off,
    /// Mirostat (Basu et al. 2021, algorithm 1): Zipf-estimated top-k.
    V1,
    /// Mirostat 2.0: truncation at surprise μ.
    V2,
}

impl Mirostat {
    /// llama.cpp's number: 0, 1 or 2.
    pub fn from_number(n: i64) -> Option<Mirostat> {
        match n {
            0 => Some(Mirostat::Off),
            1 => Some(Mirostat::V1),
            2 => Some(Mirostat::V2),
            _ => None,
        }
    }
}

/// Sampling settings. `Default` is llama.cpp's `common_params_sampling` default, and every
/// stage added after the first chain (DRY, XTC, typical-p, top-n-σ, mirostat) defaults to
/// a no-op.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerConfig {
    /// ≤ 0 means greedy (argmax after bias, penalties and DRY).
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
    /// DRY: 0 disables.
    pub dry_multiplier: f32,
    /// DRY: below 1 disables.
    pub dry_base: f32,
    /// DRY: repeats longer than this are penalised.
    pub dry_allowed_length: usize,
    /// DRY: tokens scanned for repeats; 0 disables, −1 the whole context.
    pub dry_penalty_last_n: i32,
    pub dry_sequence_breakers: Vec<String>,
    /// XTC: chance per token that the top choices are excluded; 0 disables.
    pub xtc_probability: f32,
    /// XTC: tokens at least this likely count as top choices; above 0.5 disables.
    pub xtc_threshold: f32,
    /// Locally typical sampling; ≥ 1 disables.
    pub typical_p: f32,
    /// Top-n-σ: keep logits within n standard deviations of the best; ≤ 0 disables.
    pub top_n_sigma: f32,
    pub mirostat: Mirostat,
    /// Mirostat's target surprise τ (bits).
    pub mirostat_tau: f32,
    /// Mirostat's learning rate η.
    pub mirostat_eta: f32,
    /// The order of the stages between logit bias and the draw (llama.cpp's `--samplers`).
    pub samplers: Vec<Stage>,
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
            dry_multiplier: 0.0,
            dry_base: 1.75,
            dry_allowed_length: 2,
            dry_penalty_last_n: 64,
            dry_sequence_breakers: default_dry_breakers(),
            xtc_probability: 0.0,
            xtc_threshold: 0.1,
            typical_p: 1.0,
            top_n_sigma: -1.0,
            mirostat: Mirostat::Off,
            mirostat_tau: 5.0,
            mirostat_eta: 0.1,
            samplers: DEFAULT_ORDER.to_vec(),
        }
    }
}

/// llama.cpp's default DRY sequence breakers.
pub fn default_dry_breakers() -> Vec<String> {
    ["\n", ":", "\"", "*"].map(String::from).to_vec()
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
    /// The model's logits hold NaN: the forward is numerically broken, so no token is drawn
    /// (one drawn from the rest would look plausible and be garbage).
    #[error("the model's logits hold NaN ({nan} of {vocab}) at reply token {token}: no token was sampled")]
    NanLogits {
        nan: usize,
        vocab: usize,
        /// The index of the reply token the logits were for (0: the first).
        token: usize,
    },
    /// The grammar allows no token here (a grammar that cannot continue).
    #[error("the grammar allows no token at this point: {0}")]
    Constraint(String),
}

impl SamplerConfig {
    /// Refuses settings llama.cpp would misbehave on, naming the setting.
    pub fn validate(&self) -> Result<(), SamplerError> {
        let bad = |name, value: f32, why| SamplerError::BadSetting {
            name,
            value: value.to_string(),
            why,
        };
        let unit = |name, v: f32| {
            if (0.0..=1.0).contains(&v) {
                Ok(())
            } else {
                Err(bad(name, v, "0 to 1"))
            }
        };
        let finite = |name, v: f32| {
            if v.is_finite() {
                Ok(())
            } else {
                Err(bad(name, v, "must be finite"))
            }
        };
        finite("temperature", self.temperature)?;
        unit("top_p", self.top_p)?;
        unit("min_p", self.min_p)?;
        if !(self.repeat_penalty > 0.0 && self.repeat_penalty.is_finite()) {
            return Err(bad("repeat_penalty", self.repeat_penalty, "must be > 0"));
        }
        finite("frequency_penalty", self.frequency_penalty)?;
        finite("presence_penalty", self.presence_penalty)?;
        finite("dry_multiplier", self.dry_multiplier)?;
        if self.dry_multiplier < 0.0 {
            return Err(bad("dry_multiplier", self.dry_multiplier, "must be ≥ 0"));
        }
        finite("dry_base", self.dry_base)?;
        if self.dry_penalty_last_n < -1 {
            return Err(SamplerError::BadSetting {
                name: "dry_penalty_last_n",
                value: self.dry_penalty_last_n.to_string(),
                why: "-1 (the whole context), 0 (off) or a token count",
            });
        }
        unit("xtc_probability", self.xtc_probability)?;
        unit("xtc_threshold", self.xtc_threshold)?;
        unit("typical_p", self.typical_p)?;
        finite("top_n_sigma", self.top_n_sigma)?;
        finite("mirostat_tau", self.mirostat_tau)?;
        finite("mirostat_eta", self.mirostat_eta)?;
        Ok(())
    }

    /// DRY changes logits with these settings.
    pub(crate) fn dry_enabled(&self) -> bool {
        self.dry_multiplier != 0.0 && self.dry_base >= 1.0 && self.dry_penalty_last_n != 0
    }
}
