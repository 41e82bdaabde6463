//! Logits helpers the device gates share (the Metal emulator's and the CUDA suite): the f64
//! reference forward of a model file, distances against it, and greedy decoding.

use minfer_engine::Engine;
use minfer_gguf::GgufModel;
use minfer_models::{reference, HParams};
use std::path::Path;

/// Every row's logits of the plain f64 reference forward over `tokens`.
pub fn reference_logits(path: &Path, tokens: &[u32]) -> Vec<Vec<f64>> {
    let gguf = GgufModel::open(path).unwrap();
    let hp = HParams::from_metadata(gguf.metadata()).unwrap();
    reference::forward(&gguf, &hp, tokens).unwrap()
}

/// max |a - b| of an engine's row against a reference row.
pub fn max_diff(a: &[f32], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .fold(0f64, |m, (x, y)| m.max((*x as f64 - y).abs()))
}

/// RMS of every reference value.
pub fn rms(v: &[Vec<f64>]) -> f64 {
    let n: usize = v.iter().map(|r| r.len()).sum();
    (v.iter().flatten().map(|x| x * x).sum::<f64>() / n as f64).sqrt()
}

/// Where the device gates have long found it.
pub use crate::exact::bits;

/// Prefill all but the last 3 tokens (every row's logits), then decode one by one: every
/// row's logits in order.
pub fn run_logits(e: &mut Engine, tokens: &[u32]) -> Vec<Vec<f32>> {
    let vocab = e.hparams().vocab_size;
    let split = tokens.len() - 3;
    let mut rows: Vec<Vec<f32>> = e
        .decode(&tokens[..split], 0, split)
        .unwrap()
        .chunks_exact(vocab)
        .map(<[f32]>::to_vec)
        .collect();
    for (i, &t) in tokens[split..].iter().enumerate() {
        rows.push(e.decode_generated(&[t], split + i, 1).unwrap().to_vec());
    }
    rows
}

/// The first index of the largest value.
pub fn argmax(v: &[f32]) -> u32 {
    v.iter()
        .enumerate()
        .fold((0, f32::MIN), |b, (i, &x)| if x > b.1 { (i, x) } else { b })
        .0 as u32
}

/// `n` greedy tokens after `prompt` (prefilled from position 0).
pub fn greedy(e: &mut Engine, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut out = Vec::new();
    let mut next = argmax(e.decode(prompt, 0, 1).unwrap());
    for i in 0..n {
        out.push(next);
        next = argmax(e.decode_generated(&[next], prompt.len() + i, 1).unwrap());
    }
    out
}
