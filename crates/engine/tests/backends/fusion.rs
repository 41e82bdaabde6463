//! The fused decode nodes against the unfused chain on the same backend (seed §4.6, §7.3):
//! fused and unfused decode give the same logits bit for bit. Each comparison first checks
//! that the two decode graphs really differ (the fused nodes are there, the chains they
//! replace are not). The unfused engine still runs the fusion pass (its SwiGLU rewrite);
//! only the decode rewrites are off (`EngineConfig::fusion`).
//!
//! Per row, what fuses differs and is checked as such:
//! - Metal: `QkvRopeStore` (`QkvNormRopeStore` for Qwen3's per-head norm) and `FfnGateUp`
//!   in every layer; prefill graphs never fuse; synthetic Qwen2, Qwen3 and LLaMA models,
//!   several weight types and every KV type, 8 decode steps; also with every weight copied to
//!   the device (the copy path of the concatenations) and on the cached demo models.
//! - CUDA: `FfnGateUp` (gate, up and SwiGLU in one launch), `QkvRopeStore` (Q/K/V, bias,
//!   RoPE and the KV stores in two), both with the input RMSNorm folded in, and `MatMulAdd`
//!   (a projection plus the residual); Qwen3's per-head norm keeps its Q/K/V unfused on
//!   CUDA; f16 and q8_0 KV, 11 decode steps as generation rows.

use super::*;
use minfer_engine::FusionConfig;
use minfer_graph::MAX_FUSED_FFN;
use minfer_models::Arch;
use minfer_testkit::logits::{argmax, bits};
use minfer_testkit::models::{self, QWEN, SMOL};
use minfer_testkit::synth::{self, Tiny};
use std::path::PathBuf;

use GgmlType as T;

fn engine(
    path: &Path,
    backend: &str,
    (n_ctx, threads): (usize, usize),
    cache: GgmlType,
    fusion: FusionConfig,
) -> Engine {
    Engine::load(
        path,
        EngineConfig {
            n_ctx,
            threads,
            cache_type: cache,
            backends: vec![backend.into()],
            ..EngineConfig::default()
        }
        .with_fusion(fusion),
    )
    .unwrap()
}

/// The Metal row's engines (as the emulator's fusion gates loaded them).
fn metal(path: &Path, row: &Row, cache: GgmlType, fusion: FusionConfig) -> Engine {
    engine(path, &row.backend(), (64, 1), cache, fusion)
}

fn count(ops: &[(&'static str, usize)], name: &str) -> usize {
    ops.iter().find(|(n, _)| *n == name).map_or(0, |c| c.1)
}

const FUSED: [&str; 3] = ["QkvRopeStore", "QkvNormRopeStore", "FfnGateUp"];

/// A row's fusion gate.
pub struct Fused {
    /// The models: (arch, weight type, KV type).
    pub cases: fn() -> Vec<(Arch, GgmlType, GgmlType)>,
    /// The model file of a case and its layer count.
    pub model: fn(Arch, GgmlType) -> (PathBuf, usize),
    /// Context and CPU threads of the engines.
    pub load: (usize, usize),
    /// Checks the fused and unfused engines' graphs (arch, layers, what).
    pub graphs: fn(&mut Engine, &mut Engine, Arch, usize, &str, &str),
    pub prompt: &'static [u32],
    /// Decode steps after the prompt, and whether they run as generation rows.
    pub steps: usize,
    pub generated: bool,
}

fn fused_equals_unfused(row: &Row, c: &Fused) {
    let backend = row.backend();
    for (arch, ty, cache) in (c.cases)() {
        let (path, layers) = (c.model)(arch, ty);
        let mut fused = engine(&path, &backend, c.load, cache, FusionConfig::ALL);
        let mut plain = engine(&path, &backend, c.load, cache, FusionConfig::NONE);
        let what = format!("{arch:?} {ty} weights, {cache} KV");
        (c.graphs)(&mut fused, &mut plain, arch, layers, &backend, &what);
        compare_decode(
            &mut fused,
            &mut plain,
            &what,
            c.prompt,
            c.steps,
            c.generated,
        );
        println!("{what}: fused == unfused over {} decode steps", c.steps);
    }
}

/// The same prompt, then `steps` greedy decode steps on both engines: every step's logits
/// bit for bit.
fn compare_decode(
    fused: &mut Engine,
    plain: &mut Engine,
    what: &str,
    prompt: &[u32],
    steps: usize,
    generated: bool,
) {
    let a = fused.decode(prompt, 0, 1).unwrap().to_vec();
    let b = plain.decode(prompt, 0, 1).unwrap().to_vec();
    assert_eq!(bits(&a), bits(&b), "{what}: prefill");
    let mut next = argmax(&a);
    for step in 0..steps {
        let pos = prompt.len() + step;
        let (a, b) = if generated {
            (
                fused.decode_generated(&[next], pos, 1),
                plain.decode_generated(&[next], pos, 1),
            )
        } else {
            (fused.decode(&[next], pos, 1), plain.decode(&[next], pos, 1))
        };
        let (a, b) = (a.unwrap().to_vec(), b.unwrap().to_vec());
        let diff = a.iter().zip(&b).filter(|(x, y)| x.to_bits() != y.to_bits());
        assert_eq!(
            diff.count(),
            0,
            "{what}: decode step {step} differs (max |d| {:e})",
            a.iter()
                .zip(&b)
                .fold(0f32, |m, (x, y)| m.max((x - y).abs()))
        );
        assert!(a.iter().all(|x| x.is_finite()), "{what}: step {step}");
        next = argmax(&a);
    }
}

fn metal_cases() -> Vec<(Arch, GgmlType, GgmlType)> {
    let mut v = Vec::new();
    for arch in Arch::ALL {
        v.push((arch, T::F32, T::F32));
        v.push((arch, T::Q8_0, T::F16));
        v.push((arch, T::Q4K, T::Q8_0));
    }
    v
}

fn metal_model(arch: Arch, ty: GgmlType) -> (PathBuf, usize) {
    let t = Tiny::new(arch, ty);
    (synth::write(&t), t.layers)
}

/// Metal: the decode graph is fused in every layer, the unfused one is not, neither prefill
/// graph is, and every node is on Metal.
fn metal_graphs(
    fused: &mut Engine,
    plain: &mut Engine,
    arch: Arch,
    layers: usize,
    backend: &str,
    what: &str,
) {
    let (f1, p1) = (
        fused.ops_in_graph(1).unwrap(),
        plain.ops_in_graph(1).unwrap(),
    );
    let qkv = if arch == Arch::Qwen3 {
        "QkvNormRopeStore"
    } else {
        "QkvRopeStore"
    };
    assert_eq!(count(&f1, qkv), layers, "{what}: fused decode {f1:?}");
    assert_eq!(
        count(&f1, "FfnGateUp"),
        layers,
        "{what}: fused decode {f1:?}"
    );
    for gone in ["KvStore", "Rope", "Silu", "SwiGLU"] {
        assert_eq!(count(&f1, gone), 0, "{what}: {gone} left in {f1:?}");
    }
    for f in FUSED {
        assert_eq!(count(&p1, f), 0, "{what}: unfused decode {p1:?}");
    }
    assert_eq!(count(&p1, "KvStore"), 2 * layers, "{what}: {p1:?}");
    assert_eq!(count(&p1, "SwiGLU"), layers, "{what}: {p1:?}");
    let f6 = fused.ops_in_graph(6).unwrap();
    for f in FUSED {
        assert_eq!(count(&f6, f), 0, "{what}: fused prefill {f6:?}");
    }
    for e in [fused, plain] {
        let c = e.nodes_per_backend(1).unwrap();
        assert!(
            c.iter().all(|(n, k)| n == backend || *k == 0),
            "{what}: {c:?}"
        );
    }
    println!("{what}: fused decode {f1:?}");
}

const METAL_FUSED: Fused = Fused {
    cases: metal_cases,
    model: metal_model,
    load: (64, 1),
    graphs: metal_graphs,
    prompt: &[1, 5, 9, 3, 33, 7],
    steps: 8,
    generated: false,
};

/// Every weight copied to the device: Q8_0 weights, f32 KV.
fn copy_cases() -> Vec<(Arch, GgmlType, GgmlType)> {
    Arch::ALL
        .into_iter()
        .map(|a| (a, T::Q8_0, T::F32))
        .collect()
}

fn cuda_cases() -> Vec<(Arch, GgmlType, GgmlType)> {
    vec![
        (Arch::Qwen2, T::Q8_0, T::F16),
        (Arch::Qwen2, T::Q4K, T::Q8_0),
        (Arch::Qwen2, T::Q4K, T::F16),
        (Arch::Llama, T::Q4K, T::F16),
        (Arch::Llama, T::Q6K, T::F32),
        (Arch::Qwen3, T::Q5_0, T::F16),
    ]
}

fn cuda_model(arch: Arch, ty: GgmlType) -> (PathBuf, usize) {
    (synth::tiny_hd(arch, ty, 64), 2)
}

/// CUDA: FfnGateUp, MatMulAdd and fewer RmsNorm nodes in the fused graph only; QkvRopeStore
/// too except for Qwen3.
fn cuda_graphs(f: &mut Engine, u: &mut Engine, arch: Arch, _: usize, _: &str, what: &str) {
    let count = |e: &mut Engine, op: &str| count(&e.ops_in_graph(1).unwrap(), op);
    let ffn = (count(f, "FfnGateUp"), count(u, "FfnGateUp"));
    let qkv = (count(f, "QkvRopeStore"), count(u, "QkvRopeStore"));
    let add = (count(f, "MatMulAdd"), count(u, "MatMulAdd"));
    let norm = (count(f, "RmsNorm"), count(u, "RmsNorm"));
    println!(
        "{what}: FfnGateUp {ffn:?}, QkvRopeStore {qkv:?}, MatMulAdd {add:?}, RmsNorm {norm:?} \
         (fused, unfused)"
    );
    assert!(ffn.0 > 0 && ffn.1 == 0, "{arch:?}: FfnGateUp {ffn:?}");
    // Both residual Adds of every layer fold into their projections, and the FFN norm
    // (and the attention norm where Q/K/V fuses) into the fused node.
    assert!(add.0 > 0 && add.1 == 0, "{arch:?}: MatMulAdd {add:?}");
    assert!(norm.0 < norm.1, "{arch:?}: RmsNorm {norm:?}");
    if arch == Arch::Qwen3 {
        assert_eq!(qkv, (0, 0), "Qwen3's Q/K/V stays unfused on CUDA");
    } else {
        assert!(qkv.0 > 0 && qkv.1 == 0, "{arch:?}: QkvRopeStore {qkv:?}");
    }
}

/// The copy path: with `MINFER_WEIGHT_COPY=1` each weight is its own buffer, so every
/// concatenation copies (the mapped synthetic models lay q|k|v and gate|up back to back, so
/// the plain gate takes the in-place path). The variable must be set before any backend
/// exists and nothing else may run beside it, so the case re-runs itself alone in a child
/// process of this binary with the variable set from its start.
fn with_copied_weights(row: &Row, c: &Fused) {
    const NAME: &str = "fusion::fused_and_unfused_decode_give_the_same_bits_with_copied_weights";
    if std::env::var("MINFER_WEIGHT_COPY").as_deref() == Ok("1") {
        return fused_equals_unfused(row, c);
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([&format!("{NAME}::metal_emu"), "--exact", "--nocapture"])
        .arg("--test-threads=1")
        .env("MINFER_WEIGHT_COPY", "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    println!("{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the child run failed");
    // Control: the child really ran the case (a renamed test would run none and pass).
    assert!(text.contains("test result: ok. 1 passed"), "{text}");
}

fn the_cpu_graph_is_never_fused(row: &Row, _: &()) {
    for arch in Arch::ALL {
        let path = synth::write(&Tiny::new(arch, T::Q8_0));
        let mut on = engine(&path, "cpu", (64, 1), T::F32, FusionConfig::ALL);
        let mut off = engine(&path, "cpu", (64, 1), T::F32, FusionConfig::NONE);
        let (a, b) = (on.ops_in_graph(1).unwrap(), off.ops_in_graph(1).unwrap());
        assert_eq!(
            a, b,
            "{arch:?}: the CPU's decode graph changed with fusion on"
        );
        for f in FUSED {
            assert_eq!(count(&a, f), 0, "{arch:?}: {a:?}");
        }
        // Control: the same model on Metal with fusion on does get the fused nodes.
        let mut m = metal(&path, row, T::F32, FusionConfig::ALL);
        let g = m.ops_in_graph(1).unwrap();
        assert!(
            count(&g, "FfnGateUp") > 0 && a != g,
            "{arch:?}: metal {g:?}"
        );
    }
}

fn each_decode_fusion_switches_off_on_its_own(row: &Row, _: &()) {
    let path = synth::write(&Tiny::new(Arch::Qwen2, T::F32));
    let only = |qkv, ffn| {
        let fusion = FusionConfig {
            qkv,
            ffn,
            ..FusionConfig::NONE
        };
        metal(&path, row, T::F32, fusion).ops_in_graph(1).unwrap()
    };
    let (q, f) = (only(true, false), only(false, true));
    assert!(
        count(&q, "QkvRopeStore") > 0 && count(&q, "FfnGateUp") == 0,
        "{q:?}"
    );
    assert!(
        count(&f, "QkvRopeStore") == 0 && count(&f, "FfnGateUp") > 0,
        "{f:?}"
    );
}

/// Re-encodes one f32 tensor of the writer as `ty` (the mixed-quant layers of a real
/// Q4_K_M file, where attn_v or ffn_up may differ from their siblings).
fn retype(w: &mut minfer_gguf::GgufWriter, name: &str, ty: GgmlType) {
    let t = w.tensors.iter_mut().find(|t| t.name == name).unwrap();
    assert_eq!(t.ty, T::F32);
    let v: Vec<f32> = t
        .data
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let row = t.dims[0] as usize;
    let rb = ty.row_bytes(row as u64).unwrap() as usize;
    let mut out = vec![0u8; rb * (v.len() / row)];
    for (x, o) in v.chunks_exact(row).zip(out.chunks_exact_mut(rb)) {
        minfer_gguf::quants::quantize_row(ty, x, o).unwrap();
    }
    t.ty = ty;
    t.data = out;
}

fn a_layer_whose_weights_do_not_concatenate(row: &Row, _: &()) {
    let t = Tiny::new(Arch::Qwen2, T::F32);
    assert_eq!(t.layers, 2);
    let path = synth::write_with(&t, "mixed", |w| {
        retype(w, "blk.1.attn_v.weight", T::Q8_0);
        retype(w, "blk.0.ffn_up.weight", T::Q8_0);
    });
    let mut fused = metal(&path, row, T::F32, FusionConfig::ALL);
    let mut plain = metal(&path, row, T::F32, FusionConfig::NONE);
    let g = fused.ops_in_graph(1).unwrap();
    // Layer 0's QKV and layer 1's FFN fuse; layer 1's QKV and layer 0's FFN keep the chain.
    assert_eq!(count(&g, "QkvRopeStore"), 1, "{g:?}");
    assert_eq!(count(&g, "FfnGateUp"), 1, "{g:?}");
    assert_eq!(count(&g, "KvStore"), 2, "{g:?}");
    assert_eq!(count(&g, "Rope"), 2, "{g:?}");
    assert_eq!(count(&g, "SwiGLU"), 1, "{g:?}");
    let prompt = METAL_FUSED.prompt;
    compare_decode(&mut fused, &mut plain, "mixed Qwen2", prompt, 8, false);
}

fn an_ffn_past_the_cap_is_not_fused(row: &Row, _: &()) {
    for (ff, fused_ffn) in [(MAX_FUSED_FFN, 2), (MAX_FUSED_FFN + 64, 0)] {
        let mut t = Tiny::new(Arch::Llama, T::F32);
        t.ff = ff;
        let path = synth::write(&t);
        let mut e = metal(&path, row, T::F32, FusionConfig::ALL);
        let g = e.ops_in_graph(1).unwrap();
        assert_eq!(count(&g, "FfnGateUp"), fused_ffn, "ff {ff}: {g:?}");
        assert_eq!(count(&g, "QkvRopeStore"), 2, "ff {ff}: {g:?}");
    }
}

/// The real demo models (skipped when absent). SmolLM2-135M (LLaMA, Q4_1) fuses every
/// layer; Qwen2.5-Coder-0.5B Q4_K_M mixes types inside layers (q4_K q/k beside a q6_K v in
/// some layers), so those layers keep the unfused chain inside the fused graph. Slow on the
/// emulator (about 20 s for SmolLM2, more for Qwen).
fn on_the_demo_models(row: &Row, _: &()) {
    for file in [SMOL, QWEN] {
        let Some(path) = models::find(file) else {
            continue;
        };
        let t0 = std::time::Instant::now();
        let mut fused = metal(&path, row, T::F32, FusionConfig::ALL);
        let mut plain = metal(&path, row, T::F32, FusionConfig::NONE);
        let layers = fused.hparams().block_count;
        let g = fused.ops_in_graph(1).unwrap();
        let p = plain.ops_in_graph(1).unwrap();
        let (qkv, ffn) = (count(&g, "QkvRopeStore"), count(&g, "FfnGateUp"));
        println!("{file}: {layers} layers, {qkv} fused QKV, {ffn} fused FFN; fused {g:?}");
        assert!(qkv > 0 && ffn > 0, "{file}: {g:?}");
        // Every layer either fused its QKV or kept its two stores.
        assert_eq!(count(&g, "KvStore"), 2 * (layers - qkv), "{file}: {g:?}");
        assert_eq!(count(&p, "KvStore"), 2 * layers, "{file}: {p:?}");
        // Qwen's unfused 6-token prefill outlasts the emulator's 10 s submit bound (a GEMM
        // over 4864 rows): its prompt is one token, so every step there is a decode step.
        let prompt: &[u32] = if file == QWEN {
            &[9]
        } else {
            &[1, 5, 9, 3, 33, 7]
        };
        compare_decode(&mut fused, &mut plain, file, prompt, 3, false);
        println!(
            "{file}: fused == unfused ({:.1} s)",
            t0.elapsed().as_secs_f64()
        );
    }
}

for_each_backend! {
    fused_and_unfused_decode_give_the_same_bits: fused_equals_unfused {
        metal_emu => METAL_FUSED,
        cuda => Fused {
            cases: cuda_cases,
            model: cuda_model,
            // As cuda.rs loaded them: the default threads (the physical cores).
            load: (160, 0),
            graphs: cuda_graphs,
            prompt: &crate::models::TOKENS,
            steps: 11,
            generated: true,
        },
    }
    fused_and_unfused_decode_give_the_same_bits_with_copied_weights: with_copied_weights {
        metal_emu => Fused { cases: copy_cases, ..METAL_FUSED },
    }
    fused_and_unfused_decode_give_the_same_bits_on_the_demo_models: on_the_demo_models {
        metal_emu => (),
    }
    the_cpu_graph_is_never_fused: the_cpu_graph_is_never_fused { metal_emu => () }
    each_decode_fusion_switches_off_on_its_own: each_decode_fusion_switches_off_on_its_own {
        metal_emu => (),
    }
    a_layer_whose_weights_do_not_concatenate_keeps_its_chain_and_the_bits:
        a_layer_whose_weights_do_not_concatenate { metal_emu => () }
    an_ffn_past_the_cap_is_not_fused: an_ffn_past_the_cap_is_not_fused { metal_emu => () }
}
