//! Tiny synthetic GGUF models for the engine tests (until `minfer_models::synth` lands).
#![allow(dead_code)]

use minfer_gguf::{quants, Array, GgmlType, GgufWriter, Value};
use minfer_models::{names, names::Layer, Arch};
use std::path::PathBuf;

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
            tied: arch == Arch::Qwen3,
            seed: 7,
            rope_base: 10000.0,
        }
    }
}

/// Tests of one process write concurrently: every file gets its own name.
static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
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
    let vals: Vec<f32> = (0..n).map(|_| offset + scale * rng.next()).collect();
    let ty = if dims.len() == 1 { GgmlType::F32 } else { ty };
    let rb = ty.row_bytes(dims[0] as u64).expect("whole blocks") as usize;
    let mut bytes = vec![0u8; rb * (n / dims[0])];
    if let Some(scale_at) = k_quant_scales(ty) {
        // K-quants have no quantizer: random blocks (values within about ±8), with the f16
        // super-block scales shrunk so values spread like the quantizable types' (± `scale`).
        let bs = ty.type_size() as usize;
        bytes = quants::random_blocks(ty, bytes.len() / bs, rng.0);
        rng.next();
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

pub fn write(t: &Tiny) -> PathBuf {
    write_with(t, "", |_| {})
}

/// Writes the model after `edit` changed the writer; `tag` keeps the file name unique.
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
    let mut rng = Rng(t.seed.wrapping_mul(0x9E3779B97F4A7C15) | 1);
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
            tensor(&mut w, &mut rng, &k.name(l), dims, t.ty, scale, off)
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
    let dir = std::env::temp_dir().join("minfer-engine-tests");
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let path = dir.join(format!(
        "{}{}-{}-{}-{}-{}-{}-{}.gguf",
        tag,
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        a,
        t.ty.name(),
        t.tied,
        t.seed,
        t.rope_base,
        std::process::id()
    ));
    w.write_to(&path).expect("write gguf");
    path
}
