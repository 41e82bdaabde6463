//! Shared by the fusion gates on the emulator (`metal_emu_fusion*.rs`).

#![allow(dead_code)]

use minfer_engine::{Engine, EngineConfig, FusionConfig};
use minfer_gguf::GgmlType;
use minfer_models::Arch;
use minfer_testkit::synth::{self, Tiny};
use std::path::Path;

pub fn engine(path: &Path, backend: &str, cache: GgmlType, fusion: FusionConfig) -> Engine {
    Engine::load(
        path,
        EngineConfig {
            n_ctx: 64,
            threads: 1,
            cache_type: cache,
            backends: vec![backend.into()],
            ..EngineConfig::default()
        }
        .with_fusion(fusion),
    )
    .unwrap()
}

pub fn count(ops: &[(&'static str, usize)], name: &str) -> usize {
    ops.iter().find(|(n, _)| *n == name).map_or(0, |c| c.1)
}

pub const FUSED: [&str; 3] = ["QkvRopeStore", "QkvNormRopeStore", "FfnGateUp"];

fn argmax(v: &[f32]) -> u32 {
    v.iter()
        .enumerate()
        .fold((0, f32::MIN), |b, (i, &x)| if x > b.1 { (i, x) } else { b })
        .0 as u32
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The models of the gate: (arch, weight type, KV type).
pub fn cases() -> Vec<(Arch, GgmlType, GgmlType)> {
    let mut v = Vec::new();
    for arch in Arch::ALL {
        v.push((arch, GgmlType::F32, GgmlType::F32));
        v.push((arch, GgmlType::Q8_0, GgmlType::F16));
        v.push((arch, GgmlType::Q4K, GgmlType::Q8_0));
    }
    v
}

/// Per case: a fused and an unfused Metal engine on the same model; their decode graphs
/// really differ, then the same prompt and 8 greedy decode steps give the same logits bits.
pub fn fused_equals_unfused(cases: &[(Arch, GgmlType, GgmlType)]) {
    for &(arch, ty, cache) in cases {
        let t = Tiny::new(arch, ty);
        let layers = t.layers;
        let path = synth::write(&t);
        let mut fused = engine(&path, "metal-emu", cache, FusionConfig::ALL);
        let mut plain = engine(&path, "metal-emu", cache, FusionConfig::NONE);
        let what = format!("{arch:?} {ty} weights, {cache} KV");

        // The graphs really differ: the decode graph is fused, the unfused one is not, and
        // neither prefill graph is.
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
        for e in [&mut fused, &mut plain] {
            let c = e.nodes_per_backend(1).unwrap();
            assert!(
                c.iter().all(|(n, k)| n == "metal-emu" || *k == 0),
                "{what}: {c:?}"
            );
        }

        compare_decode(&mut fused, &mut plain, &what);
        println!("{what}: fused == unfused over 8 decode steps ({f1:?})");
    }
}

/// The same prompt, then 8 greedy decode steps on both engines: every step's logits bit for
/// bit.
pub fn compare_decode(fused: &mut Engine, plain: &mut Engine, what: &str) {
    compare_decode_with(fused, plain, what, &[1, 5, 9, 3, 33, 7], 8);
}

/// [`compare_decode`] from `prompt` over `steps` decode steps.
pub fn compare_decode_with(
    fused: &mut Engine,
    plain: &mut Engine,
    what: &str,
    prompt: &[u32],
    steps: usize,
) {
    let a = fused.decode(prompt, 0, 1).unwrap().to_vec();
    let b = plain.decode(prompt, 0, 1).unwrap().to_vec();
    assert_eq!(bits(&a), bits(&b), "{what}: prefill");
    let mut next = argmax(&a);
    for step in 0..steps {
        let pos = prompt.len() + step;
        let a = fused.decode(&[next], pos, 1).unwrap().to_vec();
        let b = plain.decode(&[next], pos, 1).unwrap().to_vec();
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
