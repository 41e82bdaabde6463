//! The Metal graph executor (`minfer_metal::MetalBackend`) on the emulator, at graph level
//! (seed §7.1): elementwise ops bit for bit against the CPU backend, norms and matmuls
//! within their named classes, CPU/Metal alternating splits equal to the all-CPU run, the
//! stale-read rule, zero-copy weights and the memory budget charging them, a sibling backend
//! reading its origin's weights where they are. Each gate checks that the device path really
//! ran. The guards (refusals) are in executor_guards.rs.

mod executor_support;

use executor_support::*;
use minfer_cpu::CPU_ID;
use minfer_gguf::GgmlType;
use minfer_graph::contract::*;
use minfer_graph::{sched::splits, Allocator, Backend, ExecArgs, KvKind, KvPair, Op};

#[test]
fn elementwise_ops_match_the_cpu_bit_for_bit() {
    let w = embed_weights(true);
    let mut cpu = backends(false, &w, false);
    let (want, gc) = run(elementwise_graph(&w, 5), &mut cpu, &w, None, &IDS);
    let mut mtl = backends(true, &w, false);
    let (got, gm) = run(elementwise_graph(&w, 5), &mut mtl, &w, None, &IDS);
    // The two sides really ran on different backends.
    assert_eq!(on(&gc, METAL), 0);
    assert_eq!(on(&gm, CPU_ID), 0, "every node is on Metal");
    assert!(on(&gm, METAL) >= 5);
    assert_eq!(want.len(), got.len());
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&want), bits(&got));
    // Control: one different id changes the output (the comparison can fail).
    let (other, _) = run(
        elementwise_graph(&w, 5),
        &mut mtl,
        &w,
        None,
        &[3, 0, 31, 16, 3],
    );
    assert_ne!(bits(&other), bits(&got));
}

#[test]
fn alternating_cpu_and_metal_splits_equal_the_all_cpu_run() {
    let w = embed_weights(true);
    let mut cpu = backends(false, &w, false);
    let (want, _) = run(elementwise_graph(&w, 5), &mut cpu, &w, None, &IDS);
    let mut mixed = backends(true, &w, false);
    let alternate = |i: usize| if i.is_multiple_of(2) { METAL } else { CPU_ID };
    let (got, g) = run(
        elementwise_graph(&w, 5),
        &mut mixed,
        &w,
        Some(&alternate),
        &IDS,
    );
    let s = splits(&g);
    assert!(s.len() >= 5, "{} splits: the graph alternates", s.len());
    assert!(on(&g, METAL) >= 3 && on(&g, CPU_ID) >= 2);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&want), bits(&got));
}

#[test]
fn norm_matmul_bias_silu_match_the_cpu_within_their_classes() {
    // Classes, named before measuring: f32 weights differ only in accumulation order (a
    // 64-term dot product: <= 1e-6 relative to the largest output; measured 1.0e-7, it was
    // 1e-5) in the mat-vec and multi-row tiers (generation rows); the GEMM tier (prompt
    // rows, here nt 12) stages weight tiles as f16 (as llama.cpp's does; rel 2^-11 per
    // weight): <= 1e-3 (measured 1.9e-4).
    // q8_0 weights add the CPU's q8_0 quantization of the activations (a device reads f32):
    // <= 2e-2 (measured 7.3e-3).
    for (ty, small, gemm) in [
        (GgmlType::F32, 1e-6f32, 1e-3f32),
        (GgmlType::Q8_0, 2e-2, 2e-2),
    ] {
        for nt in [1usize, 5, 12] {
            let prompt = nt >= 9;
            let bar = if prompt { gemm } else { small };
            let class = if prompt {
                minfer_graph::RowClass::Prompt
            } else {
                minfer_graph::RowClass::Generation
            };
            let rows = minfer_graph::RowClasses {
                tokens: vec![class; nt],
                outputs: vec![class; nt],
            };
            let n_out = 96;
            let w = proj_weights(ty, n_out);
            let ids: Vec<i32> = (0..nt as i32).map(|i| (i * 7) % ROWS as i32).collect();
            let mut cpu = backends(false, &w, false);
            let (want, _) = run(norm_matmul_graph(&w, nt, n_out), &mut cpu, &w, None, &ids);
            let mut mtl = backends(true, &w, false);
            let g = norm_matmul_graph(&w, nt, n_out);
            let (got, g) = run_rows(g, &mut mtl, &w, None, &ids, &rows);
            assert_eq!(on(&g, CPU_ID), 0);
            let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            let err = want
                .iter()
                .zip(&got)
                .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            println!("{ty} nt {nt}: max |d| {err:.3e} of max |y| {scale:.3}");
            assert!(err <= bar * scale, "{ty} nt {nt}: {err} > {bar} x {scale}");
            assert!(
                err > 0.0 || ty == GgmlType::F32,
                "q8_0: the CPU path quantizes"
            );
            // The prompt rows really ran the GEMM: its half-staged weights leave the f32 class.
            if prompt && ty == GgmlType::F32 {
                assert!(
                    err > small * scale,
                    "f32 prompt rows: {err} is the f32 class"
                );
            }
        }
    }
}

#[test]
fn a_kv_store_read_back_before_any_submit_is_not_stale() {
    let w = Weights::new(&[], true);
    let mut be = metal();
    be.prepare_weights(&w, &[]).unwrap();
    let (row, cells) = (64usize, 8usize);
    let region = be.alloc(row * 4 * cells).unwrap();
    let other = be.alloc(row * 4 * cells).unwrap();
    let x = be.alloc(row * 4 * 2).unwrap();
    let idx = be.alloc(8).unwrap();
    let rows = values(row * 2, 9);
    be.write(x, 0, &f32_bytes(&rows)).unwrap();
    be.write(idx, 0, &[5i32.to_le_bytes(), 2i32.to_le_bytes()].concat())
        .unwrap();
    let node = minfer_graph::Node {
        id: minfer_graph::NodeId(2),
        name: "blk.0.k_store".into(),
        op: Op::KvStore {
            layer: 0,
            kind: KvKind::K,
            cache_type: GgmlType::F32,
        },
        src: vec![minfer_graph::NodeId(0), minfer_graph::NodeId(1)],
        shape: [row, 2],
        dtype: minfer_graph::DType::None,
        backend: Some(METAL),
        layer: Some(0),
        dead: false,
    };
    let args = ExecArgs {
        srcs: &[Some(x), Some(idx)],
        out: None,
        kv: Some(KvPair {
            k: region,
            v: other,
        }),
        weights: &w,
    };
    // Encoded, not submitted: the store is still pending.
    be.execute_node(&node, &args).unwrap();
    // Control: the device memory itself still holds zeros (the store has not run) ...
    let mut raw = vec![0u8; row * 4];
    let dev = be.device();
    minfer_metal::Device::read_bytes(dev, be.raw_buffer(region).unwrap(), 5 * row * 4, &mut raw)
        .unwrap();
    assert!(
        raw.iter().all(|&b| b == 0),
        "the control read sees the pending store"
    );
    // ... and the backend's read (the KV read-back path) is ordered after it.
    let mut got = vec![0u8; row * 4];
    be.read(region, 5 * row * 4, &mut got).unwrap();
    assert_eq!(got, f32_bytes(&rows[..row]));
    be.read(region, 2 * row * 4, &mut got).unwrap();
    assert_eq!(got, f32_bytes(&rows[row..]));
}

#[test]
fn weights_are_read_in_place_from_the_mapping_unless_copied() {
    for copy in [false, true] {
        let mut w = embed_weights(true);
        let mut bes = backends(true, &w, copy);
        let (before, g) = run(elementwise_graph(&w, 5), &mut bes, &w, None, &IDS);
        assert_eq!(on(&g, CPU_ID), 0);
        // Change row 3 of the table in the mapping after the weights were prepared.
        let off = 3 * D * 4;
        w.map[off..off + 4].copy_from_slice(&5.0f32.to_le_bytes());
        // Only Metal may run now: the CPU backend reads the mapping in place too.
        let mut only: Vec<Box<dyn Backend>> = bes.drain(..1).collect();
        let (after, _) = run(elementwise_graph(&w, 5), &mut only, &w, None, &IDS);
        if copy {
            assert_eq!(
                before, after,
                "a copied weight does not see the mapping change"
            );
        } else {
            assert_ne!(before, after, "a wrapped weight is the mapping itself");
        }
    }
}

#[test]
fn registered_weights_are_charged_in_the_memory_budget() {
    let w = proj_weights(GgmlType::F32, 96);
    let g = || {
        let mut g = norm_matmul_graph(&w, 4, 96);
        for n in &mut g.nodes {
            n.backend = Some(METAL);
        }
        g
    };
    let mut bes = backends(true, &w, false);
    let weights = bes[0].weights_bytes();
    assert!(weights >= (D * 96 + D * ROWS) * 4, "{weights}");
    // What the plan takes without the weights.
    let mut free = Allocator::new();
    let plan = free.plan(&g(), &mut bes, &|_| Ok(0)).unwrap();
    let acts = free.in_use(METAL);
    free.release(plan, &mut bes);
    // A budget above the activations but below activations + weights refuses ...
    let mut tight = Allocator::new();
    tight.set_budget(METAL, acts + weights / 2);
    let err = tight
        .plan(&g(), &mut bes, &|_| Ok(0))
        .unwrap_err()
        .to_string();
    assert!(err.contains("budget"), "{err}");
    // ... and one holding both plans (the control).
    let mut roomy = Allocator::new();
    roomy.set_budget(METAL, acts + weights + 4096);
    roomy.plan(&g(), &mut bes, &|_| Ok(0)).unwrap();
}

/// Row classes choose the tiers, so the executor is batch invariant; the gates' control
/// (`MINFER_METAL_TIER_CONTROL=by-rows`) chooses them by the row count again and says so.
#[test]
fn the_executor_is_batch_invariant_unless_the_tier_control_is_planted() {
    use minfer_metal::MetalSettings;
    let make = |s: &MetalSettings| {
        MetalBackend::with_settings(EmuDevice::new(Schedule::Forward), METAL, "metal-emu", s)
    };
    assert!(make(&MetalSettings::default()).batch_invariant());
    let control = MetalSettings {
        tier_by_rows: true,
        ..MetalSettings::default()
    };
    assert!(!make(&control).batch_invariant());
}

/// A sibling (`Memory::sibling`, the self-draft's backend, issue 31) reads its origin's
/// resident weights: making and preparing it makes no buffer on the device (the emulator
/// counts the bytes of every buffer it makes or wraps, siblings together), it charges no
/// weight bytes, and its forward is its origin's bit for bit. Controls: a second backend on
/// the same device preparing the same weights (the old self-draft) makes them again; a
/// sibling handed a weight it does not share refuses it by name.
#[test]
fn a_sibling_reads_its_origins_weights_where_they_are() {
    let w = proj_weights(GgmlType::Q8_0, 96);
    let mut origin = metal();
    origin.prepare_weights(&w, &w.ids()).unwrap();
    // A handle that reads the device's count (siblings share it).
    let probe = minfer_metal::Device::sibling(origin.device()).unwrap();
    let made = probe.bytes_made();
    assert!(
        made > 0,
        "control: the origin's weights were made or wrapped"
    );
    let mut sib = origin.sibling().unwrap();
    sib.prepare_weights(&w, &w.ids()).unwrap();
    assert_eq!(probe.bytes_made(), made, "the sibling made no buffer");
    assert_eq!(sib.weights_bytes(), 0);
    assert!(origin.weights_bytes() > 0);
    let metal_only = |_: usize| METAL;
    let mut a: Vec<Box<dyn Backend>> = vec![Box::new(origin)];
    let mut b: Vec<Box<dyn Backend>> = vec![sib];
    let (x, g) = run(
        norm_matmul_graph(&w, 5, 96),
        &mut a,
        &w,
        Some(&metal_only),
        &IDS,
    );
    let (y, _) = run(
        norm_matmul_graph(&w, 5, 96),
        &mut b,
        &w,
        Some(&metal_only),
        &IDS,
    );
    assert!(on(&g, METAL) > 0);
    assert_eq!(
        x.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        y.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
    // Control: a backend of its own on the device prepares the weights again.
    let before = probe.bytes_made();
    let mut own = minfer_metal::MetalBackend::new(
        minfer_metal::Device::sibling(&probe).unwrap(),
        METAL,
        "metal-emu",
    );
    own.prepare_weights(&w, &w.ids()).unwrap();
    assert!(
        probe.bytes_made() >= before + D * 4,
        "control: a backend of its own made its weights ({} -> {})",
        before,
        probe.bytes_made()
    );
    // A weight the sibling does not share is refused, naming it.
    let other = proj_weights(GgmlType::Q8_0, 64);
    let e = b[0]
        .prepare_weights(&other, &other.ids())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("proj") && e.contains("not among the weights"),
        "{e}"
    );
}
