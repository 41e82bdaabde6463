//! The Metal graph executor (`minfer_metal::MetalBackend`) on the emulator, at graph level
//! (seed §7.1): elementwise ops bit for bit against the CPU backend, norms and matmuls
//! within their named classes, CPU/Metal alternating splits equal to the all-CPU run, the
//! stale-read rule, the refusal of a weight type without kernels, zero-copy weights and the
//! memory budget charging them. Each gate checks that the device path really ran.

use minfer_cpu::{CpuBackend, CPU_ID};
use minfer_gguf::{quants, GgmlType};
use minfer_graph::{
    assign_backends, execute, fill_input, read_output, sched::splits, Allocator, Backend,
    BackendId, ExecArgs, Graph, GraphBuilder, InputKind, KvKind, KvPair, Op, Placement, WeightId,
    WeightRef, WeightSource,
};
use minfer_metal::MetalBackend;
use minfer_msl_emu::{EmuDevice, Schedule};

const METAL: BackendId = BackendId(1);

/// Weights held in one page-aligned anonymous mapping (so the device can wrap it zero-copy)
/// or, with `mapped = false`, reported as unmapped (the device copies them).
struct Weights {
    map: memmap2::MmapMut,
    table: Vec<(String, GgmlType, usize, usize, usize, usize)>, // name, ty, ne0, ne1, off, len
    mapped: bool,
}

impl Weights {
    fn new(list: &[(&str, GgmlType, usize, usize, Vec<u8>)], mapped: bool) -> Weights {
        let total: usize = list.iter().map(|w| w.4.len().next_multiple_of(64)).sum();
        let mut map = memmap2::MmapMut::map_anon(total.max(4096)).unwrap();
        let mut table = Vec::new();
        let mut off = 0;
        for (name, ty, ne0, ne1, bytes) in list {
            map[off..off + bytes.len()].copy_from_slice(bytes);
            table.push((name.to_string(), *ty, *ne0, *ne1, off, bytes.len()));
            off += bytes.len().next_multiple_of(64);
        }
        Weights { map, table, mapped }
    }
    fn ids(&self) -> Vec<WeightId> {
        (0..self.table.len() as u32).map(WeightId).collect()
    }
}

impl WeightSource for Weights {
    fn weight(&self, id: WeightId) -> Option<WeightRef<'_>> {
        let (_, ty, ne0, ne1, off, len) = self.table.get(id.index())?;
        Some(WeightRef {
            ty: *ty,
            ne0: *ne0,
            ne1: *ne1,
            bytes: &self.map[*off..off + len],
        })
    }
    fn name(&self, id: WeightId) -> &str {
        self.table.get(id.index()).map_or("?", |w| w.0.as_str())
    }
    fn id(&self, name: &str) -> Option<WeightId> {
        self.table
            .iter()
            .position(|w| w.0 == name)
            .map(|i| WeightId(i as u32))
    }
    fn len(&self) -> usize {
        self.table.len()
    }
    fn part(&self, _id: WeightId) -> Option<(usize, &[u8])> {
        self.mapped.then_some((0, &self.map[..]))
    }
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn values(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.max(1);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s % 2001) as f32 / 1000.0 - 1.0
        })
        .collect()
}

fn quantized(ty: GgmlType, v: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; ty.row_bytes(v.len() as u64).unwrap() as usize];
    quants::quantize_row(ty, v, &mut out).unwrap();
    out
}

fn metal() -> MetalBackend<EmuDevice> {
    MetalBackend::new(EmuDevice::new(Schedule::Forward), METAL, "metal-emu")
}

/// Backends for a run: the CPU alone, or Metal (with the CPU, as the engine always has it).
fn backends(with_metal: bool, w: &Weights, copy: bool) -> Vec<Box<dyn Backend>> {
    let mut v: Vec<Box<dyn Backend>> = vec![Box::new(CpuBackend::new(1))];
    if with_metal {
        v.push(Box::new(metal().with_weight_copy(copy)));
    }
    for b in &mut v {
        b.prepare_weights(w, &w.ids()).unwrap();
    }
    v
}

/// Assigns (by priority, or `force` per node index), plans, fills token ids, runs, reads.
fn run(
    mut g: Graph,
    bes: &mut [Box<dyn Backend>],
    w: &Weights,
    force: Option<&dyn Fn(usize) -> BackendId>,
    ids: &[i32],
) -> (Vec<f32>, Graph) {
    assign_backends(&mut g, bes, w, &Placement::everywhere(bes)).unwrap();
    if let Some(f) = force {
        for (i, n) in g.nodes.iter_mut().enumerate() {
            n.backend = Some(f(i));
        }
    }
    let mut alloc = Allocator::new();
    let plan = alloc.plan(&g, bes, &|_| Ok(0)).unwrap();
    fill_input(&g, &plan, bes, InputKind::TokenIds, ids).unwrap();
    execute(&g, &plan, bes, w).unwrap();
    let mut out = Vec::new();
    read_output(&g, &plan, bes, &mut out).unwrap();
    (out, g)
}

fn on(g: &Graph, be: BackendId) -> usize {
    g.nodes
        .iter()
        .filter(|n| !n.dead && n.backend == Some(be))
        .count()
}

const D: usize = 64;
const ROWS: usize = 32;

fn embed_weights(mapped: bool) -> Weights {
    Weights::new(
        &[(
            "embd",
            GgmlType::F32,
            D,
            ROWS,
            f32_bytes(&values(D * ROWS, 7)),
        )],
        mapped,
    )
}

/// ids -> embd rows -> ((x + x) * x) + x
fn elementwise_graph(w: &Weights, nt: usize) -> Graph {
    let mut b = GraphBuilder::new();
    let ids = b.input(InputKind::TokenIds, [nt, 1]);
    let x = b.op(
        "x",
        Op::GetRows {
            weight: w.id("embd").unwrap(),
        },
        &[ids],
        [D, nt],
    );
    let a = b.op("a", Op::Add, &[x, x], [D, nt]);
    let m = b.op("m", Op::Mul, &[a, x], [D, nt]);
    let m2 = b.op("m2", Op::Mul, &[m, a], [D, nt]);
    let o = b.op("o", Op::Add, &[m2, x], [D, nt]);
    b.finish(o)
}

const IDS: [i32; 5] = [3, 0, 31, 17, 3];

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

fn norm_matmul_graph(w: &Weights, nt: usize, n_out: usize) -> Graph {
    let mut b = GraphBuilder::new();
    let ids = b.input(InputKind::TokenIds, [nt, 1]);
    let x = b.op(
        "x",
        Op::GetRows {
            weight: w.id("embd").unwrap(),
        },
        &[ids],
        [D, nt],
    );
    let n = b.op(
        "norm",
        Op::RmsNorm {
            eps: 1e-6,
            weight: w.id("gain").unwrap(),
            group: D,
        },
        &[x],
        [D, nt],
    );
    let y = b.op(
        "proj",
        Op::MatMul {
            weight: w.id("proj").unwrap(),
            bias: w.id("bias"),
        },
        &[n],
        [n_out, nt],
    );
    let s = b.op("act", Op::Silu, &[y], [n_out, nt]);
    b.finish(s)
}

fn proj_weights(ty: GgmlType, n_out: usize) -> Weights {
    let proj = values(D * n_out, 11);
    let bytes = match ty {
        GgmlType::F32 => f32_bytes(&proj),
        t => proj.chunks(D).flat_map(|r| quantized(t, r)).collect(),
    };
    Weights::new(
        &[
            (
                "embd",
                GgmlType::F32,
                D,
                ROWS,
                f32_bytes(&values(D * ROWS, 7)),
            ),
            ("gain", GgmlType::F32, D, 1, f32_bytes(&values(D, 3))),
            ("proj", ty, D, n_out, bytes),
            (
                "bias",
                GgmlType::F32,
                n_out,
                1,
                f32_bytes(&values(n_out, 5)),
            ),
        ],
        true,
    )
}

#[test]
fn norm_matmul_bias_silu_match_the_cpu_within_their_classes() {
    // Classes, named before measuring: f32 weights differ only in accumulation order (a
    // 64-term dot product: <= 1e-5 relative to the largest output) in the mat-vec and
    // multi-row tiers; the GEMM tier (nt >= 9 here) stages weight tiles as f16 (as
    // llama.cpp's does; rel 2^-11 per weight): <= 1e-3. q8_0 weights add the CPU's q8_0
    // quantization of the activations (a device reads f32): <= 2e-2.
    for (ty, small, gemm) in [
        (GgmlType::F32, 1e-5f32, 1e-3f32),
        (GgmlType::Q8_0, 2e-2, 2e-2),
    ] {
        for nt in [1usize, 5, 12] {
            let bar = if nt >= 9 { gemm } else { small };
            let n_out = 96;
            let w = proj_weights(ty, n_out);
            let ids: Vec<i32> = (0..nt as i32).map(|i| (i * 7) % ROWS as i32).collect();
            let mut cpu = backends(false, &w, false);
            let (want, _) = run(norm_matmul_graph(&w, nt, n_out), &mut cpu, &w, None, &ids);
            let mut mtl = backends(true, &w, false);
            let (got, g) = run(norm_matmul_graph(&w, nt, n_out), &mut mtl, &w, None, &ids);
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
        }
    }
}

#[test]
fn a_weight_type_without_kernels_is_an_error_naming_node_type_and_kernel() {
    let n_out = 32;
    // TQ1_0-like types have no Metal kernels; use one the suffix table refuses.
    let bad = GgmlType::Iq2Xxs;
    let raw = vec![0u8; bad.row_bytes(256).unwrap() as usize * n_out];
    let w = Weights::new(
        &[
            (
                "embd",
                GgmlType::F32,
                256,
                4,
                f32_bytes(&values(256 * 4, 2)),
            ),
            ("w", bad, 256, n_out, raw),
        ],
        true,
    );
    let mut be = metal();
    be.prepare_weights(&w, &w.ids()).unwrap();
    // Assignment would keep it off the device, with the reason:
    let mm = Op::MatMul {
        weight: w.id("w").unwrap(),
        bias: None,
    };
    let why = be.refusal(&mm, &w).expect("refused");
    assert!(why.contains("iq2_xxs") || why.contains("IQ2_XXS"), "{why}");
    assert!(!be.supports_op(&mm, minfer_graph::DType::F32, &w));
    // ... and a node forced onto it fails loudly instead of running another type's kernel.
    let x = be.alloc(256 * 4).unwrap();
    let out = be.alloc(n_out * 4).unwrap();
    let node = minfer_graph::Node {
        id: minfer_graph::NodeId(1),
        name: "blk.0.ffn_down".into(),
        op: mm,
        src: vec![minfer_graph::NodeId(0)],
        shape: [n_out, 1],
        dtype: minfer_graph::DType::F32,
        backend: Some(METAL),
        layer: Some(0),
        dead: false,
    };
    let args = ExecArgs {
        srcs: &[Some(x)],
        out: Some(out),
        kv: None,
        weights: &w,
    };
    let err = be.execute_split(&[&node], &[args]).unwrap_err().to_string();
    assert!(err.contains("blk.0.ffn_down"), "{err}");
    assert!(err.to_lowercase().contains("iq2_xxs"), "{err}");
    assert!(err.contains("kernel_mv_"), "{err}");
    // Control: the same node over an f32 weight computes.
    let good = Weights::new(
        &[(
            "w",
            GgmlType::F32,
            256,
            n_out,
            f32_bytes(&values(256 * n_out, 4)),
        )],
        true,
    );
    let mut be = metal();
    be.prepare_weights(&good, &good.ids()).unwrap();
    let x = be.alloc(256 * 4).unwrap();
    let out = be.alloc(n_out * 4).unwrap();
    let node = minfer_graph::Node {
        op: Op::MatMul {
            weight: WeightId(0),
            bias: None,
        },
        ..node
    };
    let args = ExecArgs {
        srcs: &[Some(x)],
        out: Some(out),
        kv: None,
        weights: &good,
    };
    be.execute_split(&[&node], &[args]).unwrap();
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
fn a_kv_store_past_the_region_is_an_error_naming_the_cell() {
    let w = Weights::new(&[], true);
    let mut be = metal();
    be.prepare_weights(&w, &[]).unwrap();
    let region = be.alloc(64 * 4 * 4).unwrap();
    let x = be.alloc(64 * 4).unwrap();
    let idx = be.alloc(4).unwrap();
    be.write(idx, 0, &9i32.to_le_bytes()).unwrap();
    let node = minfer_graph::Node {
        id: minfer_graph::NodeId(2),
        name: "blk.3.v_store".into(),
        op: Op::KvStore {
            layer: 3,
            kind: KvKind::V,
            cache_type: GgmlType::F32,
        },
        src: vec![minfer_graph::NodeId(0), minfer_graph::NodeId(1)],
        shape: [64, 1],
        dtype: minfer_graph::DType::None,
        backend: Some(METAL),
        layer: Some(3),
        dead: false,
    };
    let kv = KvPair {
        k: region,
        v: region,
    };
    let args = ExecArgs {
        srcs: &[Some(x), Some(idx)],
        out: None,
        kv: Some(kv),
        weights: &w,
    };
    let err = be.execute_split(&[&node], &[args]).unwrap_err().to_string();
    assert!(
        err.contains("blk.3.v_store") && err.contains("cell 9"),
        "{err}"
    );
    // Control: cell 3 is inside the 4-cell region.
    be.write(idx, 0, &3i32.to_le_bytes()).unwrap();
    let args = ExecArgs {
        srcs: &[Some(x), Some(idx)],
        out: None,
        kv: Some(kv),
        weights: &w,
    };
    be.execute_split(&[&node], &[args]).unwrap();
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
        let mut only: Vec<Box<dyn Backend>> = bes.drain(1..).collect();
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
    let weights = bes[1].weights_bytes();
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

fn node(name: &str, op: Op, srcs: usize, shape: [usize; 2]) -> minfer_graph::Node {
    minfer_graph::Node {
        id: minfer_graph::NodeId(srcs as u32),
        name: name.into(),
        dtype: if matches!(op, Op::KvStore { .. }) {
            minfer_graph::DType::None
        } else {
            minfer_graph::DType::F32
        },
        op,
        src: (0..srcs as u32).map(minfer_graph::NodeId).collect(),
        shape,
        backend: Some(METAL),
        layer: Some(0),
        dead: false,
    }
}

#[test]
fn a_norm_whose_gain_is_not_on_the_device_is_an_error_naming_node_and_tensor() {
    let w = proj_weights(GgmlType::F32, 96);
    let gain = w.id("gain").unwrap();
    let norm = node(
        "blk.0.attn_norm",
        Op::RmsNorm {
            eps: 1e-6,
            weight: gain,
            group: D,
        },
        1,
        [D, 2],
    );
    for registered in [false, true] {
        let mut be = metal();
        // Every weight but the gain, or all of them (the control).
        let ids: Vec<WeightId> = w
            .ids()
            .into_iter()
            .filter(|&i| registered || i != gain)
            .collect();
        be.prepare_weights(&w, &ids).unwrap();
        let x = be.alloc(D * 2 * 4).unwrap();
        let out = be.alloc(D * 2 * 4).unwrap();
        let args = ExecArgs {
            srcs: &[Some(x)],
            out: Some(out),
            kv: None,
            weights: &w,
        };
        let r = be.execute_split(&[&norm], &[args]);
        if registered {
            r.unwrap();
        } else {
            let e = r.unwrap_err().to_string();
            assert!(e.contains("blk.0.attn_norm") && e.contains("gain"), "{e}");
        }
    }
}

#[test]
fn attention_shape_and_window_guards_are_errors_naming_the_node() {
    let w = Weights::new(&[], true);
    let (n_head, n_head_kv, hd, cells, nt) = (4usize, 2usize, 64usize, 16usize, 3usize);
    let attn = |ne0: usize| {
        node(
            "blk.1.attn",
            Op::Attention {
                layer: 1,
                n_head,
                n_head_kv,
                head_dim: hd,
                scale: 0.125,
                cache_type: GgmlType::F32,
                window: minfer_graph::WindowLayout::Span,
            },
            2,
            [ne0, nt],
        )
    };
    let run = |ne0: usize, hi: i32| {
        let mut be = metal();
        be.prepare_weights(&w, &[]).unwrap();
        let k = be.alloc(cells * n_head_kv * hd * 4).unwrap();
        let v = be.alloc(cells * n_head_kv * hd * 4).unwrap();
        let q = be.alloc(nt * n_head * hd * 4).unwrap();
        let win = be.alloc(nt * 2 * 4).unwrap();
        let out = be.alloc(nt * n_head * hd * 4).unwrap();
        let spans: Vec<u8> = [0, 4, 0, 8, 2, hi]
            .iter()
            .flat_map(|x: &i32| x.to_le_bytes())
            .collect();
        be.write(win, 0, &spans).unwrap();
        let args = ExecArgs {
            srcs: &[Some(q), Some(win)],
            out: Some(out),
            kv: Some(KvPair { k, v }),
            weights: &w,
        };
        be.execute_split(&[&attn(ne0)], &[args])
    };
    // Control: a well-formed node runs.
    run(n_head * hd, 12).unwrap();
    // Rows that are not n_head x head_dim.
    let e = run(n_head * hd - 32, 12).unwrap_err().to_string();
    assert!(e.contains("blk.1.attn") && e.contains("heads of 64"), "{e}");
    // A window past the region's 16 cells, naming the query.
    let e = run(n_head * hd, 17).unwrap_err().to_string();
    assert!(e.contains("blk.1.attn") && e.contains("query 2"), "{e}");
}

#[test]
fn a_k_quant_weight_whose_rows_are_not_whole_super_blocks_is_refused() {
    let be = metal();
    let bytes = vec![0u8; GgmlType::Q4K.row_bytes(512).unwrap() as usize];
    let ok = WeightRef {
        ty: GgmlType::Q4K,
        ne0: 256,
        ne1: 2,
        bytes: &bytes,
    };
    be.can_hold(&ok).unwrap();
    let bad = WeightRef {
        ne0: 128,
        ne1: 4,
        ..ok
    };
    let why = be.can_hold(&bad).unwrap_err();
    assert!(why.contains("256"), "{why}");
}
