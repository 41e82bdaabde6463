//! minfer-convert, `minfer convert`'s library: a Hugging Face checkpoint directory
//! (config.json, tokenizer.json, tokenizer_config.json, generation_config.json,
//! model.safetensors or shards with model.safetensors.index.json) to GGUF, the way
//! llama.cpp's convert_hf_to_gguf.py writes it for Qwen2, Qwen3 and LLaMA: the same keys and
//! value types, tokenizer arrays, tensor names, shapes (reversed into ggml order), per-tensor
//! types and encodings.
//! `scripts/convert-reference.py` is the test oracle (see `tests/convert.rs`).
//!
//! What is refused by name: an architecture other than the three, a missing file, a tensor
//! the name table does not know, a dtype other than F32/F16/BF16, RoPE scaling, tokenizers
//! other than GPT-2-style BPE with a known pre-tokenizer. Tensors are streamed one at a time.

mod safetensors;
mod vocab;

use minfer_gguf::quants::{f32_to_bf16, f32_to_f16};
use minfer_gguf::{quants, write_streaming, GgmlType, Metadata, TensorPlan, Value};
use safetensors::StTensor;
use serde_json::Value as Json;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is missing: it holds {what}")]
    MissingFile { path: PathBuf, what: &'static str },
    #[error("{path}: {why}")]
    Config { path: PathBuf, why: String },
    #[error("{path}: {why}")]
    Safetensors { path: PathBuf, why: String },
    #[error("architecture {arch:?} is not converted (Qwen2ForCausalLM, Qwen3ForCausalLM, LlamaForCausalLM)")]
    UnknownArch { arch: String },
    #[error("tensor {name:?} has no GGUF name for {arch} (unknown tensor)")]
    UnknownTensor { name: String, arch: &'static str },
    #[error("tokenizer: {why}")]
    Tokenizer { why: String },
    #[error(transparent)]
    Gguf(#[from] minfer_gguf::Error),
}

/// The output's weight type (`--outtype`), as convert_hf_to_gguf.py names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutType {
    F32,
    F16,
    Bf16,
    Q8_0,
}

impl OutType {
    /// llama.cpp's `general.file_type` (LlamaFileType).
    fn file_type(self) -> u32 {
        match self {
            OutType::F32 => 0,
            OutType::F16 => 1,
            OutType::Q8_0 => 7,
            OutType::Bf16 => 32,
        }
    }
    fn ggml(self) -> GgmlType {
        match self {
            OutType::F32 => GgmlType::F32,
            OutType::F16 => GgmlType::F16,
            OutType::Bf16 => GgmlType::Bf16,
            OutType::Q8_0 => GgmlType::Q8_0,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Arch {
    Qwen2,
    Qwen3,
    Llama,
}

impl Arch {
    fn name(self) -> &'static str {
        match self {
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Llama => "llama",
        }
    }
}

/// What a conversion wrote.
#[derive(Debug)]
pub struct ConvertReport {
    pub arch: &'static str,
    pub n_tensors: usize,
    /// Things the user should know (a missing chat template, type fallbacks).
    pub notes: Vec<String>,
}

/// A checkpoint tensor's GGUF name (gguf-py's tensor map for these architectures), or
/// None for the ones convert_hf_to_gguf.py drops.
fn gguf_name(hf: &str, arch: Arch) -> Result<Option<String>, ConvertError> {
    if hf.ends_with(".rotary_emb.inv_freq")
        || hf.ends_with(".attention.masked_bias")
        || hf.ends_with(".attention.bias")
    {
        return Ok(None);
    }
    let unknown = || ConvertError::UnknownTensor {
        name: hf.into(),
        arch: arch.name(),
    };
    let fixed = match hf {
        "model.embed_tokens.weight" => Some("token_embd.weight"),
        "model.norm.weight" => Some("output_norm.weight"),
        "lm_head.weight" => Some("output.weight"),
        _ => None,
    };
    if let Some(f) = fixed {
        return Ok(Some(f.into()));
    }
    let rest = hf.strip_prefix("model.layers.").ok_or_else(unknown)?;
    let (bid, leaf) = rest.split_once('.').ok_or_else(unknown)?;
    let bid: u32 = bid.parse().map_err(|_| unknown())?;
    let (stem, suffix) = leaf.rsplit_once('.').ok_or_else(unknown)?;
    let base = match stem {
        "input_layernorm" => "attn_norm",
        "post_attention_layernorm" => "ffn_norm",
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "self_attn.q_norm" if arch == Arch::Qwen3 => "attn_q_norm",
        "self_attn.k_norm" if arch == Arch::Qwen3 => "attn_k_norm",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        _ => return Err(unknown()),
    };
    if suffix != "weight" && suffix != "bias" {
        return Err(unknown());
    }
    Ok(Some(format!("blk.{bid}.{base}.{suffix}")))
}

fn cfg_u64(config: &Json, path: &Path, key: &str) -> Result<u64, ConvertError> {
    config[key].as_u64().ok_or_else(|| ConvertError::Config {
        path: path.into(),
        why: format!("{key} is missing or not a whole number"),
    })
}

/// Reads one generation_config.json value as the GGUF value type gguf-py writes.
type ToValue = dyn Fn(&Json) -> Option<Value>;

/// The model metadata before the tokenizer, in convert_hf_to_gguf.py's order.
fn model_metadata(
    dir: &Path,
    arch: Arch,
    config: &Json,
    out: OutType,
) -> Result<Metadata, ConvertError> {
    let cpath = dir.join("config.json");
    let a = arch.name();
    let mut md = Metadata::new();
    md.set("general.architecture", Value::String(a.into()));
    md.set("general.type", Value::String("model".into()));
    let gen_path = dir.join("generation_config.json");
    let gen = if gen_path.is_file() {
        vocab::read_json(&gen_path, "sampling defaults")?
    } else {
        Json::Null
    };
    // gguf-py Metadata.set_gguf_meta_model: sampling defaults from generation_config.json.
    let f32v = |v: &Json| v.as_f64().map(|x| Value::F32(x as f32));
    let i32v = |v: &Json| v.as_i64().map(|x| Value::I32(x as i32));
    let samp: [(&str, &str, &ToValue); 12] = [
        ("sequence", "sequence", &|v: &Json| {
            v.as_str().map(|s| Value::String(s.into()))
        }),
        ("top_k", "top_k", &i32v),
        ("top_p", "top_p", &f32v),
        ("min_p", "min_p", &f32v),
        ("xtc_probability", "xtc_probability", &f32v),
        ("xtc_threshold", "xtc_threshold", &f32v),
        ("temp", "temperature", &f32v),
        ("penalty_last_n", "penalty_last_n", &i32v),
        ("penalty_repeat", "repetition_penalty", &f32v),
        ("mirostat", "mirostat", &i32v),
        ("mirostat_tau", "mirostat_tau", &f32v),
        ("mirostat_eta", "mirostat_eta", &f32v),
    ];
    for (key, gen_key, conv) in samp {
        if let Some(v) = conv(&gen[gen_key]) {
            md.set(format!("general.sampling.{key}"), v);
        }
    }
    let name = dir
        .canonicalize()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "model".into());
    md.set("general.name", Value::String(name));
    let u32v = |k: &str| cfg_u64(config, &cpath, k).map(|v| Value::U32(v as u32));
    md.set(format!("{a}.block_count"), u32v("num_hidden_layers")?);
    md.set(
        format!("{a}.context_length"),
        u32v("max_position_embeddings")?,
    );
    md.set(format!("{a}.embedding_length"), u32v("hidden_size")?);
    md.set(
        format!("{a}.feed_forward_length"),
        u32v("intermediate_size")?,
    );
    md.set(
        format!("{a}.attention.head_count"),
        u32v("num_attention_heads")?,
    );
    if config["num_key_value_heads"].is_u64() {
        md.set(
            format!("{a}.attention.head_count_kv"),
            u32v("num_key_value_heads")?,
        );
    }
    for key in ["rope_scaling", "rope_parameters"] {
        if !config[key].is_null() {
            return Err(ConvertError::Config {
                path: cpath,
                why: format!("{key} (RoPE scaling) is not converted yet"),
            });
        }
    }
    if let Some(t) = config["rope_theta"].as_f64() {
        md.set(format!("{a}.rope.freq_base"), Value::F32(t as f32));
    }
    let eps = config["rms_norm_eps"]
        .as_f64()
        .ok_or_else(|| ConvertError::Config {
            path: cpath.clone(),
            why: "rms_norm_eps is missing".into(),
        })?;
    md.set(
        format!("{a}.attention.layer_norm_rms_epsilon"),
        Value::F32(eps as f32),
    );
    if config["head_dim"].is_u64() {
        md.set(format!("{a}.attention.key_length"), u32v("head_dim")?);
        md.set(format!("{a}.attention.value_length"), u32v("head_dim")?);
    }
    md.set("general.file_type", Value::U32(out.file_type()));
    if arch == Arch::Llama {
        md.set(format!("{a}.vocab_size"), u32v("vocab_size")?);
        let rope_dim = match config["head_dim"].as_u64() {
            Some(d) => d,
            None => {
                cfg_u64(config, &cpath, "hidden_size")?
                    / cfg_u64(config, &cpath, "num_attention_heads")?
            }
        };
        md.set(
            format!("{a}.rope.dimension_count"),
            Value::U32(rope_dim as u32),
        );
    }
    md.set("general.quantization_version", Value::U32(2));
    Ok(md)
}

/// The safetensors files, sorted by name (convert_hf_to_gguf.py's order), with their tensors.
fn checkpoint_tensors(dir: &Path) -> Result<Vec<StTensor>, ConvertError> {
    let single = dir.join("model.safetensors");
    let index = dir.join("model.safetensors.index.json");
    let files: Vec<PathBuf> = if index.is_file() {
        let idx = vocab::read_json(&index, "the shard index")?;
        let map = idx["weight_map"]
            .as_object()
            .ok_or_else(|| ConvertError::Config {
                path: index.clone(),
                why: "no weight_map".into(),
            })?;
        let mut f: Vec<String> = map
            .values()
            .filter_map(|v| v.as_str().map(String::from))
            .collect();
        f.sort();
        f.dedup();
        f.into_iter().map(|n| dir.join(n)).collect()
    } else if single.is_file() {
        vec![single]
    } else {
        return Err(ConvertError::MissingFile {
            path: single,
            what: "the weights (or shards listed in model.safetensors.index.json)",
        });
    };
    let mut out = Vec::new();
    for f in &files {
        if !f.is_file() {
            return Err(ConvertError::MissingFile {
                path: f.clone(),
                what: "a shard named in model.safetensors.index.json",
            });
        }
        out.extend(safetensors::read_header(f)?);
    }
    Ok(out)
}

/// One output tensor: where it comes from and how it is written.
struct Planned {
    src: StTensor,
    plan: TensorPlan,
    /// LLaMA q/k rows reordered from Hugging Face's rotate-half layout to ggml's
    /// interleaved RoPE layout: (heads for the permutation).
    permute_heads: Option<usize>,
}

/// convert_hf_to_gguf.py's type rule: 1-D tensors, norms and biases in F32; the rest in the
/// out type, with Q8_0 falling back to F16 for rows that are not whole 32-value blocks.
fn tensor_type(name: &str, shape: &[u64], out: OutType) -> GgmlType {
    if shape.len() <= 1 || name.ends_with("_norm.weight") || !name.ends_with(".weight") {
        return GgmlType::F32;
    }
    let row = *shape.last().expect("2-D");
    if out == OutType::Q8_0 && !row.is_multiple_of(32) {
        return GgmlType::F16;
    }
    out.ggml()
}

/// Converts the checkpoint in `dir` to `out_path`. `progress(done, total)` counts tensors.
pub fn convert(
    dir: &Path,
    out_path: &Path,
    out: OutType,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<ConvertReport, ConvertError> {
    let cpath = dir.join("config.json");
    let config = vocab::read_json(&cpath, "the model configuration (config.json)")?;
    let hf_arch = config["architectures"][0].as_str().unwrap_or("(none)");
    let arch = match hf_arch {
        "Qwen2ForCausalLM" => Arch::Qwen2,
        "Qwen3ForCausalLM" => Arch::Qwen3,
        "LlamaForCausalLM" => Arch::Llama,
        other => return Err(ConvertError::UnknownArch { arch: other.into() }),
    };
    let mut md = model_metadata(dir, arch, &config, out)?;
    let mut notes = Vec::new();
    if arch == Arch::Llama {
        let tc = vocab::read_json(&dir.join("tokenizer_config.json"), "the tokenizer settings")?;
        if let Some(b) = tc["add_prefix_space"].as_bool() {
            md.set("tokenizer.ggml.add_space_prefix", Value::Bool(b));
        }
    }
    notes.extend(vocab::add_vocab(&mut md, dir, &config)?);
    if arch == Arch::Llama && config["vocab_size"].as_u64() == Some(49152) {
        md.set("tokenizer.ggml.add_bos_token", Value::Bool(false));
    }
    let n_head = cfg_u64(&config, &cpath, "num_attention_heads")? as usize;
    let n_head_kv = config["num_key_value_heads"]
        .as_u64()
        .map_or(n_head, |n| n as usize);
    let mut planned = Vec::new();
    for src in checkpoint_tensors(dir)? {
        let Some(name) = gguf_name(&src.name, arch)? else {
            continue;
        };
        let ty = tensor_type(&name, &src.shape, out);
        if ty != out.ggml() && ty == GgmlType::F16 {
            notes.push(format!(
                "{name}: rows of {} are not whole Q8_0 blocks; written as F16",
                src.shape.last().copied().unwrap_or(0)
            ));
        }
        let permute_heads = match (arch, src.name.rsplit('.').nth(1)) {
            (Arch::Llama, Some("q_proj")) if src.name.ends_with(".weight") => Some(n_head),
            (Arch::Llama, Some("k_proj")) if src.name.ends_with(".weight") => Some(n_head_kv),
            _ => None,
        };
        let dims: Vec<u64> = src.shape.iter().rev().copied().collect();
        planned.push(Planned {
            plan: TensorPlan { name, dims, ty },
            src,
            permute_heads,
        });
    }
    let plans: Vec<TensorPlan> = planned.iter().map(|p| p.plan.clone()).collect();
    let total = plans.len();
    write_streaming(&md, &plans, out_path, |i, w| -> Result<(), ConvertError> {
        let p = &planned[i];
        let mut data = p.src.read_f32()?;
        if let Some(heads) = p.permute_heads {
            data = permute_rows(&data, &p.src.shape, heads);
        }
        let bytes = encode(&data, &p.plan)?;
        w.write_all(&bytes).map_err(|e| ConvertError::Io {
            path: out_path.into(),
            source: e,
        })?;
        progress(i + 1, total);
        Ok(())
    })?;
    Ok(ConvertReport {
        arch: arch.name(),
        n_tensors: total,
        notes,
    })
}

/// Rows `h*hd + s*hd/2 + j` move to `h*hd + 2j + s`: Hugging Face keeps the two halves of
/// each head's rotary pairs apart (rotate_half), ggml's LLaMA RoPE wants them adjacent.
fn permute_rows(data: &[f32], shape: &[u64], heads: usize) -> Vec<f32> {
    let rows = shape[0] as usize;
    let cols = data.len() / rows;
    let hd = rows / heads;
    let half = hd / 2;
    let mut out = vec![0f32; data.len()];
    for h in 0..heads {
        for s in 0..2 {
            for j in 0..half {
                let from = h * hd + s * half + j;
                let to = h * hd + 2 * j + s;
                out[to * cols..(to + 1) * cols]
                    .copy_from_slice(&data[from * cols..(from + 1) * cols]);
            }
        }
    }
    out
}

fn encode(data: &[f32], plan: &TensorPlan) -> Result<Vec<u8>, ConvertError> {
    Ok(match plan.ty {
        GgmlType::F32 => data.iter().flat_map(|v| v.to_le_bytes()).collect(),
        GgmlType::F16 => data
            .iter()
            .flat_map(|&v| f32_to_f16(v).to_le_bytes())
            .collect(),
        GgmlType::Bf16 => data
            .iter()
            .flat_map(|&v| f32_to_bf16(v).to_le_bytes())
            .collect(),
        ty => {
            let row = plan.dims[0] as usize;
            let row_bytes = ty.row_bytes(row as u64).expect("whole blocks") as usize;
            let mut out = vec![0u8; row_bytes * (data.len() / row)];
            for (src, dst) in data.chunks(row).zip(out.chunks_mut(row_bytes)) {
                quants::quantize_row(ty, src, dst)?;
            }
            out
        }
    })
}
