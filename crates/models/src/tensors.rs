//! The tensors each architecture reads, with their expected GGUF shapes (innermost first).
//! Loading checks every one: a missing tensor or a wrong shape is a typed error naming it.

use crate::arch::{names, names::Layer, HParams};
use crate::error::{Error, Result};
use minfer_gguf::GgufModel;

/// Llama 3 RoPE frequency factors: not implemented, so refused rather than ignored.
pub const ROPE_FREQS: &str = "rope_freqs.weight";

/// `output.weight`, or the token embedding when the embedding is tied.
pub fn output_weight_name(model: &GgufModel) -> &'static str {
    if model.tensor(names::OUTPUT).is_some() {
        names::OUTPUT
    } else {
        names::TOKEN_EMBD
    }
}

/// Every tensor the graph reads, with its expected dims.
pub fn expected_tensors(hp: &HParams) -> Vec<(String, Vec<u64>)> {
    let d = hp.embedding_length as u64;
    let q = (hp.head_count * hp.head_dim) as u64;
    let kv = (hp.head_count_kv * hp.head_dim) as u64;
    let ff = hp.feed_forward_length as u64;
    let hd = hp.head_dim as u64;
    let vocab = hp.vocab_size as u64;
    let mut v = vec![
        (names::TOKEN_EMBD.to_string(), vec![d, vocab]),
        (names::OUTPUT_NORM.to_string(), vec![d]),
    ];
    for l in 0..hp.block_count {
        let mut add = |t: Layer, dims: Vec<u64>| v.push((t.name(l), dims));
        add(Layer::AttnNorm, vec![d]);
        add(Layer::AttnQ, vec![d, q]);
        add(Layer::AttnK, vec![d, kv]);
        add(Layer::AttnV, vec![d, kv]);
        if hp.arch.has_qkv_bias() {
            add(Layer::AttnQBias, vec![q]);
            add(Layer::AttnKBias, vec![kv]);
            add(Layer::AttnVBias, vec![kv]);
        }
        if hp.arch.has_qk_norm() {
            add(Layer::AttnQNorm, vec![hd]);
            add(Layer::AttnKNorm, vec![hd]);
        }
        add(Layer::AttnOutput, vec![q, d]);
        add(Layer::FfnNorm, vec![d]);
        add(Layer::FfnGate, vec![d, ff]);
        add(Layer::FfnUp, vec![d, ff]);
        add(Layer::FfnDown, vec![ff, d]);
    }
    v
}

/// Checks presence and shape of every tensor the graph reads (and `output.weight` when present).
pub fn check_tensors(model: &GgufModel, hp: &HParams) -> Result<()> {
    if model.tensor(ROPE_FREQS).is_some() {
        return Err(Error::Unsupported {
            name: ROPE_FREQS.into(),
            problem: "Llama 3 RoPE frequency factors are not supported".into(),
        });
    }
    let mut want = expected_tensors(hp);
    if model.tensor(names::OUTPUT).is_some() {
        want.push((
            names::OUTPUT.into(),
            vec![hp.embedding_length as u64, hp.vocab_size as u64],
        ));
    }
    for (name, dims) in want {
        let t = model
            .tensor(&name)
            .ok_or_else(|| Error::MissingTensor { name: name.clone() })?;
        // Trailing 1-dims are insignificant.
        let mut got = t.info.dims.clone();
        while got.len() > dims.len() && got.last() == Some(&1) {
            got.pop();
        }
        if got != dims {
            return Err(Error::WrongShape {
                name,
                expected: dims,
                got: t.info.dims.clone(),
            });
        }
        if !t.info.ty.is_supported() {
            return Err(Error::Unsupported {
                name,
                problem: format!("weight type {} is not supported", t.info.ty),
            });
        }
    }
    Ok(())
}
