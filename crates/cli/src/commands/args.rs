//! Argument groups and helpers that several subcommands share: the model, context and
//! backend flags (`run`, `chat`), the sampling flags, and the default model name (`bench`
//! too). Subcommands depend on this module, not on each other.

use anyhow::{bail, Context};
use clap::Args as ClapArgs;
use minfer_engine::sampler::SamplerConfig;
use minfer_engine::{backends, fetch, parse_cache_type, Engine, EngineConfig};
use std::time::Instant;

/// The model a run uses when `-m` is not given (fetched on first use).
pub const DEFAULT_MODEL: &str = fetch::DEFAULT_MODEL;

/// Model, context and backend flags shared by run-like commands.
#[derive(ClapArgs, Debug, Clone)]
pub struct ModelArgs {
    /// A GGUF path (any part of a split model) or a known model name (`minfer pull --list`).
    #[arg(short = 'm', long = "model", default_value = DEFAULT_MODEL)]
    pub model: String,
    /// Context length in tokens (clamped to the model's).
    #[arg(short = 'c', long = "n-ctx", default_value_t = 4096)]
    pub n_ctx: usize,
    /// CPU threads (default: the number of physical cores).
    #[arg(short = 't', long = "threads")]
    pub threads: Option<usize>,
    /// KV cache element type: f32, f16, q8_0, or auto (f32 on the CPU; on a GPU f16 from
    /// n_layers x n_kv_embd >= 8192, else f32).
    #[arg(long = "cache-type", default_value = "auto")]
    pub cache_type: String,
    /// Limit the backends that take part (repeatable or comma-separated: cpu, metal, cuda;
    /// metal-emu runs the Metal executor on the MSL emulator: slow, for proof and debugging).
    #[arg(long = "backend", value_delimiter = ',')]
    pub backends: Vec<String>,
    /// CPU float arithmetic: native (fastest, the same bits on every CPU), or llamacpp-x86-avx2 /
    /// llamacpp-x86-avx512 (llama.cpp's x86 build bit for bit; needs --cache-type f16).
    #[arg(long = "numerics", default_value = "native")]
    pub numerics: String,
}

/// Sampling flags, llama.cpp's names and defaults.
#[derive(ClapArgs, Debug, Clone)]
pub struct SamplingArgs {
    /// Temperature; 0 is greedy.
    #[arg(long = "temp", default_value_t = 0.8)]
    pub temperature: f32,
    /// Top-k (0 disables).
    #[arg(long = "top-k", default_value_t = 40)]
    pub top_k: i32,
    /// Top-p (1.0 disables).
    #[arg(long = "top-p", default_value_t = 0.95)]
    pub top_p: f32,
    /// Min-p (0 disables).
    #[arg(long = "min-p", default_value_t = 0.05)]
    pub min_p: f32,
    /// Penalise repeats of the last N tokens (0 disables penalties).
    #[arg(long = "repeat-last-n", default_value_t = 64)]
    pub repeat_last_n: usize,
    /// Repeat penalty (1.0 disables).
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Frequency penalty (0 disables).
    #[arg(long = "frequency-penalty", default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// Presence penalty (0 disables).
    #[arg(long = "presence-penalty", default_value_t = 0.0)]
    pub presence_penalty: f32,
    /// Token logit bias, llama.cpp style: TOKEN_ID(+|-)BIAS, e.g. `15043+1` or `15043-inf`.
    #[arg(short = 'l', long = "logit-bias")]
    pub logit_bias: Vec<String>,
    /// RNG seed (default: random; printed with --json).
    #[arg(short = 's', long = "seed")]
    pub seed: Option<u64>,
    #[command(flatten)]
    pub extra: super::sampling_extra::SamplingExtraArgs,
}

impl SamplingArgs {
    pub fn to_config(&self) -> anyhow::Result<SamplerConfig> {
        let seed = self.seed.unwrap_or_else(|| {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            t.as_nanos() as u64 ^ (std::process::id() as u64) << 32
        });
        let logit_bias = self
            .logit_bias
            .iter()
            .map(|s| parse_logit_bias(s))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let mut cfg = SamplerConfig {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_last_n: self.repeat_last_n,
            repeat_penalty: self.repeat_penalty,
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
            logit_bias,
            seed,
            ..SamplerConfig::default()
        };
        self.extra.apply(&mut cfg)?;
        cfg.validate()?;
        Ok(cfg)
    }
}

/// `TOKEN_ID(+|-)BIAS` as llama.cpp's `--logit-bias` spells it.
fn parse_logit_bias(s: &str) -> anyhow::Result<(u32, f32)> {
    let bad = || anyhow::anyhow!("--logit-bias {s:?}: expected TOKEN_ID(+|-)BIAS, e.g. 15043+1");
    let at = s.find(['+', '-']).ok_or_else(bad)?;
    let id: u32 = s[..at].trim().parse().map_err(|_| bad())?;
    let bias: f32 = s[at..].trim().parse().map_err(|_| bad())?;
    if bias.is_nan() {
        return Err(bad());
    }
    Ok((id, bias))
}

impl ModelArgs {
    /// Validates flags that need no model (backend names, cache type), resolves the model
    /// (pulling a known one on first use) and loads it.
    pub fn load(&self) -> anyhow::Result<(Engine, f64)> {
        backends::resolve(&self.backends)?;
        let cache_type_auto = self.cache_type.trim().eq_ignore_ascii_case("auto");
        let cache_type = if cache_type_auto {
            minfer_gguf::GgmlType::F32
        } else {
            parse_cache_type(&self.cache_type)?
        };
        let numerics = minfer_cpu::Numerics::parse(&self.numerics).ok_or_else(|| {
            anyhow::anyhow!(
                "--numerics {}: expected one of {}",
                self.numerics,
                minfer_cpu::Numerics::NAMES.join(", ")
            )
        })?;
        if self.n_ctx == 0 {
            bail!("--n-ctx must be at least 1");
        }
        let path = fetch::resolve_model(&self.model)?;
        let t0 = Instant::now();
        let model_ctx = minfer_gguf::GgufModel::open(&path)
            .ok()
            .and_then(|m| minfer_models::HParams::from_metadata(m.metadata()).ok())
            .map(|h| h.context_length);
        let n_ctx = match model_ctx {
            Some(max) if self.n_ctx > max => {
                eprintln!(
                    "note: --n-ctx {} clamped to the model's context length {max}",
                    self.n_ctx
                );
                max
            }
            _ => self.n_ctx,
        };
        let cfg = EngineConfig {
            n_ctx,
            threads: self.threads.unwrap_or(0),
            cache_type,
            cache_type_auto,
            backends: self.backends.clone(),
            cpu: minfer_engine::backends::CpuSettings { numerics },
            ..EngineConfig::default()
        };
        let mut engine =
            Engine::load(&path, cfg).with_context(|| format!("cannot load {}", path.display()))?;
        // What kept the model off a device (a backend that holds none of its weights).
        for line in engine.placement_report() {
            eprintln!("note: {line}");
        }
        startup_line(&mut engine)?;
        Ok((engine, t0.elapsed().as_secs_f64() * 1e3))
    }
}

/// Where the model runs: decode-graph nodes per backend and the KV type, plus a warning for
/// the emulator (it is correct and slow).
fn startup_line(engine: &mut Engine) -> anyhow::Result<()> {
    let counts = engine.nodes_per_backend(1)?;
    if counts.len() < 2 {
        return Ok(());
    }
    let parts: Vec<String> = counts
        .iter()
        .map(|(name, n)| format!("{name} {n} nodes"))
        .collect();
    eprintln!(
        "runs on: {} (decode graph); KV cache {}",
        parts.join(", "),
        engine.cache_type().name()
    );
    if counts.iter().any(|(name, n)| name == "metal-emu" && *n > 0) {
        eprintln!(
            "note: metal-emu runs the Metal kernels on the MSL emulator (CPU): correct and \
             very slow, for proof and debugging"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_logit_bias;

    #[test]
    fn logit_bias_parses_llama_cpp_syntax() {
        assert_eq!(parse_logit_bias("15043+1").unwrap(), (15043, 1.0));
        assert_eq!(parse_logit_bias("7-0.5").unwrap(), (7, -0.5));
        assert_eq!(parse_logit_bias("7-inf").unwrap(), (7, f32::NEG_INFINITY));
        assert!(parse_logit_bias("abc").is_err());
        assert!(parse_logit_bias("7").is_err());
    }
}
