//! Argument groups and helpers that several subcommands share: the model, context and
//! backend flags (`run`, `chat`), the sampling flags, and the default model name (`bench`
//! too). Subcommands depend on this module, not on each other.

use anyhow::{bail, Context};
use clap::Args as ClapArgs;
use minfer_engine::{backends, parse_cache_type, Engine, EngineConfig};
use minfer_generate::sampler::SamplerConfig;
use std::time::Instant;

/// The model a run uses when `-m` is not given (fetched on first use).
pub const DEFAULT_MODEL: &str = minfer_hub::DEFAULT_MODEL;

/// Model, context and backend flags shared by run-like commands.
#[derive(ClapArgs, Debug, Clone)]
pub struct ModelArgs {
    /// A GGUF path (any part of a split model), a known model name (`minfer pull --list`),
    /// or hf:OWNER/REPO[:QUANT|:FILE.gguf], fetched into the models directory
    /// ($MINFER_MODELS, else ~/.cache/minfer/models) on first use.
    #[arg(short = 'm', long = "model", default_value = DEFAULT_MODEL)]
    pub model: String,
    /// Context length in tokens [default: 4096, or the model's if smaller]; 0: the model's
    /// (llama.cpp's -c 0). A larger value is clamped to the model's, with a note.
    #[arg(short = 'c', long = "n-ctx", visible_alias = "ctx-size")]
    pub n_ctx: Option<usize>,
    /// Size the context (the KV cells every sequence shares) by memory instead: as many
    /// tokens as SIZE of KV holds at the cache type, bytes or K/M/G/T (e.g. 8G), capped at the
    /// model's training context. `serve` with neither this nor -c sizes it from a CUDA
    /// device's free memory after the weights, less 1.5 GiB.
    #[arg(long = "kv-mem", value_name = "SIZE", conflicts_with = "n_ctx",
          value_parser = kv_mem_value)]
    pub kv_mem: Option<usize>,
    /// CPU threads (default: the number of physical cores).
    #[arg(short = 't', long = "threads")]
    pub threads: Option<usize>,
    /// KV cache element type: f32, f16, q8_0, or auto (f32 on the CPU; on a GPU f16 from
    /// n_layers x n_kv_embd >= 8192, else f32).
    #[arg(long = "cache-type", default_value = "auto", value_parser = cache_type_value)]
    pub cache_type: String,
    /// Limit the backends that take part (repeatable or comma-separated: cpu, metal, cuda;
    /// metal-emu runs the Metal executor on the MSL emulator: slow, for proof and debugging).
    #[arg(long = "backend", value_delimiter = ',', value_parser = backend_value)]
    pub backends: Vec<String>,
    /// CPU float arithmetic: native (fastest, the same bits on every CPU), or llamacpp-x86-avx2 /
    /// llamacpp-x86-avx512 (llama.cpp's x86 build bit for bit; needs --cache-type f16).
    #[arg(long = "numerics", default_value = "native", value_parser = numerics_value)]
    pub numerics: String,
    #[command(flatten)]
    pub offload: super::offload_args::OffloadArgs,
    /// Split the model over N GPUs (tensor parallelism, issue 36). Not available yet: any
    /// N above 1 is refused, naming what is missing.
    #[arg(long = "tensor-parallel", visible_alias = "tp")]
    pub tensor_parallel: Option<usize>,
    /// The CUDA devices of a tensor-parallel run (comma-separated ordinals).
    #[arg(long = "gpus", value_delimiter = ',')]
    pub gpus: Vec<usize>,
    /// llama.cpp's multi-GPU split: none (the default), layer or row. Only none exists yet.
    #[arg(long = "split-mode")]
    pub split_mode: Option<String>,
}

/// The multi-GPU flags' refusal (issue 36, ADR 0015): nothing past one device runs yet, and
/// nothing falls back silently to one. `cuda_devices` is the build's and machine's answer.
pub fn check_multi_gpu(
    tensor_parallel: Option<usize>,
    gpus: &[usize],
    split_mode: Option<&str>,
    cuda_devices: impl FnOnce() -> Result<usize, String>,
) -> anyhow::Result<()> {
    match split_mode.map(str::trim) {
        None | Some("none") => {}
        Some("layer") => bail!(
            "--split-mode layer (layers shared out over several GPUs) is not implemented; --gpu-layers N splits the layers between one GPU and the CPU"
        ),
        Some("row") => bail!(
            "--split-mode row is tensor parallelism: --tensor-parallel N, which is not available yet"
        ),
        Some(other) => bail!("--split-mode {other:?}: expected none, layer or row"),
    }
    let n = match (tensor_parallel, gpus.len()) {
        (Some(0), _) => bail!("--tensor-parallel 0: expected 1 or more GPUs"),
        (Some(n), g) if g > 0 && g != n => {
            bail!("--tensor-parallel {n} with --gpus naming {g} devices: give as many as N")
        }
        (Some(n), _) => n,
        (None, g) => g.max(1),
    };
    if n == 1 {
        if gpus.iter().all(|&g| g == 0) {
            // One device, the default one: what every run does already.
            return Ok(());
        }
        bail!(
            "--gpus {}: a one-GPU run uses CUDA device 0 (choosing another is not implemented)",
            gpus[0]
        );
    }
    let have = match cuda_devices() {
        Ok(k) => format!("this machine has {k}"),
        Err(why) => why,
    };
    bail!(
        "tensor parallelism needs {n} CUDA devices{}; {have}, and the sharded CUDA forward is not built yet (issue 36: the sharding plan and the NCCL communicator exist, no multi-GPU run has been made)",
        if gpus.is_empty() {
            String::new()
        } else {
            format!(
                " ({})",
                gpus.iter()
                    .map(|g| g.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            )
        }
    )
}

/// The context length when `-c` is not given (llama.cpp's default).
pub const DEFAULT_N_CTX: usize = 4096;

/// Sampling flags, llama.cpp's names, defaults and meanings of special values. Each value
/// parser checks its range, so a bad value is a clap error naming the flag (exit 2).
#[derive(ClapArgs, Debug, Clone)]
pub struct SamplingArgs {
    /// Temperature; 0 or below is greedy (llama.cpp: a negative temperature is greedy too).
    #[arg(long = "temp", default_value_t = 0.8, value_parser = finite)]
    pub temperature: f32,
    /// Top-k (0 or below disables).
    #[arg(long = "top-k", default_value_t = 40)]
    pub top_k: i32,
    /// Top-p, 0 to 1 (1.0 disables).
    #[arg(long = "top-p", default_value_t = 0.95, value_parser = unit_interval)]
    pub top_p: f32,
    /// Min-p, 0 to 1 (0 disables).
    #[arg(long = "min-p", default_value_t = 0.05, value_parser = unit_interval)]
    pub min_p: f32,
    /// Penalise repeats of the last N tokens (0 disables penalties, -1: the whole context).
    #[arg(long = "repeat-last-n", default_value_t = 64, value_parser = repeat_last_n_value)]
    pub repeat_last_n: i64,
    /// Repeat penalty, above 0 (1.0 disables).
    #[arg(long = "repeat-penalty", default_value_t = 1.0, value_parser = positive)]
    pub repeat_penalty: f32,
    /// Frequency penalty (0 disables).
    #[arg(long = "frequency-penalty", default_value_t = 0.0, value_parser = finite)]
    pub frequency_penalty: f32,
    /// Presence penalty (0 disables).
    #[arg(long = "presence-penalty", default_value_t = 0.0, value_parser = finite)]
    pub presence_penalty: f32,
    /// Token logit bias, llama.cpp style: TOKEN_ID(+|-)BIAS, e.g. `15043+1` or `15043-inf`.
    #[arg(short = 'l', long = "logit-bias", value_parser = logit_bias_value)]
    pub logit_bias: Vec<(u32, f32)>,
    /// RNG seed; -1 or absent: drawn at random and printed on stderr (and with --json).
    #[arg(short = 's', long = "seed", value_parser = seed_value)]
    pub seed: Option<Seed>,
    #[command(flatten)]
    pub extra: super::sampling_extra::SamplingExtraArgs,
}

/// `--seed`: a fixed seed, or llama.cpp's -1 (draw one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seed {
    Random,
    Fixed(u64),
}

fn seed_value(s: &str) -> Result<Seed, String> {
    if s.trim() == "-1" {
        return Ok(Seed::Random);
    }
    s.trim()
        .parse::<u64>()
        .map(Seed::Fixed)
        .map_err(|_| format!("expected -1 (random) or a seed from 0 to {}", u64::MAX))
}

fn float(s: &str) -> Result<f32, String> {
    s.trim()
        .parse::<f32>()
        .map_err(|_| "expected a number".to_string())
}

pub(crate) fn finite(s: &str) -> Result<f32, String> {
    let x = float(s)?;
    if !x.is_finite() {
        return Err("must be a finite number".into());
    }
    Ok(x)
}

pub(crate) fn unit_interval(s: &str) -> Result<f32, String> {
    let x = float(s)?;
    if !(0.0..=1.0).contains(&x) {
        return Err("out of range: must be from 0 to 1".into());
    }
    Ok(x)
}

/// A finite number of 0 or more.
pub(crate) fn non_negative(s: &str) -> Result<f32, String> {
    let x = finite(s)?;
    if x < 0.0 {
        return Err("out of range: must be 0 or more".into());
    }
    Ok(x)
}

pub(crate) fn positive(s: &str) -> Result<f32, String> {
    let x = finite(s)?;
    if x <= 0.0 {
        return Err("out of range: must be above 0".into());
    }
    Ok(x)
}

fn repeat_last_n_value(s: &str) -> Result<i64, String> {
    let n: i64 = s
        .trim()
        .parse()
        .map_err(|_| "expected a whole number".to_string())?;
    if n < -1 {
        return Err("out of range: 0 disables, -1 is the whole context".into());
    }
    Ok(n)
}

/// `-n/--n-predict` for `run` and `chat`: tokens at most; -1 (and llama.cpp's -2, "until the
/// context is full") mean no limit of their own.
pub fn n_predict_value(s: &str) -> Result<i64, String> {
    let n: i64 = s
        .trim()
        .parse()
        .map_err(|_| "expected a whole number".to_string())?;
    if n < -2 {
        return Err(
            "out of range: -1 generates until the end of generation or a full context".into(),
        );
    }
    Ok(n)
}

/// `-n` as a token limit.
pub fn max_tokens(n_predict: i64) -> usize {
    usize::try_from(n_predict).unwrap_or(usize::MAX)
}

fn cache_type_value(s: &str) -> Result<String, String> {
    if !s.trim().eq_ignore_ascii_case("auto") {
        parse_cache_type(s).map_err(|e| e.to_string())?;
    }
    Ok(s.to_string())
}

fn backend_value(s: &str) -> Result<String, String> {
    backends::resolve(&[s.to_string()]).map_err(|e| e.to_string())?;
    Ok(s.to_string())
}

fn numerics_value(s: &str) -> Result<String, String> {
    minfer_engine::backends::cpu::Numerics::parse(s).ok_or_else(|| {
        format!(
            "expected one of {}",
            minfer_engine::backends::cpu::Numerics::NAMES.join(", ")
        )
    })?;
    Ok(s.to_string())
}

fn logit_bias_value(s: &str) -> Result<(u32, f32), String> {
    parse_logit_bias(s).map_err(|e| e.to_string())
}

impl SamplingArgs {
    /// The sampler settings; a random seed is drawn here (see [`SamplingArgs::seed_note`]).
    pub fn to_config(&self) -> anyhow::Result<SamplerConfig> {
        let seed = match self.seed {
            Some(Seed::Fixed(s)) => s,
            None | Some(Seed::Random) => {
                let t = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default();
                t.as_nanos() as u64 ^ (std::process::id() as u64) << 32
            }
        };
        let mut cfg = SamplerConfig {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            // -1: the whole context; the penalty window is cut to the history it has.
            repeat_last_n: usize::try_from(self.repeat_last_n).unwrap_or(usize::MAX),
            repeat_penalty: self.repeat_penalty,
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
            logit_bias: self.logit_bias.clone(),
            seed,
            ..SamplerConfig::default()
        };
        self.extra.apply(&mut cfg)?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// The stderr line that makes a sampled run reproducible when its seed was drawn at
    /// random; None when the seed was given or sampling is greedy (the seed is unused).
    pub fn seed_note(&self, cfg: &SamplerConfig) -> Option<String> {
        if matches!(self.seed, Some(Seed::Fixed(_))) || cfg.temperature <= 0.0 {
            return None;
        }
        Some(format!(
            "seed:      {} (drawn at random; --seed {} repeats this run)",
            cfg.seed, cfg.seed
        ))
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

/// A model argument that names a directory is refused by that name (mapping one fails with
/// the OS's "No such device"); anything else is resolved as [`minfer_hub::resolve_model`] does.
pub fn model_path(model: &str) -> anyhow::Result<std::path::PathBuf> {
    let p = std::path::Path::new(model);
    if p.is_dir() {
        bail!("-m {model}: is a directory, not a GGUF file");
    }
    Ok(minfer_hub::resolve_model(model)?)
}

/// Refuses a directory where a file is read, by name.
pub fn not_a_directory(path: &std::path::Path, what: &str) -> anyhow::Result<()> {
    if path.is_dir() {
        bail!("{what} {}: is a directory, not a file", path.display());
    }
    Ok(())
}

/// Warns when more threads are asked for than the machine has (they would share cores and
/// run slower than fewer).
pub fn warn_threads(threads: Option<usize>) {
    let Some(t) = threads else { return };
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if t > cpus {
        eprintln!(
            "warning: -t {t} is more threads than the {cpus} CPUs available; they share cores (0 or no -t: one per physical core)"
        );
    }
}

fn kv_mem_value(s: &str) -> Result<usize, String> {
    match minfer_engine::parse_size(s)? {
        0 => Err("0 bytes of KV hold no token".into()),
        b => Ok(b),
    }
}

impl ModelArgs {
    /// Resolves the model (pulling a known one on first use) and loads it; the flag values
    /// were checked by their parsers.
    pub fn load(&self) -> anyhow::Result<(Engine, f64)> {
        self.load_with(None)
    }

    /// Whether the CUDA backend is among those this run may use (named, or available by
    /// default).
    fn uses_cuda(&self) -> bool {
        backends::resolve(&self.backends)
            .is_ok_and(|ids| ids.contains(&minfer_engine::backends::CUDA_ID))
    }

    /// [`ModelArgs::load`] for `serve` (`Some`: the smallest context it starts with): with
    /// neither -c nor --kv-mem the context is sized from the CUDA device's free memory after
    /// the weights (minfer_engine::kvsize).
    pub fn load_with(&self, serve_min_ctx: Option<usize>) -> anyhow::Result<(Engine, f64)> {
        check_multi_gpu(
            self.tensor_parallel,
            &self.gpus,
            self.split_mode.as_deref(),
            backends::cuda_device_count,
        )?;
        let cache_type_auto = self.cache_type.trim().eq_ignore_ascii_case("auto");
        let cache_type = if cache_type_auto {
            minfer_gguf::GgmlType::F32
        } else {
            parse_cache_type(&self.cache_type)?
        };
        let numerics = minfer_engine::backends::cpu::Numerics::parse(&self.numerics)
            .with_context(|| format!("--numerics {}", self.numerics))?;
        // llama.cpp's x86 numerics run on an f16 KV: `auto` picks it.
        let (cache_type, cache_type_auto) =
            auto_for_numerics(cache_type, cache_type_auto, numerics);
        warn_threads(self.threads);
        let path = model_path(&self.model)?;
        let t0 = Instant::now();
        let model_ctx = minfer_gguf::GgufModel::open(&path)
            .ok()
            .and_then(|m| minfer_models::HParams::from_metadata(m.metadata()).ok())
            .map(|h| h.context_length);
        let n_ctx = match (self.n_ctx, model_ctx) {
            // 0 asks for the model's own context (the engine's 0).
            (Some(0), _) => 0,
            (Some(n), Some(max)) if n > max => {
                eprintln!("note: -c/--n-ctx {n} clamped to the model's context length {max}");
                max
            }
            (Some(n), _) => n,
            (None, Some(max)) => DEFAULT_N_CTX.min(max),
            (None, None) => DEFAULT_N_CTX,
        };
        let min_ctx = serve_min_ctx.unwrap_or(1);
        let kv_size = match (self.kv_mem, self.n_ctx, serve_min_ctx) {
            (Some(b), _, _) => minfer_engine::KvSize::Memory {
                bytes: b as u64,
                min_ctx,
            },
            // From the device's memory where CUDA takes part (a Metal build keeps -c's default).
            (None, None, Some(_)) if self.uses_cuda() => {
                minfer_engine::KvSize::FreeMemory { min_ctx }
            }
            _ => minfer_engine::KvSize::Tokens,
        };
        let mut cfg = EngineConfig {
            n_ctx,
            kv_size,
            threads: self.threads.unwrap_or(0),
            cache_type,
            cache_type_auto,
            backends: self.backends.clone(),
            ..EngineConfig::default()
        }
        .with_numerics(numerics);
        self.offload.apply(&mut cfg);
        let mut engine =
            Engine::load(&path, cfg).with_context(|| format!("cannot load {}", path.display()))?;
        // What kept the model off a device (a backend that holds none of its weights).
        for line in engine.placement_report() {
            eprintln!("note: {line}");
        }
        self.offload.report(&engine);
        if kv_size != minfer_engine::KvSize::Tokens {
            eprintln!("{}", engine.kv_plan().line());
        }
        startup_line(&mut engine)?;
        Ok((engine, t0.elapsed().as_secs_f64() * 1e3))
    }
}

/// `--cache-type auto` under llama.cpp's x86 numerics (`--numerics llamacpp-x86-*`, which
/// need an f16 KV): f16, decided here; other choices as given.
pub fn auto_for_numerics(
    cache_type: minfer_gguf::GgmlType,
    auto: bool,
    numerics: minfer_engine::backends::cpu::Numerics,
) -> (minfer_gguf::GgmlType, bool) {
    if auto && numerics != minfer_engine::backends::cpu::Numerics::Native {
        (minfer_gguf::GgmlType::F16, false)
    } else {
        (cache_type, auto)
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

/// A `-m` that is a path, a known model name or `hf:OWNER/REPO[:TAG]`, as a local file
/// (fetched into the cache on first use), for the commands that take it as a path.
pub fn model_file(model: &std::path::Path) -> anyhow::Result<std::path::PathBuf> {
    if model.exists() {
        return Ok(model.into());
    }
    let name = model
        .to_str()
        .with_context(|| format!("model name {} is not UTF-8", model.display()))?;
    Ok(minfer_hub::resolve_model(name)?)
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
