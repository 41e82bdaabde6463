//! The fused decode nodes on the Metal executor under the MSL emulator (seed §4.6, §7.3):
//! fused and unfused decode give the same logits bit for bit, for synthetic Qwen2, Qwen3 and
//! LLaMA models, several weight types and every KV type. The unfused engine still runs the
//! fusion pass (its SwiGLU rewrite); only the decode rewrites are off (`EngineConfig::fusion`).
//! Each comparison first checks that the two decode graphs really differ (the fused nodes are
//! there, the chains they replace are not), and that prefill graphs are never fused.

#![cfg(feature = "metal-emu")]

use minfer_engine::{Engine, EngineConfig, FusionConfig};
use minfer_gguf::GgmlType;
use minfer_models::Arch;
use minfer_testkit::synth::{self, Tiny};
use std::path::Path;

fn engine(path: &Path, backend: &str, cache: GgmlType, fusion: FusionConfig) -> Engine {
    Engine::load(
        path,
        EngineConfig {
            n_ctx: 64,
            threads: 1,
            cache_type: cache,
            backends: vec![backend.into()],
            fusion,
            ..EngineConfig::default()
        },
    )
    .unwrap()
}

fn count(ops: &[(&'static str, usize)], name: &str) -> usize {
    ops.iter().find(|(n, _)| *n == name).map_or(0, |c| c.1)
}

const FUSED: [&str; 3] = ["QkvRopeStore", "QkvNormRopeStore", "FfnGateUp"];

fn argmax(v: &[f32]) -> u32 {
    v.iter()
        .enumerate()
        .fold((0, f32::MIN), |b, (i, &x)| if x > b.1 { (i, x) } else { b })
        .0 as u32
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The models of the gate: (arch, weight type, KV type, head dim override).
fn cases() -> Vec<(Arch, GgmlType, GgmlType)> {
    let mut v = Vec::new();
    for arch in Arch::ALL {
        v.push((arch, GgmlType::F32, GgmlType::F32));
        v.push((arch, GgmlType::Q8_0, GgmlType::F16));
        v.push((arch, GgmlType::Q4K, GgmlType::Q8_0));
    }
    v
}

#[test]
fn fused_and_unfused_decode_give_the_same_bits_on_metal() {
    let prompt = [1u32, 5, 9, 3, 33, 7];
    for (arch, ty, cache) in cases() {
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
        let f6 = fused.ops_in_graph(prompt.len()).unwrap();
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

        // The same prompt, then 8 greedy decode steps: every step's logits bit for bit.
        let a = fused.decode(&prompt, 0, 1).unwrap().to_vec();
        let b = plain.decode(&prompt, 0, 1).unwrap().to_vec();
        assert_eq!(bits(&a), bits(&b), "{what}: prefill");
        let mut next = argmax(&a);
        for step in 0..8 {
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
        println!("{what}: fused == unfused over 8 decode steps ({f1:?})");
    }
}

#[test]
fn the_cpu_graph_is_never_fused() {
    for arch in Arch::ALL {
        let path = synth::write(&Tiny::new(arch, GgmlType::Q8_0));
        let mut on = engine(&path, "cpu", GgmlType::F32, FusionConfig::ALL);
        let mut off = engine(&path, "cpu", GgmlType::F32, FusionConfig::NONE);
        let (a, b) = (on.ops_in_graph(1).unwrap(), off.ops_in_graph(1).unwrap());
        assert_eq!(
            a, b,
            "{arch:?}: the CPU's decode graph changed with fusion on"
        );
        for f in FUSED {
            assert_eq!(count(&a, f), 0, "{arch:?}: {a:?}");
        }
        // Control: the same model on Metal with fusion on does get the fused nodes.
        let mut m = engine(&path, "metal-emu", GgmlType::F32, FusionConfig::ALL);
        let g = m.ops_in_graph(1).unwrap();
        assert!(
            count(&g, "FfnGateUp") > 0 && a != g,
            "{arch:?}: metal {g:?}"
        );
    }
}

#[test]
fn each_decode_fusion_switches_off_on_its_own() {
    let path = synth::write(&Tiny::new(Arch::Qwen2, GgmlType::F32));
    let only = |qkv, ffn| {
        let mut e = engine(&path, "metal-emu", GgmlType::F32, FusionConfig { qkv, ffn });
        e.ops_in_graph(1).unwrap()
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
