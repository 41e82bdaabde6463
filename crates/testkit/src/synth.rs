//! Synthetic models on disk for the engine tests, and engines on them.
//!
//! Two ways to make one:
//! - [`model`] / [`model_heads`]: `minfer_models::synth` (the product's synthesizer), width 64,
//!   vocabulary 128, the seed chosen;
//! - [`Tiny`] + [`write`] / [`write_with`]: written tensor by tensor here, any weight type
//!   (K-quants as random blocks), tied or not, with an edit of the writer before it is saved
//!   (a wrong architecture, a missing tensor, ...).
//!
//! Every file gets its own name under one directory per process ([`tmp`]), so the tests of a
//! binary can write concurrently. The files are left for the OS's temporary-file cleanup.

use crate::rng::Rng;
use minfer_engine::{Engine, EngineConfig};
use minfer_gguf::{quants, Array, GgmlType, GgufWriter, Value};
use minfer_models::synth::{synthesize, SynthSpec};
use minfer_models::{names, names::Layer, Arch};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// A fresh path `<tmp>/minfer-testkit-<pid>/<n>-<name>` (the directory exists; the file not).
pub fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("minfer-testkit-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(format!("{}-{name}", NEXT.fetch_add(1, Ordering::Relaxed)))
}

/// A synthetic model file: `layers` blocks of width 64, 4 heads, 2 KV heads.
pub fn model(arch: Arch, layers: usize, seed: u64) -> PathBuf {
    model_heads(arch, layers, seed, 4, 2)
}

/// Width 64 with `heads` query heads and `kv_heads` KV heads (2 and 1 give head dim 32,
/// which q8_0 KV needs).
pub fn model_heads(arch: Arch, layers: usize, seed: u64, heads: usize, kv_heads: usize) -> PathBuf {
    let mut spec = SynthSpec::new(arch, layers, 64, heads, kv_heads, 128);
    spec.seed = seed;
    let p = tmp(&format!("{}-{layers}-{seed}-{heads}.gguf", arch.name()));
    std::fs::write(&p, synthesize(&spec).unwrap().to_bytes()).unwrap();
    p
}

/// An engine on `path`: context `n_ctx`, one thread, KV cache of `cache_type`.
pub fn engine(path: &Path, n_ctx: usize, cache_type: GgmlType) -> Engine {
    Engine::load(
        path,
        EngineConfig {
            n_ctx,
            threads: 1,
            cache_type,
            ..EngineConfig::default()
        },
    )
    .unwrap()
}

/// Deterministic token ids below `vocab` (xorshift32 from `seed`).
pub fn tokens(n: usize, seed: u32, vocab: usize) -> Vec<u32> {
    let mut rng = Rng::xorshift32(seed.wrapping_mul(2_654_435_761).wrapping_add(1));
    (0..n)
        .map(|_| (rng.next_u64() % vocab as u64) as u32)
        .collect()
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

pub fn max_abs(a: &[f32]) -> f32 {
    a.iter().map(|x| x.abs()).fold(0.0, f32::max)
}

/// A tiny model written tensor by tensor: [`Tiny::new`] gives the defaults, the fields are
/// there to change before [`write`].
pub struct Tiny {
    pub arch: Arch,
    pub d: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub ff: usize,
    pub vocab: usize,
    pub layers: usize,
    /// Type of the 2-D weights (norms and biases stay F32).
    pub ty: GgmlType,
    /// Type of `attn_v` and `ffn_down` where it differs from `ty` (llama-quantize's Q4_K_M
    /// gives those two Q6_K in some layers: a launch over matrices of two types).
    pub mix: Option<GgmlType>,
    pub tied: bool,
    pub seed: u64,
    pub rope_base: f32,
}

impl Tiny {
    pub fn new(arch: Arch, ty: GgmlType) -> Tiny {
        let k = ty.block_size() as usize;
        let big = k > 32;
        Tiny {
            arch,
            d: if big { 256 } else { 64 },
            n_head: 4,
            n_head_kv: 2,
            // Qwen3's head dim is decoupled from d / n_head (key_length).
            head_dim: match (arch, big) {
                (Arch::Qwen3, true) => 128,
                (Arch::Qwen3, false) => 32,
                (_, true) => 64,
                (_, false) => 16,
            },
            ff: if big { 512 } else { 96 },
            vocab: 40,
            layers: 2,
            ty,
            mix: None,
            tied: arch == Arch::Qwen3,
            seed: 7,
            rope_base: 10000.0,
        }
    }
}

/// Byte offsets of the f16 super-block scales (d, dmin) of the K-quants.
fn k_quant_scales(ty: GgmlType) -> Option<&'static [usize]> {
    match ty {
        GgmlType::Q4K | GgmlType::Q5K => Some(&[0, 2]),
        GgmlType::Q6K => Some(&[208]),
        _ => None,
    }
}

fn tensor(
    w: &mut GgufWriter,
    rng: &mut Rng,
    name: &str,
    dims: &[usize],
    ty: GgmlType,
    scale: f32,
    offset: f32,
) {
    let n: usize = dims.iter().product();
    let vals: Vec<f32> = (0..n).map(|_| offset + scale * rng.signed()).collect();
    let ty = if dims.len() == 1 { GgmlType::F32 } else { ty };
    let rb = ty.row_bytes(dims[0] as u64).expect("whole blocks") as usize;
    let mut bytes = vec![0u8; rb * (n / dims[0])];
    if let Some(scale_at) = k_quant_scales(ty) {
        // K-quants have no quantizer: random blocks (values within about ±8), with the f16
        // super-block scales shrunk so values spread like the quantizable types' (± `scale`).
        let bs = ty.type_size() as usize;
        bytes = quants::random_blocks(ty, bytes.len() / bs, rng.state());
        rng.next_u64();
        for block in bytes.chunks_exact_mut(bs) {
            for &off in scale_at {
                let d = quants::f16_to_f32(u16::from_le_bytes([block[off], block[off + 1]]));
                block[off..off + 2]
                    .copy_from_slice(&quants::f32_to_f16(d * scale / 8.0).to_le_bytes());
            }
        }
    } else {
        for (x, b) in vals.chunks_exact(dims[0]).zip(bytes.chunks_exact_mut(rb)) {
            quants::quantize_row(ty, x, b).expect("quantize");
        }
    }
    let dims: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
    w.add_tensor(name, &dims, ty, bytes).expect("tensor");
}

/// A [`Tiny`] of width 256 and FFN 512 with heads of `head_dim` (Qwen3: 4 heads, the others
/// 256 / head_dim; 2 KV heads from 4 heads up, else 1), written: the device gates' shape
/// (head dims 64 and 128, KV rows of whole q8_0 words).
pub fn tiny_hd(arch: Arch, ty: GgmlType, head_dim: usize) -> PathBuf {
    let mut t = Tiny::new(arch, ty);
    t.d = 256;
    t.ff = 512;
    t.head_dim = head_dim;
    t.n_head = if arch == Arch::Qwen3 {
        4
    } else {
        256 / head_dim
    };
    t.n_head_kv = if t.n_head >= 4 { 2 } else { 1 };
    write(&t)
}

/// Writes the model `t` describes to a fresh temporary file.
pub fn write(t: &Tiny) -> PathBuf {
    write_with(t, "", |_| {})
}

/// Writes the model after `edit` changed the writer; `tag` goes into the file name.
pub fn write_with(t: &Tiny, tag: &str, edit: impl FnOnce(&mut GgufWriter)) -> PathBuf {
    let mut w = GgufWriter::new();
    let a = t.arch.name();
    w.set("general.architecture", Value::String(a.into()));
    let u = |v: usize| Value::U32(v as u32);
    w.set(format!("{a}.block_count"), u(t.layers));
    w.set(format!("{a}.embedding_length"), u(t.d));
    w.set(format!("{a}.feed_forward_length"), u(t.ff));
    w.set(format!("{a}.attention.head_count"), u(t.n_head));
    w.set(format!("{a}.attention.head_count_kv"), u(t.n_head_kv));
    w.set(format!("{a}.context_length"), u(256));
    w.set(
        format!("{a}.attention.layer_norm_rms_epsilon"),
        Value::F32(1e-6),
    );
    w.set(format!("{a}.rope.freq_base"), Value::F32(t.rope_base));
    if t.head_dim * t.n_head != t.d {
        w.set(format!("{a}.attention.key_length"), u(t.head_dim));
        w.set(format!("{a}.attention.value_length"), u(t.head_dim));
    }
    let toks: Vec<String> = (0..t.vocab).map(|i| format!("t{i}")).collect();
    w.set(
        "tokenizer.ggml.tokens",
        Value::Array(Array::String(toks.into())),
    );
    let mut rng = Rng::xorshift64(t.seed);
    let (d, q, kv, ff) = (t.d, t.n_head * t.head_dim, t.n_head_kv * t.head_dim, t.ff);
    let s = |fan_in: usize| 1.5 / (fan_in as f32).sqrt();
    tensor(
        &mut w,
        &mut rng,
        names::TOKEN_EMBD,
        &[d, t.vocab],
        t.ty,
        1.0,
        0.0,
    );
    tensor(&mut w, &mut rng, names::OUTPUT_NORM, &[d], t.ty, 0.2, 1.0);
    if !t.tied {
        tensor(
            &mut w,
            &mut rng,
            names::OUTPUT,
            &[d, t.vocab],
            t.ty,
            s(d),
            0.0,
        );
    }
    for l in 0..t.layers {
        let mut add = |k: Layer, dims: &[usize], scale: f32, off: f32| {
            let ty = match (k, t.mix) {
                (Layer::AttnV | Layer::FfnDown, Some(m)) => m,
                _ => t.ty,
            };
            tensor(&mut w, &mut rng, &k.name(l), dims, ty, scale, off)
        };
        add(Layer::AttnNorm, &[d], 0.2, 1.0);
        add(Layer::AttnQ, &[d, q], s(d), 0.0);
        add(Layer::AttnK, &[d, kv], s(d), 0.0);
        add(Layer::AttnV, &[d, kv], s(d), 0.0);
        if t.arch.has_qkv_bias() {
            add(Layer::AttnQBias, &[q], 0.3, 0.0);
            add(Layer::AttnKBias, &[kv], 0.3, 0.0);
            add(Layer::AttnVBias, &[kv], 0.3, 0.0);
        }
        if t.arch.has_qk_norm() {
            add(Layer::AttnQNorm, &[t.head_dim], 0.2, 1.0);
            add(Layer::AttnKNorm, &[t.head_dim], 0.2, 1.0);
        }
        add(Layer::AttnOutput, &[q, d], s(q), 0.0);
        add(Layer::FfnNorm, &[d], 0.2, 1.0);
        add(Layer::FfnGate, &[d, ff], s(d), 0.0);
        add(Layer::FfnUp, &[d, ff], s(d), 0.0);
        add(Layer::FfnDown, &[ff, d], s(ff), 0.0);
    }
    edit(&mut w);
    let name = format!(
        "{a}-{}{}-{}-{}-{}.gguf",
        t.ty.name(),
        t.mix.map(|m| format!("+{}", m.name())).unwrap_or_default(),
        t.tied,
        t.seed,
        t.rope_base
    );
    let path = tmp(&if tag.is_empty() {
        name
    } else {
        format!("{tag}-{name}")
    });
    w.write_to(&path).expect("write gguf");
    path
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiny_files_are_distinct_and_load() {
        let t = Tiny::new(Arch::Llama, GgmlType::F32);
        let (a, b) = (write(&t), write_with(&t, "tag", |_| {}));
        assert_ne!(a, b);
        assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
        let name = b.file_name().unwrap().to_string_lossy().into_owned();
        assert!(name.contains("-tag-llama-"), "{name}");
        let mut e = engine(&a, 16, GgmlType::F32);
        assert_eq!(e.decode(&[1, 2], 0, 1).unwrap().len(), 40);
    }

    #[test]
    fn synthesized_models_load_and_tokens_are_in_range() {
        let p = model_heads(Arch::Qwen2, 1, 3, 2, 1);
        let mut e = engine(&p, 32, GgmlType::F16);
        let t = tokens(20, 9, 128);
        assert!(t.iter().all(|&x| x < 128));
        let vocab = e.hparams().vocab_size;
        let logits = e.decode(&t, 0, 1).unwrap().to_vec();
        assert_eq!(logits.len(), vocab);
        assert!(max_abs(&logits) > 0.0);
        assert_eq!(max_abs_diff(&logits, &logits), 0.0);
    }
}
