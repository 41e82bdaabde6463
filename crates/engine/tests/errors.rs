//! Typed refusals at load and decode, and graph reuse across decode steps.

use minfer_engine::{Engine, EngineConfig, Error};
use minfer_gguf::{GgmlType, Value};
use minfer_models::Arch;
use minfer_testkit::synth::{self, Tiny};

fn cfg() -> EngineConfig {
    EngineConfig {
        n_ctx: 16,
        threads: 1,
        ..Default::default()
    }
}

#[test]
fn other_architectures_are_refused_by_name() {
    let t = Tiny::new(Arch::Llama, GgmlType::F32);
    let p = synth::write_with(&t, "gemma", |w| {
        w.set("general.architecture", Value::String("gemma".into()));
    });
    let e = Engine::load(&p, cfg()).err().unwrap();
    assert!(
        e.to_string().contains("Unsupported architecture: 'gemma'"),
        "{e}"
    );
}

#[test]
fn missing_and_misshapen_tensors_are_named() {
    let t = Tiny::new(Arch::Qwen2, GgmlType::F32);
    let p = synth::write_with(&t, "nobias", |w| {
        w.tensors.retain(|x| x.name != "blk.1.attn_k.bias")
    });
    let e = Engine::load(&p, cfg()).err().unwrap();
    assert!(
        matches!(&e, Error::Model(minfer_models::Error::MissingTensor { name }) if name == "blk.1.attn_k.bias"),
        "{e}"
    );
    let p = synth::write_with(&t, "shape", |w| {
        let x = w
            .tensors
            .iter_mut()
            .find(|x| x.name == "blk.0.ffn_up.weight")
            .unwrap();
        x.dims = vec![x.dims[1], x.dims[0]];
    });
    let e = Engine::load(&p, cfg()).err().unwrap();
    let msg = e.to_string();
    assert!(
        msg.contains("blk.0.ffn_up.weight")
            && msg.contains("expected [64, 96]")
            && msg.contains("[96, 64]"),
        "{msg}"
    );
}

#[test]
fn unknown_and_uncompiled_backends_are_refused_before_loading() {
    // The path does not exist: the backend check must come first.
    let mut c = cfg();
    c.backends = vec!["vulkan".into()];
    let e = Engine::load("/nonexistent.gguf", c.clone()).err().unwrap();
    assert!(
        e.to_string().contains("unknown backend name \"vulkan\""),
        "{e}"
    );
    c.backends = vec!["cuda".into()];
    let e = Engine::load("/nonexistent.gguf", c).err().unwrap();
    assert!(
        e.to_string().contains("not compiled into this build"),
        "{e}"
    );
}

#[test]
fn context_overflow_and_position_gaps_are_typed_errors() {
    let p = synth::write(&Tiny::new(Arch::Llama, GgmlType::F32));
    let mut e = Engine::load(&p, cfg()).unwrap();
    e.decode(&[1; 10], 0, 1).unwrap();
    let err = e.decode(&[1; 7], 10, 1).unwrap_err();
    assert!(
        matches!(
            err,
            Error::ContextOverflow {
                pos0: 10,
                n_tokens: 7,
                n_ctx: 16
            }
        ),
        "{err}"
    );
    let err = e.decode(&[1], 12, 1).unwrap_err();
    assert!(
        matches!(
            err,
            Error::PositionGap {
                pos0: 12,
                n_past: 10
            }
        ),
        "{err}"
    );
    let err = e.decode(&[1000], 10, 1).unwrap_err();
    assert!(
        matches!(err, Error::TokenOutOfRange { id: 1000, .. }),
        "{err}"
    );
}

#[test]
fn decode_steps_reuse_the_graph_and_truncation_replays_identically() {
    let p = synth::write(&Tiny::new(Arch::Qwen2, GgmlType::F32));
    let mut e = Engine::load(&p, cfg()).unwrap();
    e.decode(&[3, 4, 5], 0, 1).unwrap();
    let builds = e.graph_builds();
    let mut first = Vec::new();
    for (i, t) in [6u32, 7, 8, 9].into_iter().enumerate() {
        first.push(e.decode(&[t], 3 + i, 1).unwrap().to_vec());
    }
    assert_eq!(
        e.graph_builds(),
        builds + 1,
        "one decode graph, reused for every step"
    );
    // Rewind to 5 tokens and replay: the same logits, bit for bit (same graph, same cells).
    e.kv_truncate(5);
    let again = e.decode(&[8], 5, 1).unwrap().to_vec();
    assert_eq!(again, first[2]);
    // A different position must give different logits (control: positions are really input).
    e.kv_clear();
    let moved = e.decode(&[8], 0, 1).unwrap().to_vec();
    assert_ne!(moved, first[2]);
    let dot = e.graph_dot(1, 1).unwrap();
    assert!(
        dot.contains("L1.attn") && dot.contains("SwiGLU"),
        "fused and dumped"
    );
    let json = e.graph_json(1, 1).unwrap();
    assert!(json.contains("\"backend_name\": \"cpu\""));
}

#[test]
fn q8_0_kv_needs_whole_blocks_per_head() {
    let p = synth::write(&Tiny::new(Arch::Llama, GgmlType::F32)); // head dim 16
    let mut c = cfg();
    c.cache_type = GgmlType::Q8_0;
    let e = Engine::load(&p, c).err().unwrap();
    assert!(e.to_string().contains("multiple of 32"), "{e}");
}

#[test]
fn a_memory_budget_too_small_for_the_kv_is_refused_with_figures() {
    let p = synth::write(&Tiny::new(Arch::Llama, GgmlType::F32));
    let mut c = cfg();
    // 2 layers x (K + V) x 16 cells x 32 floats = 8 KiB of KV; allow 6 KiB.
    c.memory_budget = Some(6 << 10);
    let mut e = Engine::load(&p, c).unwrap();
    let err = e.decode(&[1, 2], 0, 1).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("budget 0.01 MiB") && msg.contains("in use"),
        "{msg}"
    );
    // Control: a sufficient budget runs and accounts for every byte it allowed.
    let mut c = cfg();
    c.memory_budget = Some(1 << 20);
    let mut e = Engine::load(&p, c).unwrap();
    e.decode(&[1, 2], 0, 1).unwrap();
    assert!(e.cpu_bytes_in_use() >= 8 << 10 && e.cpu_bytes_in_use() <= 1 << 20);
}
