//! The context sized by memory (issue 29, ADR 0002 §Capacity), through a whole load: on
//! metal-emu, whose free memory `MINFER_EMU_MEM` sets (`EmuSettings::memory`), the engine
//! sizes the arena from the device's answer after the weights less `KV_RESERVE`; a budget
//! too small is refused with the figures; a failed query, or a device that does not hold
//! every block, falls back to the configured context saying why; `--kv-mem` sizes on any
//! backend. The arithmetic has its unit tests in `kvsize.rs`; this proves the plumbing (the
//! engine's `n_ctx`, its arena and its startup line follow the plan).

#![cfg(feature = "metal-emu")]

use minfer_engine::backends::EmuMemory;
use minfer_engine::kvsize::KV_RESERVE;
use minfer_engine::{Engine, EngineConfig, GpuLayers, KvSize};
use minfer_gguf::GgmlType;
use minfer_models::Arch;
use minfer_testkit::synth;

const N_LAYERS: usize = 4;
/// The smallest context asked for (the server's).
const MIN_CTX: usize = 32;

fn cfg(backend: &str, kv_size: KvSize, memory: EmuMemory, layers: GpuLayers) -> EngineConfig {
    let mut c = EngineConfig {
        n_ctx: 64,
        kv_size,
        threads: 1,
        cache_type: GgmlType::F32,
        backends: vec![backend.into()],
        gpu_layers: layers,
        n_batch: 64,
        ..EngineConfig::default()
    };
    c.settings.emu.memory = memory;
    c
}

/// K and V of every layer, one cell, f32.
fn per_cell(e: &Engine) -> u64 {
    let hp = e.hparams();
    (2 * 4 * hp.head_count_kv * hp.head_dim * hp.block_count) as u64
}

/// What the offload planner charges under `size` (the blocks placed by count: no query).
fn e_costs(path: &std::path::Path, size: KvSize) -> minfer_engine::offload::BlockCosts {
    let mem = EmuMemory::Bytes(1 << 40);
    let e = Engine::load(
        path,
        cfg("metal-emu", size, mem, GpuLayers::Count(N_LAYERS)),
    )
    .unwrap();
    e.offload().unwrap().costs.clone()
}

#[test]
fn the_context_is_sized_from_the_devices_free_memory_after_the_weights() {
    let path = synth::model(Arch::Qwen2, N_LAYERS, 7);
    let free = KvSize::FreeMemory { min_ctx: MIN_CTX };
    // The cell size, from an engine of the plain context.
    let plain = Engine::load(
        &path,
        cfg("cpu", KvSize::Tokens, EmuMemory::Host, GpuLayers::Auto),
    )
    .unwrap();
    let per = per_cell(&plain);
    let train = plain.hparams().context_length;
    assert!(train >= 100, "the synthetic model's context {train}");

    // The emulator's figure stands for the free memory after the weights (it does not drop
    // as they upload), so the blocks are placed by count: the planner does not ask it.
    let all = GpuLayers::Count(N_LAYERS);
    // Room for exactly 101 cells past the reserve: 100 tokens (one cell is scratch).
    let mem = EmuMemory::Bytes(KV_RESERVE + 101 * per);
    let mut e = Engine::load(&path, cfg("metal-emu", free, mem, all)).unwrap();
    assert_eq!(e.n_ctx(), 100, "{}", e.kv_plan().line());
    let line = e.kv_plan().line();
    assert!(line.starts_with("kv: 100 tokens (101 cells, f32"), "{line}");
    assert!(line.contains("sized from metal-emu's"), "{line}");
    // The arena is that size: 100 positions run, the 101st is refused.
    let prompt: Vec<u32> = (0..100).map(|i| 3 + i % 50).collect();
    e.decode(&prompt, 0, 1).unwrap();
    assert!(
        e.decode(&[5], 100, 1).is_err(),
        "a position past the sized context ran"
    );

    // Capped at the training context.
    let mem = EmuMemory::Bytes(KV_RESERVE + per * (4 * train as u64 + 10));
    let e = Engine::load(&path, cfg("metal-emu", free, mem, all)).unwrap();
    assert_eq!(e.n_ctx(), train);
    assert!(
        e.kv_plan().line().contains("capped at"),
        "{}",
        e.kv_plan().line()
    );

    // Too small: refused with the figures.
    let mem = EmuMemory::Bytes(KV_RESERVE + 10 * per);
    let err = Engine::load(&path, cfg("metal-emu", free, mem, all))
        .err()
        .expect("10 cells for the default 64 loaded")
        .to_string();
    assert!(err.contains("MiB free after the weights"), "{err}");
    assert!(err.contains("at least 64 are needed"), "{err}");

    // `auto` keeps the KV's reserve beside the blocks: a budget that just places every
    // block leaves the default context room (the same figure read as after the weights
    // holds at least it).
    let costs = e_costs(&path, free);
    let mem = EmuMemory::Bytes(costs.budget_for(N_LAYERS, true));
    let e = Engine::load(&path, cfg("metal-emu", free, mem, GpuLayers::Auto)).unwrap();
    assert_eq!(e.offload().unwrap().on_device, N_LAYERS);
    assert!(e.n_ctx() >= 64, "{}", e.kv_plan().line());
    assert!(
        e.kv_plan().line().contains("sized from"),
        "{}",
        e.kv_plan().line()
    );
    assert!(
        costs.reserve >= KV_RESERVE,
        "the planner's reserve {}",
        costs.reserve
    );

    // Controls: a failed query (the blocks placed by count, so the planner does not ask)
    // and a device holding only some blocks fall back to -c's 64, saying why.
    let e = Engine::load(&path, cfg("metal-emu", free, EmuMemory::Fail, all)).unwrap();
    assert_eq!(e.n_ctx(), 64);
    assert!(
        e.kv_plan().line().contains("MINFER_EMU_MEM=fail"),
        "{}",
        e.kv_plan().line()
    );
    let mem = EmuMemory::Bytes(KV_RESERVE + 101 * per);
    let e = Engine::load(&path, cfg("metal-emu", free, mem, GpuLayers::Count(2))).unwrap();
    assert_eq!(e.n_ctx(), 64);
    assert!(
        e.kv_plan().line().contains("holds 2 of 4 blocks"),
        "{}",
        e.kv_plan().line()
    );
}

#[test]
fn kv_mem_sizes_the_context_on_any_backend() {
    let path = synth::model(Arch::Qwen2, N_LAYERS, 7);
    let plain = Engine::load(
        &path,
        cfg("cpu", KvSize::Tokens, EmuMemory::Host, GpuLayers::Auto),
    )
    .unwrap();
    let per = per_cell(&plain);
    let sized = KvSize::Memory {
        bytes: 81 * per,
        min_ctx: MIN_CTX,
    };
    let e = Engine::load(&path, cfg("cpu", sized, EmuMemory::Host, GpuLayers::Auto)).unwrap();
    assert_eq!(e.n_ctx(), 80, "{}", e.kv_plan().line());
    // Control: the plain engine kept its 64.
    assert_eq!(plain.n_ctx(), 64);
}
