//! Synthesized models open with the GGUF reader and read back as the spec that made them.

use minfer_gguf::{GgmlType, GgufModel};
use minfer_models::synth::{self, SynthSpec};
use minfer_models::{names, Arch, HParams};
use minfer_testkit::models;
use std::path::PathBuf;

fn temp_file(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("minfer-synth-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(format!("{tag}.gguf"))
}

fn small(arch: Arch) -> SynthSpec {
    let mut s = SynthSpec::new(arch, 2, 64, 4, 2, 96);
    if arch == Arch::Qwen3 {
        // Qwen3's head_dim is independent of embedding / heads.
        s.head_dim = Some(32);
    }
    s.context_length = 512;
    s.seed = 42;
    s
}

fn open(spec: &SynthSpec, tag: &str) -> (GgufModel, PathBuf) {
    let path = temp_file(tag);
    synth::write_synth(spec, &path, &mut |_, _| {}).unwrap();
    (GgufModel::open(&path).unwrap(), path)
}

#[test]
fn hparams_round_trip_for_every_arch() {
    for arch in Arch::ALL {
        let spec = small(arch);
        let (m, path) = open(&spec, arch.name());
        let hp = HParams::from_metadata(m.metadata()).unwrap();
        let want = HParams {
            arch,
            block_count: 2,
            embedding_length: 64,
            feed_forward_length: 96,
            head_count: 4,
            head_count_kv: 2,
            head_dim: if arch == Arch::Qwen3 { 32 } else { 16 },
            context_length: 512,
            rms_epsilon: spec.rms_epsilon,
            rope_freq_base: spec.rope_freq_base,
            rope_scale: 1.0,
            vocab_size: synth::builtin_vocab_len(),
        };
        assert_eq!(hp, want, "{arch:?}");
        let has = |n: &str| m.tensor(n).is_some();
        assert!(has(names::TOKEN_EMBD) && has(names::OUTPUT) && has(names::OUTPUT_NORM));
        assert_eq!(has("blk.1.attn_q.bias"), arch.has_qkv_bias(), "{arch:?}");
        assert_eq!(
            has("blk.1.attn_k_norm.weight"),
            arch.has_qk_norm(),
            "{arch:?}"
        );
        let q = m.tensor("blk.0.attn_q.weight").unwrap();
        assert_eq!(q.info.dims, vec![64, (4 * want.head_dim) as u64]);
        let k = m.tensor("blk.0.attn_k.weight").unwrap();
        assert_eq!(k.info.dims, vec![64, (2 * want.head_dim) as u64]);
        let down = m.tensor("blk.1.ffn_down.weight").unwrap();
        assert_eq!(down.info.dims, vec![96, 64]);
        let per_layer = 9 + 3 * arch.has_qkv_bias() as usize + 2 * arch.has_qk_norm() as usize;
        assert_eq!(m.tensors().len(), 3 + 2 * per_layer, "{arch:?}");
        std::fs::remove_file(path).unwrap();
    }
}

#[test]
fn streamed_file_equals_the_in_memory_writer() {
    let mut spec = small(Arch::Qwen2);
    spec.weight_type = GgmlType::F16;
    let (_, path) = open(&spec, "stream-vs-memory");
    let in_memory = synth::synthesize(&spec).unwrap().to_bytes();
    assert_eq!(std::fs::read(&path).unwrap(), in_memory);
    std::fs::remove_file(path).unwrap();
}

#[test]
fn same_seed_same_bytes_other_seed_other_weights() {
    let spec = small(Arch::Llama);
    let a = synth::synthesize(&spec).unwrap();
    let b = synth::synthesize(&spec).unwrap();
    assert_eq!(a.to_bytes(), b.to_bytes());
    let mut other = spec.clone();
    other.seed = 43;
    let c = synth::synthesize(&other).unwrap();
    // Control: only the weights (and the name, which carries the seed) change.
    assert_eq!(a.tensors.len(), c.tensors.len());
    for (x, y) in a.tensors.iter().zip(&c.tensors) {
        assert_eq!((&x.name, &x.dims, x.ty), (&y.name, &y.dims, y.ty));
        assert_ne!(x.data, y.data, "{}", x.name);
    }
}

#[test]
fn tied_embeddings_drop_the_output_matrix() {
    let mut spec = small(Arch::Qwen2);
    spec.tied_embeddings = true;
    let w = synth::synthesize(&spec).unwrap();
    assert!(w.tensors.iter().all(|t| t.name != names::OUTPUT));
    assert!(w.tensors.iter().any(|t| t.name == names::TOKEN_EMBD));
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn embedding_to_logits_gives_a_unit_spread() {
    // Embedding row → RMSNorm with output_norm → output matrix: the weight scales are chosen
    // so these logits have a standard deviation near 1 (finite and not degenerate).
    let mut spec = small(Arch::Qwen2);
    spec.vocab_size = Some(2048);
    let w = synth::synthesize(&spec).unwrap();
    let get = |n: &str| f32s(&w.tensors.iter().find(|t| t.name == n).unwrap().data);
    let (embd, norm, out) = (
        get(names::TOKEN_EMBD),
        get(names::OUTPUT_NORM),
        get(names::OUTPUT),
    );
    let e = 64;
    let x = &embd[300 * e..301 * e];
    let rms = (x.iter().map(|v| v * v).sum::<f32>() / e as f32 + spec.rms_epsilon).sqrt();
    let h: Vec<f32> = x.iter().zip(&norm).map(|(v, g)| v / rms * g).collect();
    let logits: Vec<f32> = out
        .chunks_exact(e)
        .map(|row| row.iter().zip(&h).map(|(a, b)| a * b).sum())
        .collect();
    assert_eq!(logits.len(), 2048);
    assert!(logits.iter().all(|l| l.is_finite()));
    let mean = logits.iter().sum::<f32>() / 2048.0;
    let sd = (logits.iter().map(|l| (l - mean).powi(2)).sum::<f32>() / 2048.0).sqrt();
    assert!((0.7..1.3).contains(&sd), "logit sd {sd}");
}

#[test]
fn rows_that_are_not_whole_blocks_need_an_explicit_fallback() {
    let mut spec = small(Arch::Qwen2);
    spec.weight_type = GgmlType::Q4K;
    let err = synth::synthesize(&spec).unwrap_err().to_string();
    assert!(
        err.contains("token_embd.weight") && err.contains("Q4_K"),
        "{err}"
    );
    // Control: the same spec with a fallback type is accepted (every row here is 64 or 96).
    spec.fallback_type = Some(GgmlType::F16);
    let w = synth::synthesize(&spec).unwrap();
    assert!(w
        .tensors
        .iter()
        .all(|t| t.dims.len() == 1 || t.ty == GgmlType::F16));
}

#[test]
fn bad_shapes_are_refused_by_name() {
    let mut spec = small(Arch::Llama);
    spec.head_count_kv = 3;
    let err = synth::synthesize(&spec).unwrap_err().to_string();
    assert!(err.contains("head_count_kv"), "{err}");
    let err = SynthSpec::preset("13b").unwrap_err().to_string();
    assert!(err.contains("13b"), "{err}");
}

#[test]
fn donor_tokenizer_is_copied_verbatim() {
    let Some(donor) = models::smol() else { return };
    let mut spec = small(Arch::Qwen2);
    spec.tokenizer = Some(synth::tokenizer_from(&donor).unwrap());
    let (m, path) = open(&spec, "donor");
    let donor = GgufModel::open(&donor).unwrap();
    let mut n = 0;
    for (k, v) in donor
        .metadata()
        .iter()
        .filter(|(k, _)| k.starts_with("tokenizer."))
    {
        assert_eq!(m.metadata().get(k), Some(v), "{k}");
        n += 1;
    }
    assert!(n >= 8, "only {n} tokenizer keys");
    let hp = HParams::from_metadata(m.metadata()).unwrap();
    assert_eq!(hp.vocab_size, 49152);
    assert_eq!(
        m.tensor(names::TOKEN_EMBD).unwrap().info.dims,
        vec![64, 49152]
    );
    // A vocab size that disagrees with the donor is refused.
    spec.vocab_size = Some(1000);
    assert!(synth::synthesize(&spec).is_err());
    std::fs::remove_file(path).unwrap();
}

#[test]
fn every_supported_weight_type_gives_matrices_of_the_intended_spread() {
    // Rows of 256 (the K-quant block) so every type fits. Quantized types come from
    // quantize_row (error of a few % of the RMS for 4-bit types) or from rescaled random
    // blocks (RMS exact up to f16 rounding of the scales): 10% covers both. Control: without
    // the rescale in random_row, Q2_K comes out at RMS 0.025 and this fails.
    let mut spec = SynthSpec::new(Arch::Qwen2, 1, 256, 4, 2, 512);
    for ty in GgmlType::SUPPORTED {
        spec.weight_type = ty;
        let w = synth::synthesize(&spec).unwrap();
        let t = w
            .tensors
            .iter()
            .find(|t| t.name == "blk.0.ffn_up.weight")
            .unwrap();
        assert_eq!(t.ty, ty);
        let row_bytes = ty.row_bytes(256).unwrap() as usize;
        let mut row = vec![0f32; 256];
        let mut sum_sq = 0f64;
        for r in t.data.chunks_exact(row_bytes) {
            minfer_gguf::quants::dequantize_row(ty, r, &mut row).unwrap();
            assert!(row.iter().all(|x| x.is_finite()), "{ty}");
            sum_sq += row.iter().map(|&x| (x as f64).powi(2)).sum::<f64>();
        }
        let rms = (sum_sq / (512.0 * 256.0)).sqrt();
        assert!((rms * 16.0 - 1.0).abs() < 0.1, "{ty}: rms {rms}, want 1/16");
        // Norms stay F32 whatever the weight type.
        let n = w
            .tensors
            .iter()
            .find(|t| t.name == "blk.0.attn_norm.weight")
            .unwrap();
        assert_eq!(n.ty, GgmlType::F32);
    }
}

#[test]
fn the_demo_shape_synthesizes_with_a_fallback_for_896_wide_rows() {
    // Qwen2.5-0.5B's rows of 896 are not whole Q4_K blocks (256); its 4864-wide ffn_down rows are.
    let mut spec = SynthSpec::preset("0.5b").unwrap();
    spec.block_count = 1;
    spec.vocab_size = Some(1024);
    spec.weight_type = GgmlType::Q4K;
    spec.fallback_type = Some(GgmlType::Q5_0);
    let p = synth::plan(&spec).unwrap();
    let ty = |n: &str| p.tensors().find(|t| t.name == n).unwrap().ty;
    assert_eq!(ty("blk.0.ffn_down.weight"), GgmlType::Q4K);
    assert_eq!(ty("blk.0.attn_q.weight"), GgmlType::Q5_0);
    assert_eq!(ty("token_embd.weight"), GgmlType::Q5_0);
}
