//! How an engine is configured ([`EngineConfig`]) and the KV element types `--cache-type`
//! names.

use crate::error::{Error, Result};
use minfer_gguf::GgmlType;
use minfer_models::HParams;

/// Plans the graph cache keeps, and the bytes their buffers may take (the runner's cache;
/// layer offload's `auto` reserves the bytes on the device).
pub(crate) const GRAPH_CACHE: usize = 16;
pub(crate) const GRAPH_CACHE_BYTES: usize = 512 << 20;

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

/// `--gpu-layers`: a count of blocks (clamped to the model's, as llama.cpp's `-ngl`), or
/// `auto`, the largest prefix that fits the device budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuLayers {
    Auto,
    Count(usize),
}

impl GpuLayers {
    /// `auto` or a count; anything else is refused naming the value (the CLI's usage error,
    /// before the model is read).
    pub fn parse(s: &str) -> std::result::Result<GpuLayers, String> {
        let t = s.trim();
        if t.eq_ignore_ascii_case("auto") {
            return Ok(GpuLayers::Auto);
        }
        t.parse::<usize>()
            .map(GpuLayers::Count)
            .map_err(|_| format!("'{t}' is neither a number of blocks nor `auto`"))
    }
}

/// `--gpu-mem`: bytes, or a number with K, M, G or T (binary units), e.g. `3G`, `512M`.
pub fn parse_size(s: &str) -> std::result::Result<usize, String> {
    size(s).ok_or_else(|| {
        format!(
            "'{}' is not a size (bytes, or a number with K, M, G or T: 3G, 512M)",
            s.trim()
        )
    })
}

/// The size grammar (the same as `MINFER_EMU_MEM`'s).
fn size(s: &str) -> Option<usize> {
    let t = s.trim().to_ascii_uppercase();
    let t = t
        .strip_suffix("IB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(&t);
    let shift = match t.chars().last()? {
        'K' => 10,
        'M' => 20,
        'G' => 30,
        'T' => 40,
        _ => 0,
    };
    let num = if shift == 0 { t } else { &t[..t.len() - 1] };
    let mul = 1u64 << shift;
    let bytes = match num.parse::<u64>() {
        Ok(n) => n.checked_mul(mul)?,
        Err(_) => {
            let x = num
                .parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x >= 0.0)?;
            let b = x * mul as f64;
            if b >= u64::MAX as f64 {
                return None;
            }
            b as u64
        }
    };
    usize::try_from(bytes).ok()
}

#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Context length (KV cells of the arena, shared by all sequences); 0 means the model's
    /// `context_length`. Under a sized [`crate::KvSize`] it is the fallback the plan names.
    pub n_ctx: usize,
    /// How the arena is sized: `n_ctx` as given, from `--kv-mem`, or from the device's free
    /// memory after the weights ([`crate::kvsize`]).
    pub kv_size: crate::KvSize,
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
    /// Layer offload (`--gpu-layers N|auto`): how many blocks go on the device backend, the
    /// rest on the CPU ([`crate::offload`]); without a device backend it is unused.
    pub gpu_layers: GpuLayers,
    /// `--gpu-mem SIZE`: the device budget `auto` fits blocks into, and the allocator's limit
    /// on that device (None: the device's free memory, as it reports it).
    pub gpu_mem: Option<usize>,
    /// `--offload-head`: the final norm and output head on the device backend whatever
    /// the number of blocks there (llama.cpp's placement of its output layer); without it
    /// they go on the device only with every block ([`crate::offload`]).
    pub offload_head: bool,
    /// Op offload (on unless `--no-op-offload`, llama.cpp's flag): on a plan that leaves
    /// blocks on the CPU, their prompt rows run on the device but for their KV stores and
    /// attention, the weights copied in per forward ([`crate::offload`], ADR 0014).
    pub op_offload: bool,
    /// The knobs of the engine and its backends (docs/SETTINGS.md), handed to the backend
    /// table; the default reads this process's environment ([`crate::Settings::from_env`]).
    pub settings: crate::Settings,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            n_ctx: 4096,
            kv_size: crate::KvSize::Tokens,
            threads: 0,
            cache_type: GgmlType::F32,
            cache_type_auto: false,
            backends: Vec::new(),
            memory_budget: None,
            n_batch: 512,
            gpu_layers: GpuLayers::Auto,
            gpu_mem: None,
            offload_head: false,
            op_offload: true,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts and `auto` are taken; the control: a word, a negative and a fraction are refused
    /// naming the value.
    #[test]
    fn gpu_layers_and_sizes_parse() {
        assert_eq!(GpuLayers::parse("auto"), Ok(GpuLayers::Auto));
        assert_eq!(GpuLayers::parse(" 20 "), Ok(GpuLayers::Count(20)));
        assert_eq!(GpuLayers::parse("0"), Ok(GpuLayers::Count(0)));
        for bad in ["all", "-1", "2.5", ""] {
            let e = GpuLayers::parse(bad).unwrap_err();
            assert!(e.contains(&format!("'{bad}'")), "{e}");
        }
        assert_eq!(parse_size("3G"), Ok(3 << 30));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("1.5g"), Ok(3 << 29));
        assert_eq!(parse_size("1000"), Ok(1000));
        for bad in ["", "M", "lots", "-3G"] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
    }
}
