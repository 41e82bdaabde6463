//! The fused decode nodes on the Metal executor under the MSL emulator (seed §4.6, §7.3):
//! fused and unfused decode give the same logits bit for bit, for synthetic Qwen2, Qwen3 and
//! LLaMA models, several weight types and every KV type. The unfused engine still runs the
//! fusion pass (its SwiGLU rewrite); only the decode rewrites are off (`EngineConfig::fusion`).
//! Each comparison first checks that the two decode graphs really differ (the fused nodes are
//! there, the chains they replace are not), and that prefill graphs are never fused.

#![cfg(feature = "metal-emu")]

mod fusion_common;

use fusion_common::{cases, count, engine, fused_equals_unfused, FUSED};
use minfer_engine::FusionConfig;
use minfer_gguf::GgmlType;
use minfer_models::Arch;
use minfer_testkit::synth::{self, Tiny};

#[test]
fn fused_and_unfused_decode_give_the_same_bits_on_metal() {
    fused_equals_unfused(&cases());
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
