//! Synthesized models: a GGUF file of any supported architecture and shape with seeded
//! random weights, for tests and benchmarks of shapes we have no real file for.
//!
//! The file is planned first (metadata + tensor entries), then each tensor's bytes are
//! produced row by row from a per-tensor seed, pieces of rows encoded on several threads and
//! written in order (the bytes do not depend on the thread count). [`synthesize`]
//! materializes everything (small models, tests); [`write_synth`] streams straight to disk
//! (7B-class files).

mod parallel;
mod tokenizer;
mod weights;

pub use tokenizer::{builtin_vocab_len, byte_to_unicode};
pub use weights::{tensor_seed, Fill, Rng};

use crate::arch::{names, names::Layer, Arch};
use crate::error::{Error, Result};
use minfer_gguf::{GgmlType, GgufWriter, Metadata, TensorPlan, Value};
use std::num::NonZeroUsize;
use std::path::Path;

/// Everything that determines a synthesized file. Two equal specs give identical bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct SynthSpec {
    pub arch: Arch,
    pub block_count: usize,
    pub embedding_length: usize,
    pub head_count: usize,
    pub head_count_kv: usize,
    /// None: embedding_length / head_count (written as `attention.key_length` for Qwen3, or
    /// whenever it differs from that quotient).
    pub head_dim: Option<usize>,
    pub feed_forward_length: usize,
    /// None: the tokenizer's size (the donor's, or the built-in one's). Must equal the
    /// donor's when one is given; pads the built-in tokenizer otherwise.
    pub vocab_size: Option<usize>,
    pub context_length: usize,
    pub rms_epsilon: f32,
    pub rope_freq_base: f32,
    /// Type of every 2-D weight matrix; 1-D norms and biases are always F32.
    pub weight_type: GgmlType,
    /// Type for a matrix whose row length is not a whole number of `weight_type` blocks
    /// (none: such a matrix is an error naming it).
    pub fallback_type: Option<GgmlType>,
    /// No `output.weight`: the output projection reuses `token_embd.weight`.
    pub tied_embeddings: bool,
    pub seed: u64,
    /// `tokenizer.*` keys copied from a donor (see [`tokenizer_from`]); None: built-in.
    pub tokenizer: Option<Metadata>,
}

impl SynthSpec {
    /// A spec with the architecture's usual epsilon and RoPE base, F32 weights, seed 1 and
    /// the built-in tokenizer.
    pub fn new(
        arch: Arch,
        block_count: usize,
        embedding_length: usize,
        head_count: usize,
        head_count_kv: usize,
        feed_forward_length: usize,
    ) -> SynthSpec {
        let (rms_epsilon, rope_freq_base) = match arch {
            Arch::Qwen2 | Arch::Qwen3 => (1e-6, 1_000_000.0),
            Arch::Llama => (1e-5, 10_000.0),
        };
        SynthSpec {
            arch,
            block_count,
            embedding_length,
            head_count,
            head_count_kv,
            head_dim: None,
            feed_forward_length,
            vocab_size: None,
            context_length: 4096,
            rms_epsilon,
            rope_freq_base,
            weight_type: GgmlType::F32,
            fallback_type: None,
            tied_embeddings: false,
            seed: 1,
            tokenizer: None,
        }
    }

    /// Named shapes: `7b` (Qwen2.5-7B) and `0.5b` (Qwen2.5-0.5B, the demo model).
    pub fn preset(name: &str) -> Result<SynthSpec> {
        let mut s = match name {
            "7b" => SynthSpec::new(Arch::Qwen2, 28, 3584, 28, 4, 18944),
            "0.5b" => SynthSpec::new(Arch::Qwen2, 24, 896, 14, 2, 4864),
            other => {
                return Err(Error::BadSpec(
                    "preset".into(),
                    format!("{other:?} is not a preset (7b, 0.5b)"),
                ))
            }
        };
        s.vocab_size = Some(if name == "7b" { 152064 } else { 151936 });
        s.context_length = 32768;
        Ok(s)
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.embedding_length / self.head_count.max(1))
    }

    fn check(&self) -> Result<()> {
        let bad = |field: &str, problem: String| Err(Error::BadSpec(field.into(), problem));
        for (field, v) in [
            ("block_count", self.block_count),
            ("embedding_length", self.embedding_length),
            ("head_count", self.head_count),
            ("head_count_kv", self.head_count_kv),
            ("feed_forward_length", self.feed_forward_length),
            ("context_length", self.context_length),
            ("head_dim", self.head_dim()),
        ] {
            if v == 0 {
                return bad(field, "is 0".into());
            }
        }
        if !self.head_count.is_multiple_of(self.head_count_kv) {
            return bad(
                "head_count_kv",
                format!(
                    "{} does not divide head_count {}",
                    self.head_count_kv, self.head_count
                ),
            );
        }
        if self.head_dim.is_none() && !self.embedding_length.is_multiple_of(self.head_count) {
            return bad(
                "head_dim",
                format!(
                    "embedding_length {} is not a multiple of head_count {}; give head_dim",
                    self.embedding_length, self.head_count
                ),
            );
        }
        if !self.head_dim().is_multiple_of(2) {
            return bad(
                "head_dim",
                format!("{} is odd (RoPE pairs)", self.head_dim()),
            );
        }
        Ok(())
    }
}

/// Every `tokenizer.*` key of a donor GGUF, for [`SynthSpec::tokenizer`].
pub fn tokenizer_from(path: &Path) -> Result<Metadata> {
    tokenizer::from_donor(path)
}

/// One planned tensor: its entry and how to fill it.
#[derive(Clone, Debug)]
struct Planned {
    plan: TensorPlan,
    fill: Fill,
}

/// The whole file before any weight is generated.
#[derive(Clone, Debug)]
pub struct SynthPlan {
    pub metadata: Metadata,
    tensors: Vec<Planned>,
    seed: u64,
}

impl SynthPlan {
    pub fn tensors(&self) -> impl Iterator<Item = &TensorPlan> {
        self.tensors.iter().map(|t| &t.plan)
    }

    /// Bytes of all tensor data (without padding).
    pub fn data_bytes(&self) -> u64 {
        self.tensors
            .iter()
            .map(|t| t.plan.n_bytes().unwrap_or(0))
            .sum()
    }

    /// Writes tensor `i`'s bytes on `threads` threads, calling `progress(bytes)` as pieces
    /// of it are written.
    fn produce(
        &self,
        i: usize,
        threads: NonZeroUsize,
        out: &mut dyn std::io::Write,
        progress: &mut dyn FnMut(u64),
    ) -> Result<()> {
        let t = &self.tensors[i];
        let row_len = t.plan.dims[0] as usize;
        let rows = t.plan.dims[1..].iter().product::<u64>() as usize;
        let rows =
            weights::TensorRows::new(&t.plan.name, t.plan.ty, row_len, rows, t.fill, self.seed)?;
        weights::write_tensor(&rows, threads, out, progress)
    }
}

/// Plans the file: metadata and tensor entries, every type checked against the shapes.
pub fn plan(spec: &SynthSpec) -> Result<SynthPlan> {
    spec.check()?;
    let tok = match &spec.tokenizer {
        Some(donor) => {
            let n = donor
                .get_array("tokenizer.ggml.tokens")
                .map(|a| a.len())
                .ok_or(Error::MissingKey("tokenizer.ggml.tokens".into()))?;
            if let Some(v) = spec.vocab_size.filter(|&v| v != n) {
                return Err(Error::BadSpec(
                    "vocab_size".into(),
                    format!("{v} differs from the donor tokenizer's {n} tokens"),
                ));
            }
            donor.clone()
        }
        None => tokenizer::builtin(
            spec.arch,
            spec.vocab_size.unwrap_or(tokenizer::builtin_vocab_len()),
        )?,
    };
    let vocab = tok
        .get_array("tokenizer.ggml.tokens")
        .map(|a| a.len())
        .unwrap_or(0);

    let a = spec.arch.name();
    let hd = spec.head_dim();
    let mut md = Metadata::new();
    let mut key = |k: &str, v: Value| md.set(format!("{a}.{k}"), v);
    let u32v = |v: usize| Value::U32(v as u32);
    key("block_count", u32v(spec.block_count));
    key("context_length", u32v(spec.context_length));
    key("embedding_length", u32v(spec.embedding_length));
    key("feed_forward_length", u32v(spec.feed_forward_length));
    key("attention.head_count", u32v(spec.head_count));
    key("attention.head_count_kv", u32v(spec.head_count_kv));
    if spec.arch == Arch::Qwen3 || hd * spec.head_count != spec.embedding_length {
        key("attention.key_length", u32v(hd));
        key("attention.value_length", u32v(hd));
    }
    key(
        "attention.layer_norm_rms_epsilon",
        Value::F32(spec.rms_epsilon),
    );
    key("rope.freq_base", Value::F32(spec.rope_freq_base));
    key("rope.dimension_count", u32v(hd));
    key("vocab_size", u32v(vocab));
    let mut metadata = Metadata::new();
    metadata.set("general.architecture", Value::String(a.into()));
    metadata.set("general.type", Value::String("model".into()));
    metadata.set(
        "general.name",
        Value::String(format!("minfer synth {a} seed {}", spec.seed)),
    );
    for (k, v) in md.iter().chain(tok.iter()) {
        metadata.set(k, v.clone());
    }

    let (e, f) = (
        spec.embedding_length as u64,
        spec.feed_forward_length as u64,
    );
    let (q, kv) = (
        (spec.head_count * hd) as u64,
        (spec.head_count_kv * hd) as u64,
    );
    let mut tensors = Vec::new();
    let matrix = |name: String, dims: [u64; 2]| -> Result<Planned> {
        Ok(Planned {
            plan: TensorPlan {
                ty: matrix_type(spec, &name, dims[0])?,
                name,
                dims: dims.to_vec(),
            },
            fill: Fill::Matrix,
        })
    };
    let vector = |name: String, n: u64, fill: Fill| Planned {
        plan: TensorPlan {
            name,
            dims: vec![n],
            ty: GgmlType::F32,
        },
        fill,
    };
    tensors.push(matrix(names::TOKEN_EMBD.into(), [e, vocab as u64])?);
    for l in 0..spec.block_count {
        tensors.push(vector(Layer::AttnNorm.name(l), e, Fill::Norm));
        tensors.push(matrix(Layer::AttnQ.name(l), [e, q])?);
        tensors.push(matrix(Layer::AttnK.name(l), [e, kv])?);
        tensors.push(matrix(Layer::AttnV.name(l), [e, kv])?);
        if spec.arch.has_qkv_bias() {
            tensors.push(vector(Layer::AttnQBias.name(l), q, Fill::Bias));
            tensors.push(vector(Layer::AttnKBias.name(l), kv, Fill::Bias));
            tensors.push(vector(Layer::AttnVBias.name(l), kv, Fill::Bias));
        }
        if spec.arch.has_qk_norm() {
            tensors.push(vector(Layer::AttnQNorm.name(l), hd as u64, Fill::Norm));
            tensors.push(vector(Layer::AttnKNorm.name(l), hd as u64, Fill::Norm));
        }
        tensors.push(matrix(Layer::AttnOutput.name(l), [q, e])?);
        tensors.push(vector(Layer::FfnNorm.name(l), e, Fill::Norm));
        tensors.push(matrix(Layer::FfnGate.name(l), [e, f])?);
        tensors.push(matrix(Layer::FfnUp.name(l), [e, f])?);
        tensors.push(matrix(Layer::FfnDown.name(l), [f, e])?);
    }
    tensors.push(vector(names::OUTPUT_NORM.into(), e, Fill::Norm));
    if !spec.tied_embeddings {
        tensors.push(matrix(names::OUTPUT.into(), [e, vocab as u64])?);
    }
    Ok(SynthPlan {
        metadata,
        tensors,
        seed: spec.seed,
    })
}

/// The weight type for a matrix whose rows have `row_len` elements: the spec's type when
/// the row is whole blocks of it, else the fallback type if that fits, else an error.
fn matrix_type(spec: &SynthSpec, name: &str, row_len: u64) -> Result<GgmlType> {
    let fits = |ty: GgmlType| ty.row_bytes(row_len).is_some();
    let ty = if fits(spec.weight_type) {
        spec.weight_type
    } else {
        match spec.fallback_type {
            Some(fb) if fits(fb) => fb,
            fb => {
                return Err(Error::RowNotWholeBlocks {
                    tensor: name.into(),
                    row_len,
                    ty: spec.weight_type.name().into(),
                    block: spec.weight_type.block_size(),
                    fallback: fb.map(|t| t.name().to_string()),
                })
            }
        }
    };
    if !weights::can_encode(ty) {
        return Err(Error::UnsupportedWeightType {
            tensor: name.into(),
            ty: ty.name().into(),
        });
    }
    Ok(ty)
}

/// Every CPU the process may use (`std::thread::available_parallelism`; 1 when unknown).
pub fn all_threads() -> NonZeroUsize {
    std::thread::available_parallelism().unwrap_or(NonZeroUsize::MIN)
}

/// The whole model in memory, on one thread (small models; tests build many at once). Fine
/// up to a few hundred MB; use [`write_synth`] beyond.
pub fn synthesize(spec: &SynthSpec) -> Result<GgufWriter> {
    synthesize_threads(spec, NonZeroUsize::MIN)
}

/// [`synthesize`] on `threads` threads: the same bytes for every thread count.
pub fn synthesize_threads(spec: &SynthSpec, threads: NonZeroUsize) -> Result<GgufWriter> {
    let plan = plan(spec)?;
    let mut w = GgufWriter::new();
    w.metadata = plan.metadata.clone();
    for (i, t) in plan.tensors.iter().enumerate() {
        let mut data = Vec::with_capacity(t.plan.n_bytes()? as usize);
        plan.produce(i, threads, &mut data, &mut |_| {})?;
        w.add_tensor(t.plan.name.clone(), &t.plan.dims, t.plan.ty, data)?;
    }
    Ok(w)
}

/// [`write_synth_threads`] on [`all_threads`].
pub fn write_synth(
    spec: &SynthSpec,
    path: &Path,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<SynthPlan> {
    write_synth_threads(spec, path, all_threads(), progress)
}

/// Streams the model to `path` (via `<path>.partial`, renamed when complete), encoding rows
/// on `threads` threads and holding at most two pieces of rows (about 256 KiB each) per
/// thread at a time; the bytes are the same for every thread count.
/// `progress(done_bytes, total_bytes)` is called after each piece written.
pub fn write_synth_threads(
    spec: &SynthSpec,
    path: &Path,
    threads: NonZeroUsize,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<SynthPlan> {
    let plan = plan(spec)?;
    let plans: Vec<TensorPlan> = plan.tensors().cloned().collect();
    let total = plan.data_bytes();
    let mut done = 0u64;
    minfer_gguf::write_streaming(&plan.metadata, &plans, path, |i, out| {
        plan.produce(i, threads, out, &mut |bytes| {
            done += bytes;
            progress(done, total);
        })
    })?;
    Ok(plan)
}
