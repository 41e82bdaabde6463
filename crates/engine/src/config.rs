//! How an engine is configured ([`EngineConfig`]) and the KV element types `--cache-type`
//! names.

use crate::error::{Error, Result};
use minfer_gguf::GgmlType;
use minfer_models::HParams;

/// The KV element type of a device engine under `--cache-type auto` (seed §2.3): f16 when
/// `n_layers × n_kv_embd >= 8192` (the 7B class, where attention is KV-bandwidth bound),
/// f32 below (small models are dispatch bound and f16 measured slower there).
pub fn auto_cache_type(hp: &HParams) -> GgmlType {
    if hp.block_count * hp.head_count_kv * hp.head_dim >= 8192 {
        GgmlType::F16
    } else {
        GgmlType::F32
    }
}

/// KV cache element types, as `--cache-type` spells them.
pub fn parse_cache_type(s: &str) -> Result<GgmlType> {
    match s.trim().to_ascii_lowercase().as_str() {
        "f32" => Ok(GgmlType::F32),
        "f16" => Ok(GgmlType::F16),
        "q8_0" => Ok(GgmlType::Q8_0),
        other => Err(Error::CacheType(
            other.into(),
            "expected f32, f16 or q8_0".into(),
        )),
    }
}

#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Context length (KV cells of the arena, shared by all sequences); 0 means the model's
    /// `context_length`.
    pub n_ctx: usize,
    /// CPU threads; 0 means the number of physical cores.
    pub threads: usize,
    pub cache_type: GgmlType,
    /// `--cache-type auto`: an engine on a device picks its KV element type by model size
    /// ([`auto_cache_type`]); a CPU-only engine keeps `cache_type`. Per engine, never
    /// process-wide: two engines in one process may hold different formats.
    pub cache_type_auto: bool,
    /// `--backend` names; empty means every available backend.
    pub backends: Vec<String>,
    /// Bytes each backend may allocate for KV regions and activations (None: unbounded).
    pub memory_budget: Option<usize>,
    /// Most tokens in one forward; longer prompts run as several (chunked prefill).
    pub n_batch: usize,
    /// The knobs of the engine and its backends (docs/SETTINGS.md), handed to the backend
    /// table; the default reads this process's environment ([`crate::Settings::from_env`]).
    pub settings: crate::Settings,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            n_ctx: 4096,
            threads: 0,
            cache_type: GgmlType::F32,
            cache_type_auto: false,
            backends: Vec::new(),
            memory_budget: None,
            n_batch: 512,
            // The CLI refuses a bad value at start, so only a library caller can reach this
            // with one: a panic naming it (as the kernels' lookup always did), not a default.
            settings: crate::Settings::from_env().unwrap_or_else(|e| panic!("{e}")),
        }
    }
}

impl EngineConfig {
    /// The same configuration with the CPU kernels following `numerics` (`--numerics`).
    pub fn with_numerics(mut self, numerics: minfer_cpu::Numerics) -> EngineConfig {
        self.settings.cpu.numerics = numerics;
        self
    }

    /// The same configuration with the decode fusions of `fusion` (the gates' controls).
    pub fn with_fusion(mut self, fusion: minfer_graph::FusionConfig) -> EngineConfig {
        self.settings.fusion = fusion;
        self
    }
}
