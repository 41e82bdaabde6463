//! The fusion gate on the real demo models under the emulator (skipped when absent): fused
//! and unfused decode on Metal give the same logits bits. SmolLM2-135M (LLaMA, Q4_1) fuses
//! every layer; Qwen2.5-Coder-0.5B Q4_K_M mixes types inside layers (q4_K q/k beside a q6_K
//! v in some layers), so those layers keep the unfused chain inside the fused graph.
//! Slow on the emulator (about 20 s for SmolLM2, more for Qwen).

#![cfg(feature = "metal-emu")]

mod fusion_common;

use fusion_common::{count, engine};
use minfer_engine::FusionConfig;
use minfer_gguf::GgmlType;
use minfer_testkit::models::{self, QWEN, SMOL};

#[test]
fn fused_and_unfused_decode_give_the_same_bits_on_the_demo_models() {
    for file in [SMOL, QWEN] {
        let Some(path) = models::find(file) else {
            continue;
        };
        let t0 = std::time::Instant::now();
        let mut fused = engine(&path, "metal-emu", GgmlType::F32, FusionConfig::ALL);
        let mut plain = engine(&path, "metal-emu", GgmlType::F32, FusionConfig::NONE);
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
        fusion_common::compare_decode_with(&mut fused, &mut plain, file, prompt, 3);
        println!(
            "{file}: fused == unfused ({:.1} s)",
            t0.elapsed().as_secs_f64()
        );
    }
}
