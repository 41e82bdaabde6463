//! The fused decode nodes of `minfer_metal::MetalBackend` at graph level on the emulator:
//! - the #39 refusals: every fused node refuses `nt != 1` with an Err naming the node and the
//!   observed nt, before any weight lookup (control: the same node at nt = 1 gets past the
//!   check and fails at the weight it was never given);
//! - the load-time concatenation: in place when the group lies contiguous in one mapped part,
//!   else one copy charged in `weights_bytes`; on every path `FfnGateUp` gives the bits of
//!   `MatMul`, `MatMul`, `SwiGLU`;
//! - the fused KV store's bound (#38): a cell past the region is an Err naming it and the
//!   region's n_ctx, before any dispatch (control: the last cell is stored, nothing else).

use minfer_gguf::{quants, GgmlType};
use minfer_graph::contract::*;
use minfer_graph::{
    assign_backends, execute, fill_input, read_output, Allocator, Backend, BackendId, DType,
    ExecArgs, Graph, GraphBuilder, InputKind, Node, NodeId, Op, Placement, QkNormSpec, QkvFused,
    RopeSpec, RopeStyle, WeightId, WeightRef, WeightSource,
};
use minfer_metal::MetalBackend;
use minfer_msl_emu::{EmuDevice, Schedule};

const METAL: BackendId = BackendId(1);

/// Named weights in one page-aligned mapping, each at a 64-byte multiple; `mapped = false`
/// reports them outside any mapping (the device copies each).
struct Weights {
    map: memmap2::MmapMut,
    table: Vec<(String, GgmlType, usize, usize, std::ops::Range<usize>)>,
    mapped: bool,
}

impl Weights {
    fn new(list: Vec<(&str, GgmlType, usize, usize, Vec<u8>)>, mapped: bool) -> Weights {
        let total: usize = list.iter().map(|w| w.4.len().next_multiple_of(64)).sum();
        let mut map = memmap2::MmapMut::map_anon(total.max(4096)).unwrap();
        let mut table = Vec::new();
        let mut at = 0;
        for (name, ty, ne0, ne1, bytes) in list {
            map[at..at + bytes.len()].copy_from_slice(&bytes);
            table.push((name.to_string(), ty, ne0, ne1, at..at + bytes.len()));
            at += bytes.len().next_multiple_of(64);
        }
        Weights { map, table, mapped }
    }
    fn ids(&self) -> Vec<WeightId> {
        (0..self.table.len() as u32).map(WeightId).collect()
    }
}

impl WeightSource for Weights {
    fn weight(&self, id: WeightId) -> Option<WeightRef<'_>> {
        let (_, ty, ne0, ne1, r) = self.table.get(id.index())?;
        Some(WeightRef {
            ty: *ty,
            ne0: *ne0,
            ne1: *ne1,
            bytes: &self.map[r.clone()],
        })
    }
    fn name(&self, id: WeightId) -> &str {
        self.table.get(id.index()).map_or("?", |w| w.0.as_str())
    }
    fn id(&self, name: &str) -> Option<WeightId> {
        let i = self.table.iter().position(|w| w.0 == name)?;
        Some(WeightId(i as u32))
    }
    fn len(&self) -> usize {
        self.table.len()
    }
    fn part(&self, _id: WeightId) -> Option<(usize, &[u8])> {
        self.mapped.then_some((0, &self.map[..]))
    }
}

fn metal() -> MetalBackend<EmuDevice> {
    MetalBackend::new(EmuDevice::new(Schedule::Forward), METAL, "metal-emu")
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

fn encoded(ty: GgmlType, v: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; ty.row_bytes(v.len() as u64).unwrap() as usize];
    quants::quantize_row(ty, v, &mut out).unwrap();
    out
}

fn fused_node(op: Op, shape: [usize; 2]) -> Node {
    Node {
        id: NodeId(0),
        name: "L0.fused".into(),
        op,
        src: Vec::new(),
        shape,
        dtype: DType::F32,
        backend: Some(METAL),
        layer: Some(0),
        dead: false,
    }
}

#[test]
fn each_fused_node_refuses_nt_other_than_one_before_any_weight_lookup() {
    let w = Weights::new(Vec::new(), true);
    let mut be = metal();
    let qkv = |norm: bool| {
        Op::QkvRopeStore(Box::new(QkvFused {
            wq: WeightId(0),
            wk: WeightId(1),
            wv: WeightId(2),
            bias: None,
            norm: norm.then_some(QkNormSpec {
                q: WeightId(3),
                k: WeightId(4),
                eps: 1e-6,
            }),
            in_norm: None,
            rope: RopeSpec {
                style: RopeStyle::Neox,
                head_dim: 16,
                freq_base: 10000.0,
                freq_scale: 1.0,
            },
            n_head: 4,
            n_head_kv: 2,
            layer: 0,
            cache_type: GgmlType::F32,
        }))
    };
    let ffn = Op::FfnGateUp {
        gate: WeightId(5),
        up: WeightId(6),
        in_norm: None,
    };
    let args = ExecArgs {
        srcs: &[],
        out: None,
        kv: None,
        weights: &w,
    };
    for (op, ne0, class) in [
        (qkv(false), 64, "QkvRopeStore"),
        (qkv(true), 64, "QkvNormRopeStore"),
        (ffn, 96, "FfnGateUp"),
    ] {
        assert_eq!(op.name(), class);
        for nt in [2, 7, 512] {
            let e = be
                .execute_node(&fused_node(op.clone(), [ne0, nt]), &args)
                .unwrap_err()
                .to_string();
            println!("{class} at nt {nt}: {e}");
            assert!(
                e.contains("L0.fused") && e.contains(&format!("got nt = {nt}")),
                "{class}: {e}"
            );
        }
        // Control: at nt = 1 the node passes the shape check and stops at the weights it was
        // never given, so the refusal above ran before the lookup.
        let e = be
            .execute_node(&fused_node(op.clone(), [ne0, 1]), &args)
            .unwrap_err()
            .to_string();
        assert!(
            !e.contains("got nt") && e.contains("was not prepared"),
            "{class}: {e}"
        );
    }
}

const D: usize = 64;
const FF: usize = 96;
const VOCAB: usize = 8;

/// One token through the embedding, then the FFN gate/up fused or as the unfused chain.
fn ffn_graph(fused: bool, embd: WeightId, gate: WeightId, up: WeightId) -> Graph {
    let mut g = GraphBuilder::new();
    let t = g.input(InputKind::TokenIds, [1, 1]);
    let x = g.op("embd", Op::GetRows { weight: embd }, &[t], [D, 1]);
    let out = if fused {
        g.op(
            "ffn",
            Op::FfnGateUp {
                gate,
                up,
                in_norm: None,
            },
            &[x],
            [FF, 1],
        )
    } else {
        let mm = |g: &mut GraphBuilder, name: &str, weight| {
            g.op(name, Op::MatMul { weight, bias: None }, &[x], [FF, 1])
        };
        let a = mm(&mut g, "gate", gate);
        let b = mm(&mut g, "up", up);
        g.op("swiglu", Op::SwiGLU, &[a, b], [FF, 1])
    };
    g.finish(out)
}

fn run(g: &mut Graph, bes: &mut [Box<dyn Backend>], w: &Weights) -> Vec<f32> {
    assign_backends(g, bes, w, &Placement::everywhere(bes)).unwrap();
    assert!(g.nodes.iter().all(|n| n.backend == Some(METAL)));
    let mut alloc = Allocator::new();
    let plan = alloc.plan(g, bes, &|_| Ok(0)).unwrap();
    fill_input(g, &plan, bes, InputKind::TokenIds, &[3]).unwrap();
    execute(g, &plan, bes, w, &minfer_graph::RowClasses::default()).unwrap();
    let mut out = Vec::new();
    read_output(g, &plan, bes, &mut out).unwrap();
    out
}

#[test]
fn ffn_gate_up_concatenates_once_in_place_or_copied_and_matches_the_chain_bit_for_bit() {
    let ty = GgmlType::Q8_0;
    let embd = values(D * VOCAB, 7);
    let gate = encoded(ty, &values(D * FF, 11));
    let up = encoded(ty, &values(D * FF, 13));
    let len = gate.len() + up.len();
    assert_eq!(
        gate.len() % 64,
        0,
        "the fixture lays gate and up back to back"
    );
    // (mapped, a tensor between gate and up, expected extra bytes)
    for (mapped, apart, extra) in [(true, false, 0), (true, true, len), (false, false, len)] {
        let mut list = vec![(
            "embd",
            GgmlType::F32,
            D,
            VOCAB,
            encoded(GgmlType::F32, &embd),
        )];
        list.push(("gate", ty, D, FF, gate.clone()));
        if apart {
            list.push(("between", GgmlType::F32, D, 1, vec![0u8; D * 4]));
        }
        list.push(("up", ty, D, FF, up.clone()));
        let w = Weights::new(list, mapped);
        let id = |n: &str| w.id(n).unwrap();
        let (e, g, u) = (id("embd"), id("gate"), id("up"));
        let mut bes: Vec<Box<dyn Backend>> = vec![Box::new(metal())];
        bes[0].prepare_weights(&w, &w.ids()).unwrap();
        let before = bes[0].weights_bytes();
        bes[0].prepare_concat(&w, &[vec![g, u]]).unwrap();
        let charged = bes[0].weights_bytes() - before;
        assert_eq!(
            charged, extra,
            "mapped {mapped}, apart {apart}: the concatenation charged {charged} bytes"
        );
        let fused = run(&mut ffn_graph(true, e, g, u), &mut bes, &w);
        let chain = run(&mut ffn_graph(false, e, g, u), &mut bes, &w);
        assert_eq!(fused.len(), FF);
        assert!(fused.iter().any(|&x| x != 0.0));
        let same = fused
            .iter()
            .zip(&chain)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "mapped {mapped}, apart {apart}: fused != chain");
        println!("mapped {mapped}, apart {apart}: {charged} bytes charged, fused == chain");
    }
}

/// A decode QkvRopeStore node of 4 heads of 16 over 2 KV heads, f32 everything.
fn qkv_node(wq: WeightId, wk: WeightId, wv: WeightId) -> Node {
    let op = Op::QkvRopeStore(Box::new(QkvFused {
        wq,
        wk,
        wv,
        bias: None,
        norm: None,
        in_norm: None,
        rope: RopeSpec {
            style: RopeStyle::Neox,
            head_dim: 16,
            freq_base: 10000.0,
            freq_scale: 1.0,
        },
        n_head: 4,
        n_head_kv: 2,
        layer: 0,
        cache_type: GgmlType::F32,
    }));
    fused_node(op, [64, 1])
}

#[test]
fn the_fused_kv_store_refuses_a_cell_past_the_region() {
    const N_CELLS: usize = 8;
    let f32s = |n, seed| encoded(GgmlType::F32, &values(n, seed));
    let w = Weights::new(
        vec![
            ("wq", GgmlType::F32, D, 64, f32s(D * 64, 3)),
            ("wk", GgmlType::F32, D, 32, f32s(D * 32, 5)),
            ("wv", GgmlType::F32, D, 32, f32s(D * 32, 9)),
        ],
        true,
    );
    let (wq, wk, wv) = (WeightId(0), WeightId(1), WeightId(2));
    let mut be = metal();
    be.prepare_weights(&w, &w.ids()).unwrap();
    be.prepare_concat(&w, &[vec![wq, wk, wv]]).unwrap();
    assert_eq!(
        be.concats(),
        (1, 0),
        "q|k|v lie back to back: addressed in place"
    );
    let i32s = |v: i32| v.to_le_bytes().to_vec();
    let x = be.alloc(D * 4).unwrap();
    be.write(x, 0, &encoded(GgmlType::F32, &values(D, 17)))
        .unwrap();
    let (pos, cells, out) = (
        be.alloc(4).unwrap(),
        be.alloc(4).unwrap(),
        be.alloc(64 * 4).unwrap(),
    );
    let kv = minfer_graph::KvPair {
        k: be.alloc(32 * 4 * N_CELLS).unwrap(),
        v: be.alloc(32 * 4 * N_CELLS).unwrap(),
    };
    be.write(pos, 0, &i32s(5)).unwrap();
    let node = qkv_node(wq, wk, wv);
    let srcs = [Some(x), Some(pos), Some(cells)];
    let args = ExecArgs {
        srcs: &srcs,
        out: Some(out),
        kv: Some(kv),
        weights: &w,
    };
    for bad in [N_CELLS as i32, 100, -1] {
        be.write(cells, 0, &i32s(bad)).unwrap();
        let e = be.execute_node(&node, &args).unwrap_err().to_string();
        assert!(
            e.contains(&format!("cell {bad}")) && e.contains(&format!("n_ctx {N_CELLS}")),
            "{e}"
        );
    }
    // Control: the last cell of the region is stored, and only that row changes.
    be.write(cells, 0, &i32s(N_CELLS as i32 - 1)).unwrap();
    be.execute_node(&node, &args).unwrap();
    be.synchronize().unwrap();
    let mut k = vec![0u8; 32 * 4 * N_CELLS];
    be.read(kv.k, 0, &mut k).unwrap();
    let row = 32 * 4 * (N_CELLS - 1);
    assert!(
        k[..row].iter().all(|&b| b == 0),
        "rows before the cell untouched"
    );
    assert!(
        k[row..].iter().any(|&b| b != 0),
        "the cell's row was written"
    );
}
