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
use minfer_graph::MAX_FUSED_FFN;
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
        let mut e = engine(
            &path,
            "metal-emu",
            GgmlType::F32,
            FusionConfig {
                qkv,
                ffn,
                ..FusionConfig::NONE
            },
        );
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

/// Re-encodes one f32 tensor of the writer as `ty` (the mixed-quant layers of a real
/// Q4_K_M file, where attn_v or ffn_up may differ from their siblings).
fn retype(w: &mut minfer_gguf::GgufWriter, name: &str, ty: GgmlType) {
    let t = w.tensors.iter_mut().find(|t| t.name == name).unwrap();
    assert_eq!(t.ty, GgmlType::F32);
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

#[test]
fn a_layer_whose_weights_do_not_concatenate_keeps_its_chain_and_the_bits() {
    let t = Tiny::new(Arch::Qwen2, GgmlType::F32);
    assert_eq!(t.layers, 2);
    let path = synth::write_with(&t, "mixed", |w| {
        retype(w, "blk.1.attn_v.weight", GgmlType::Q8_0);
        retype(w, "blk.0.ffn_up.weight", GgmlType::Q8_0);
    });
    let mut fused = engine(&path, "metal-emu", GgmlType::F32, FusionConfig::ALL);
    let mut plain = engine(&path, "metal-emu", GgmlType::F32, FusionConfig::NONE);
    let g = fused.ops_in_graph(1).unwrap();
    // Layer 0's QKV and layer 1's FFN fuse; layer 1's QKV and layer 0's FFN keep the chain.
    assert_eq!(count(&g, "QkvRopeStore"), 1, "{g:?}");
    assert_eq!(count(&g, "FfnGateUp"), 1, "{g:?}");
    assert_eq!(count(&g, "KvStore"), 2, "{g:?}");
    assert_eq!(count(&g, "Rope"), 2, "{g:?}");
    assert_eq!(count(&g, "SwiGLU"), 1, "{g:?}");
    fusion_common::compare_decode(&mut fused, &mut plain, "mixed Qwen2");
}

#[test]
fn an_ffn_past_the_cap_is_not_fused() {
    for (ff, fused_ffn) in [(MAX_FUSED_FFN, 2), (MAX_FUSED_FFN + 64, 0)] {
        let mut t = Tiny::new(Arch::Llama, GgmlType::F32);
        t.ff = ff;
        let path = synth::write(&t);
        let mut e = engine(&path, "metal-emu", GgmlType::F32, FusionConfig::ALL);
        let g = e.ops_in_graph(1).unwrap();
        assert_eq!(count(&g, "FfnGateUp"), fused_ffn, "ff {ff}: {g:?}");
        assert_eq!(count(&g, "QkvRopeStore"), 2, "ff {ff}: {g:?}");
    }
}
