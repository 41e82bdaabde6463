//! The graph path against the plain f64 reference forward on tiny synthetic models of all
//! three architectures (prefill with every row's logits, then token-by-token decode).
//!
//! Tolerances, named before asserting:
//! - F32 weights: the same math in f32 (graph) vs f64 (reference), over a 256-token sequence
//!   (an angle error grows with the position); the error scales with the logits, so the bound
//!   is relative to their RMS: `F32_REL_TOL` = 4e-6 of the RMS. Measured (2026-12-01): Qwen2
//!   8.6e-7 / rms 0.87 = 1.0e-6, Qwen3 6.8e-6 / 6.2 = 1.1e-6, Llama 7.5e-7 / 0.86 = 0.9e-6;
//!   the bound is 3.6x the worst.
//! - Quantized weights: the CPU quantizes activations to Q8 (as llama.cpp does) while the
//!   reference multiplies the dequantized weights by exact activations. Measured max |dlogit|
//!   0.1%–5.7% of the logits' RMS on these random models (with f32 activations instead, the
//!   same runs pass the F32 bound: the Q8 activations are the whole cause); asserted at
//!   `Q8_ACT_REL_TOL` = 8% of the RMS.
//!
//! Controls: the reference of a model that differs only in `rope.freq_base` fails the F32
//! bound, by orders of magnitude for 1e6 against 1e4 (`the_gate_catches_a_wrong_rope_base`)
//! and by 35x or more for a base off by 1e-4 relative (`..._off_by_1e_4`: 1.4e-4 to 1.5e-4 of
//! the RMS; planted in the CPU kernel instead, `(p.freq_base * 1.0001)` in `ops/rope.rs`, the
//! same figures; with the 9-token sequence this gate had before, 5.2e-5 absolute against a
//! 1e-3 bound, issue 19). Also tried by hand: swapping the RoPE pairing in the CPU kernel
//! fails every architecture.

use minfer_engine::{Engine, EngineConfig};
use minfer_gguf::{GgmlType, GgufModel};
use minfer_models::{reference, Arch, HParams};
use minfer_testkit::synth::{self, Tiny};
use std::path::Path;

const F32_REL_TOL: f64 = 4e-6;
const Q8_ACT_REL_TOL: f64 = 0.08;

/// (max |dlogit|, RMS of the reference logits) of the engine on `model` against the
/// reference forward of `oracle`.
fn max_diff(model: &Path, oracle: &Path, cfg: EngineConfig, tokens: &[u32]) -> (f64, f64) {
    let gguf = GgufModel::open(oracle).unwrap();
    let hp = HParams::from_metadata(gguf.metadata()).unwrap();
    let want = reference::forward(&gguf, &hp, tokens).unwrap();
    let mut e = Engine::load(model, cfg).unwrap();
    let vocab = hp.vocab_size;
    let scale =
        (want.iter().flatten().map(|v| v * v).sum::<f64>() / (want.len() * vocab) as f64).sqrt();
    let mut worst = 0f64;
    // Prefill all but the last 3 tokens with every row's logits, then decode one by one.
    let split = tokens.len() - 3;
    let got = e.decode(&tokens[..split], 0, split).unwrap().to_vec();
    for (r, row) in got.chunks_exact(vocab).enumerate() {
        for (a, b) in row.iter().zip(&want[r]) {
            worst = worst.max((*a as f64 - b).abs());
        }
    }
    for (i, &t) in tokens[split..].iter().enumerate() {
        let p = split + i;
        let got = e.decode(&[t], p, 1).unwrap();
        for (a, b) in got.iter().zip(&want[p]) {
            worst = worst.max((*a as f64 - b).abs());
        }
    }
    (worst, scale)
}

const TOKENS: [u32; 9] = [1, 5, 9, 3, 33, 7, 2, 0, 39];

/// The F32 gate's sequence: long enough that an angle error growing with the position shows.
fn long_tokens() -> Vec<u32> {
    (0..LONG_LEN as u32)
        .map(|i| (i * 7 + 3 + i / 40) % 40)
        .collect()
}
const LONG_LEN: usize = 256;

#[test]
fn f32_weights_match_the_reference_for_every_arch() {
    for arch in Arch::ALL {
        let path = synth::write(&Tiny::new(arch, GgmlType::F32));
        let cfg = EngineConfig {
            n_ctx: LONG_LEN,
            threads: 2,
            ..Default::default()
        };
        let (d, rms) = max_diff(&path, &path, cfg, &long_tokens());
        eprintln!(
            "{arch:?} F32: max |dlogit| = {d:.3e} = {:.2e} of rms {rms:.3} (bound {F32_REL_TOL:.0e})",
            d / rms
        );
        assert!(d < F32_REL_TOL * rms, "{arch:?}: {d} vs rms {rms}");
    }
}

#[test]
fn q8_0_weights_and_kv_caches_match_the_reference() {
    for arch in Arch::ALL {
        let path = synth::write(&Tiny::new(arch, GgmlType::Q8_0));
        for cache in [GgmlType::F32, GgmlType::F16, GgmlType::Q8_0] {
            if cache == GgmlType::Q8_0
                && !Tiny::new(arch, GgmlType::Q8_0).head_dim.is_multiple_of(32)
            {
                continue;
            }
            let cfg = EngineConfig {
                n_ctx: 32,
                threads: 2,
                cache_type: cache,
                ..Default::default()
            };
            let (d, rms) = max_diff(&path, &path, cfg, &TOKENS);
            eprintln!("{arch:?} Q8_0 weights, {cache} KV: max |dlogit| = {d:.3e} ({:.1}% of rms {rms:.3})", 100.0 * d / rms);
            assert!(
                d < Q8_ACT_REL_TOL * rms,
                "{arch:?} {cache}: {d} vs rms {rms}"
            );
        }
    }
}

/// (max |dlogit|, rms) of the engine on the F32 model against the reference of the same
/// model with `rope_base` instead of 1e4, over the long sequence.
fn with_reference_base(arch: Arch, rope_base: f32) -> (f64, f64) {
    let t = Tiny::new(arch, GgmlType::F32);
    let path = synth::write(&t);
    let other = synth::write(&Tiny { rope_base, ..t });
    let cfg = EngineConfig {
        n_ctx: LONG_LEN,
        threads: 2,
        ..Default::default()
    };
    max_diff(&path, &other, cfg, &long_tokens())
}

#[test]
fn the_gate_catches_a_wrong_rope_base() {
    for arch in Arch::ALL {
        let (d, rms) = with_reference_base(arch, 1e6);
        eprintln!("{arch:?} control: max |dlogit| = {d:.3e} (rms {rms:.3})");
        assert!(
            d > 100.0 * F32_REL_TOL * rms,
            "{arch:?}: the control did not fail the gate ({d})"
        );
    }
}

#[test]
fn the_gate_catches_a_rope_base_off_by_1e_4() {
    for arch in Arch::ALL {
        let (d, rms) = with_reference_base(arch, 10_001.0);
        eprintln!(
            "{arch:?} base 10001 control: max |dlogit| = {d:.3e} = {:.2e} of rms {rms:.3}",
            d / rms
        );
        assert!(
            d > 10.0 * F32_REL_TOL * rms,
            "{arch:?}: a base off by 1e-4 stays within 10x the bound ({d} vs rms {rms})"
        );
    }
}

#[test]
fn every_weight_type_of_the_demo_models_matches_the_reference() {
    // Q4_1 (SmolLM2), Q5_0/Q4_K/Q6_K (Qwen2.5 Q4_K_M), Q4_0 and Q5_K for good measure; the
    // activation format differs per type (Q8_0, Q8_1, Q8_K), the bound is the same.
    let types = [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q6K,
    ];
    for (i, ty) in types.into_iter().enumerate() {
        let arch = Arch::ALL[i % 3];
        let path = synth::write(&Tiny::new(arch, ty));
        let cfg = EngineConfig {
            n_ctx: 32,
            threads: 2,
            ..Default::default()
        };
        let (d, rms) = max_diff(&path, &path, cfg, &TOKENS);
        eprintln!(
            "{arch:?} {ty}: max |dlogit| = {d:.3e} ({:.1}% of rms {rms:.3})",
            100.0 * d / rms
        );
        assert!(d < Q8_ACT_REL_TOL * rms, "{arch:?} {ty}: {d} vs rms {rms}");
    }
}
