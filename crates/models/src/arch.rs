//! The architectures minfer runs, their tensor-name tables and hyperparameters read from
//! GGUF keys. One table per architecture; no `format!`-built names elsewhere.

use crate::error::{Error, Result};
use minfer_gguf::Metadata;
use minfer_graph::RopeStyle;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Arch {
    Qwen2,
    Qwen3,
    Llama,
}

impl Arch {
    pub const ALL: [Arch; 3] = [Arch::Qwen2, Arch::Qwen3, Arch::Llama];

    /// The `general.architecture` spelling.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Llama => "llama",
        }
    }

    /// Parses `general.architecture` (exact, case-sensitive), refusing anything else by name.
    pub fn from_name(name: &str) -> Result<Arch> {
        Arch::ALL
            .into_iter()
            .find(|a| a.name() == name)
            .ok_or_else(|| Error::UnsupportedArch(name.to_string()))
    }

    pub fn from_metadata(md: &Metadata) -> Result<Arch> {
        let name = md
            .get_str("general.architecture")
            .ok_or(Error::MissingKey("general.architecture".into()))?;
        Arch::from_name(name)
    }

    /// Q/K/V projections carry biases (Qwen2).
    pub fn has_qkv_bias(self) -> bool {
        matches!(self, Arch::Qwen2)
    }

    /// Per-head RMSNorm on Q and K before RoPE (Qwen3).
    pub fn has_qk_norm(self) -> bool {
        matches!(self, Arch::Qwen3)
    }

    /// RoPE pairing: NeoX style (rotate halves) for Qwen; LLaMA GGUFs are converted with
    /// Q/K rows permuted so that the "normal" (adjacent pairs) style applies.
    pub fn rope_style(self) -> RopeStyle {
        match self {
            Arch::Qwen2 | Arch::Qwen3 => RopeStyle::Neox,
            Arch::Llama => RopeStyle::Normal,
        }
    }
}

/// Tensor names, as GGUF spells them.
pub mod names {
    pub const TOKEN_EMBD: &str = "token_embd.weight";
    pub const OUTPUT_NORM: &str = "output_norm.weight";
    /// Absent when the embedding is tied.
    pub const OUTPUT: &str = "output.weight";

    /// Per-layer tensor kinds.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Layer {
        AttnNorm,
        AttnQ,
        AttnK,
        AttnV,
        AttnQBias,
        AttnKBias,
        AttnVBias,
        AttnQNorm,
        AttnKNorm,
        AttnOutput,
        FfnNorm,
        FfnGate,
        FfnUp,
        FfnDown,
    }

    impl Layer {
        pub fn suffix(self) -> &'static str {
            match self {
                Layer::AttnNorm => "attn_norm.weight",
                Layer::AttnQ => "attn_q.weight",
                Layer::AttnK => "attn_k.weight",
                Layer::AttnV => "attn_v.weight",
                Layer::AttnQBias => "attn_q.bias",
                Layer::AttnKBias => "attn_k.bias",
                Layer::AttnVBias => "attn_v.bias",
                Layer::AttnQNorm => "attn_q_norm.weight",
                Layer::AttnKNorm => "attn_k_norm.weight",
                Layer::AttnOutput => "attn_output.weight",
                Layer::FfnNorm => "ffn_norm.weight",
                Layer::FfnGate => "ffn_gate.weight",
                Layer::FfnUp => "ffn_up.weight",
                Layer::FfnDown => "ffn_down.weight",
            }
        }
        /// `blk.{layer}.{suffix}`
        pub fn name(self, layer: usize) -> String {
            format!("blk.{layer}.{}", self.suffix())
        }
    }
}

/// Hyperparameters, named after their GGUF keys (`{arch}.{key}`).
#[derive(Clone, Debug, PartialEq)]
pub struct HParams {
    pub arch: Arch,
    /// `block_count`
    pub block_count: usize,
    /// `embedding_length`
    pub embedding_length: usize,
    /// `feed_forward_length`
    pub feed_forward_length: usize,
    /// `attention.head_count`
    pub head_count: usize,
    /// `attention.head_count_kv`
    pub head_count_kv: usize,
    /// `attention.key_length` (Qwen3), else embedding_length / head_count.
    pub head_dim: usize,
    /// `context_length`
    pub context_length: usize,
    /// `attention.layer_norm_rms_epsilon`
    pub rms_epsilon: f32,
    /// `rope.freq_base`
    pub rope_freq_base: f32,
    /// `rope.scaling.factor` for linear scaling (1.0 when absent or type none).
    pub rope_scale: f32,
    /// Vocabulary size (length of `tokenizer.ggml.tokens`, or `vocab_size`).
    pub vocab_size: usize,
}

impl HParams {
    pub fn from_metadata(md: &Metadata) -> Result<HParams> {
        let arch = Arch::from_metadata(md)?;
        let a = arch.name();
        let key = |k: &str| format!("{a}.{k}");
        let req = |k: &str| -> Result<usize> {
            let full = key(k);
            md.get_u64(&full)
                .map(|v| v as usize)
                .ok_or(Error::MissingKey(full))
        };
        let embedding_length = req("embedding_length")?;
        let head_count = req("attention.head_count")?;
        if head_count == 0 {
            return Err(Error::BadHParam(key("attention.head_count"), "is 0".into()));
        }
        let head_count_kv = md
            .get_u64(&key("attention.head_count_kv"))
            .map(|v| v as usize)
            .unwrap_or(head_count);
        if head_count_kv == 0 || head_count % head_count_kv != 0 {
            return Err(Error::BadHParam(
                key("attention.head_count_kv"),
                format!("{head_count_kv} does not divide head_count {head_count}"),
            ));
        }
        let head_dim = md
            .get_u64(&key("attention.key_length"))
            .map(|v| v as usize)
            .unwrap_or(embedding_length / head_count);
        let rope_scale = match md.get_str(&key("rope.scaling.type")) {
            None | Some("none") => 1.0,
            Some("linear") => md
                .get_f64(&key("rope.scaling.factor"))
                .map(|f| f as f32)
                .unwrap_or(1.0),
            Some(other) => {
                return Err(Error::BadHParam(
                    key("rope.scaling.type"),
                    format!("{other:?} is not supported (none, linear)"),
                ))
            }
        };
        let vocab_size = md
            .get_array("tokenizer.ggml.tokens")
            .map(|t| t.len())
            .or_else(|| md.get_u64(&key("vocab_size")).map(|v| v as usize))
            .ok_or(Error::MissingKey("tokenizer.ggml.tokens".into()))?;
        Ok(HParams {
            arch,
            block_count: req("block_count")?,
            embedding_length,
            feed_forward_length: req("feed_forward_length")?,
            head_count,
            head_count_kv,
            head_dim,
            context_length: req("context_length")?,
            rms_epsilon: md
                .get_f64(&key("attention.layer_norm_rms_epsilon"))
                .map(|v| v as f32)
                .ok_or(Error::MissingKey(key("attention.layer_norm_rms_epsilon")))?,
            rope_freq_base: md
                .get_f64(&key("rope.freq_base"))
                .map(|v| v as f32)
                .unwrap_or(10000.0),
            rope_scale,
            vocab_size,
        })
    }
}
