//! The sampling flags beyond the first chain (DRY, XTC, typical-p, top-n-σ, mirostat and
//! the stage order), llama.cpp's names and defaults; flattened into `SamplingArgs`, so
//! `run` and `chat` take them.

use super::args::{finite, non_negative, positive, unit_interval};
use anyhow::{bail, Context};
use clap::Args as ClapArgs;
use minfer_generate::sampler::{order, Mirostat, SamplerConfig};

#[derive(ClapArgs, Debug, Clone)]
pub struct SamplingExtraArgs {
    /// DRY repetition penalty multiplier (0 disables).
    #[arg(long = "dry-multiplier", default_value_t = 0.0, value_parser = non_negative)]
    pub dry_multiplier: f32,
    /// DRY penalty base: multiplier · base^(repeat length − allowed length).
    #[arg(long = "dry-base", default_value_t = 1.75, value_parser = finite)]
    pub dry_base: f32,
    /// DRY: repeats longer than this many tokens are penalised.
    #[arg(long = "dry-allowed-length", default_value_t = 2)]
    pub dry_allowed_length: usize,
    /// DRY: tokens scanned for repeats (0 disables, -1 the whole context).
    #[arg(
        long = "dry-penalty-last-n",
        default_value_t = 64,
        allow_negative_numbers = true,
        value_parser = last_n
    )]
    pub dry_penalty_last_n: i32,
    /// DRY sequence breaker (repeatable; the first one replaces the defaults '\n', ':',
    /// '"', '*'; "none" leaves no breaker). Escapes \n \t \\ are read.
    #[arg(long = "dry-sequence-breaker")]
    pub dry_sequence_breaker: Vec<String>,
    /// XTC: chance per token of excluding the top choices (0 disables).
    #[arg(long = "xtc-probability", default_value_t = 0.0, value_parser = unit_interval)]
    pub xtc_probability: f32,
    /// XTC: tokens at least this likely are top choices (above 0.5 disables).
    #[arg(long = "xtc-threshold", default_value_t = 0.1, value_parser = unit_interval)]
    pub xtc_threshold: f32,
    /// Locally typical sampling, parameter p (1.0 disables).
    #[arg(
        long = "typical",
        visible_alias = "typical-p",
        default_value_t = 1.0,
        value_parser = unit_interval
    )]
    pub typical_p: f32,
    /// Top-n-sigma: keep logits within n standard deviations of the best (-1 disables).
    #[arg(
        long = "top-nsigma",
        visible_alias = "top-n-sigma",
        default_value_t = -1.0,
        allow_negative_numbers = true,
        value_parser = finite
    )]
    pub top_n_sigma: f32,
    /// Mirostat: 0 off, 1 Mirostat, 2 Mirostat 2.0 (replaces top-k, top-p, typical, ...).
    #[arg(long = "mirostat", default_value_t = 0, value_parser = mirostat_value)]
    pub mirostat: i64,
    /// Mirostat learning rate, eta (above 0).
    #[arg(long = "mirostat-lr", default_value_t = 0.1, value_parser = positive)]
    pub mirostat_lr: f32,
    /// Mirostat target entropy, tau (above 0).
    #[arg(long = "mirostat-ent", default_value_t = 5.0, value_parser = positive)]
    pub mirostat_ent: f32,
    /// Stage order, names separated by ';' (default:
    /// penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature).
    #[arg(long = "samplers")]
    pub samplers: Option<String>,
    /// Stage order as letters, e.g. edskypmxt (e penalties, d dry, s top-n-sigma, k top-k,
    /// y typical, p top-p, m min-p, x xtc, t temperature).
    #[arg(long = "sampling-seq", visible_alias = "sampler-seq")]
    pub sampling_seq: Option<String>,
}

/// `--dry-penalty-last-n`: 0 or more, or -1 (the whole context).
fn last_n(s: &str) -> Result<i32, String> {
    let n: i32 = s
        .trim()
        .parse()
        .map_err(|_| "expected a whole number".to_string())?;
    if n < -1 {
        return Err("out of range: 0 disables, -1 is the whole context".into());
    }
    Ok(n)
}

/// `--mirostat`: 0, 1 or 2.
fn mirostat_value(s: &str) -> Result<i64, String> {
    match s.trim().parse::<i64>() {
        Ok(n @ 0..=2) => Ok(n),
        _ => Err("expected 0 (off), 1 (Mirostat) or 2 (Mirostat 2.0)".into()),
    }
}

impl SamplingExtraArgs {
    /// Writes these settings into `cfg` (validated later with the rest).
    pub fn apply(&self, cfg: &mut SamplerConfig) -> anyhow::Result<()> {
        cfg.dry_multiplier = self.dry_multiplier;
        cfg.dry_base = self.dry_base;
        cfg.dry_allowed_length = self.dry_allowed_length;
        cfg.dry_penalty_last_n = self.dry_penalty_last_n;
        if !self.dry_sequence_breaker.is_empty() {
            cfg.dry_sequence_breakers = self
                .dry_sequence_breaker
                .iter()
                .filter(|b| b.as_str() != "none")
                .map(|b| unescape(b))
                .collect();
            if self.dry_sequence_breaker.iter().any(|b| b == "none") {
                cfg.dry_sequence_breakers.clear();
            }
        }
        cfg.xtc_probability = self.xtc_probability;
        cfg.xtc_threshold = self.xtc_threshold;
        cfg.typical_p = self.typical_p;
        cfg.top_n_sigma = self.top_n_sigma;
        cfg.mirostat = Mirostat::from_number(self.mirostat)
            .with_context(|| format!("--mirostat {}: expected 0 (off), 1 or 2", self.mirostat))?;
        cfg.mirostat_eta = self.mirostat_lr;
        cfg.mirostat_tau = self.mirostat_ent;
        match (&self.samplers, &self.sampling_seq) {
            (Some(_), Some(_)) => {
                bail!("--samplers and --sampling-seq both set the stage order; give one")
            }
            (Some(names), None) => {
                cfg.samplers =
                    order::parse_names(names).with_context(|| format!("--samplers {names:?}"))?
            }
            (None, Some(letters)) => {
                cfg.samplers = order::parse_letters(letters)
                    .with_context(|| format!("--sampling-seq {letters:?}"))?
            }
            (None, None) => {}
        }
        Ok(())
    }
}

/// The escapes llama.cpp reads in breaker strings.
fn unescape(s: &str) -> String {
    let mut out = String::new();
    let mut it = s.chars();
    while let Some(c) = it.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match it.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('r') => out.push('\r'),
            Some('\\') => out.push('\\'),
            Some('"') => out.push('"'),
            Some('\'') => out.push('\''),
            Some(o) => {
                out.push('\\');
                out.push(o);
            }
            None => out.push('\\'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        x: SamplingExtraArgs,
    }

    fn cfg(args: &[&str]) -> anyhow::Result<SamplerConfig> {
        let t = T::try_parse_from(std::iter::once("t").chain(args.iter().copied()))?;
        let mut c = SamplerConfig::default();
        t.x.apply(&mut c)?;
        Ok(c)
    }

    #[test]
    fn defaults_leave_the_default_config() {
        assert_eq!(cfg(&[]).unwrap(), SamplerConfig::default());
    }

    #[test]
    fn flags_reach_the_config_with_llama_cpp_spellings() {
        let c = cfg(&[
            "--dry-multiplier",
            "0.8",
            "--dry-sequence-breaker",
            "\\n",
            "--dry-sequence-breaker",
            "##",
            "--xtc-probability",
            "0.5",
            "--typical",
            "0.9",
            "--top-nsigma",
            "1.5",
            "--mirostat",
            "2",
            "--mirostat-lr",
            "0.2",
            "--mirostat-ent",
            "3",
            "--sampling-seq",
            "dkypmxt",
        ])
        .unwrap();
        assert_eq!(c.dry_multiplier, 0.8);
        assert_eq!(c.dry_sequence_breakers, vec!["\n".to_string(), "##".into()]);
        assert_eq!(c.xtc_probability, 0.5);
        assert_eq!(c.typical_p, 0.9);
        assert_eq!(c.top_n_sigma, 1.5);
        assert_eq!(c.mirostat, Mirostat::V2);
        assert_eq!((c.mirostat_eta, c.mirostat_tau), (0.2, 3.0));
        assert_eq!(c.samplers.len(), 7);
        let c = cfg(&["--dry-sequence-breaker", "none"]).unwrap();
        assert!(c.dry_sequence_breakers.is_empty());
    }

    #[test]
    fn bad_values_are_refused_by_flag() {
        let e = cfg(&["--mirostat", "3"]).unwrap_err().to_string();
        assert!(e.contains("--mirostat"), "{e}");
        let e = format!("{:#}", cfg(&["--samplers", "top_k;bogus"]).unwrap_err());
        assert!(e.contains("bogus"), "{e}");
        let e = cfg(&["--samplers", "top_k", "--sampling-seq", "k"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("--sampling-seq"), "{e}");
    }
}
