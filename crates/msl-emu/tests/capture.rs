//! Trace capture staging (seed §4.1, §4.8) on the emulator: armed, the Metal executor blits
//! each node's output into a staging buffer inside the split's command buffer and reads it
//! back after the submit. Gates: the same graph captured on the CPU and on Metal gives the
//! same values bit for bit (exact ops: get_rows f32, add, mul), also for nodes whose buffer
//! a later node of the same split reuses, where the control (reading the node's buffer
//! after the split) gives the later node's values; staging buffers are reused at their
//! exact length once warm; disarmed, nothing is staged or captured; past the staging
//! ceiling the split is submitted early and the captures are unchanged. Node times (the
//! emulator's wall time per node's dispatches, no GPU clock): one per node in execution
//! order while armed, none disarmed; a span that ran no work gives none.

use minfer_cpu::CpuBackend;
use minfer_gguf::GgmlType;
use minfer_graph::contract::*;
use minfer_graph::{
    assign_backends, execute, fill_input, Allocator, Backend, BackendId, BufId, ExecArgs, Graph,
    GraphBuilder, InputKind, NodeId, Op, Placement, SplitKey, WeightId, WeightRef, WeightSource,
};
use minfer_metal::MetalBackend;
use minfer_msl_emu::{EmuDevice, Schedule};
use std::collections::HashMap;

const METAL: BackendId = BackendId(1);
const D: usize = 32;
const ROWS: usize = 16;
const IDS: [i32; 4] = [5, 0, 15, 5];

/// One f32 embedding table, copied by the device (no mapping).
struct Embd(Vec<u8>);

impl WeightSource for Embd {
    fn weight(&self, id: WeightId) -> Option<WeightRef<'_>> {
        (id.0 == 0).then_some(WeightRef {
            ty: GgmlType::F32,
            ne0: D,
            ne1: ROWS,
            bytes: &self.0,
        })
    }
    fn name(&self, _id: WeightId) -> &str {
        "embd"
    }
    fn id(&self, name: &str) -> Option<WeightId> {
        (name == "embd").then_some(WeightId(0))
    }
    fn len(&self) -> usize {
        1
    }
}

fn table() -> (Embd, Vec<f32>) {
    let mut s = 0x9e37_79b9u32;
    let v: Vec<f32> = (0..D * ROWS)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s % 4001) as f32 / 1000.0 - 2.0
        })
        .collect();
    (Embd(v.iter().flat_map(|x| x.to_le_bytes()).collect()), v)
}

/// x = embd[ids]; a = x + x; b = a * a; c = b + x; d = c * x; e = d * d; o = e + x.
/// `a` dies at `b` (its buffer is free for `e`); `c` and `d` run in place on `b`'s buffer.
fn graph(nt: usize) -> Graph {
    let mut g = GraphBuilder::new();
    let ids = g.input(InputKind::TokenIds, [nt, 1]);
    let x = g.op(
        "x",
        Op::GetRows {
            weight: WeightId(0),
        },
        &[ids],
        [D, nt],
    );
    let a = g.op("a", Op::Add, &[x, x], [D, nt]);
    let b = g.op("b", Op::Mul, &[a, a], [D, nt]);
    let c = g.op("c", Op::Add, &[b, x], [D, nt]);
    let d = g.op("d", Op::Mul, &[c, x], [D, nt]);
    let e = g.op("e", Op::Mul, &[d, d], [D, nt]);
    let o = g.op("o", Op::Add, &[e, x], [D, nt]);
    g.finish(o)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

struct Run {
    graph: Graph,
    captures: HashMap<NodeId, Vec<f32>>,
    /// Each captured node's output buffer as it reads after the forward.
    after: HashMap<NodeId, Vec<f32>>,
    bufs: HashMap<NodeId, (BackendId, BufId)>,
}

/// Plans and runs the graph with capture armed on every backend, then disarms.
fn run(mut bes: Vec<Box<dyn Backend>>, w: &Embd) -> Run {
    let mut g = graph(IDS.len());
    for b in &mut bes {
        b.prepare_weights(w, &[WeightId(0)]).unwrap();
        b.capture(true).unwrap();
    }
    assign_backends(&mut g, &bes, w, &Placement::everywhere(&bes)).unwrap();
    let plan = Allocator::new().plan(&g, &mut bes, &|_| Ok(0)).unwrap();
    fill_input(&g, &plan, &mut bes, InputKind::TokenIds, &IDS).unwrap();
    execute(&g, &plan, &mut bes, w, &minfer_graph::RowClasses::default()).unwrap();
    let mut captures = HashMap::new();
    for b in &mut bes {
        for (id, v) in b.take_captures().unwrap() {
            assert!(
                captures.insert(id, v).is_none(),
                "node {id:?} captured twice"
            );
        }
        assert!(b.take_captures().unwrap().is_empty(), "a take empties");
    }
    let (mut after, mut bufs) = (HashMap::new(), HashMap::new());
    for id in captures.keys() {
        let (be, buf) = plan.node_buf[id.index()].unwrap();
        let n = g.node(*id).n_elems();
        let mut raw = vec![0u8; 4 * n];
        let b = bes.iter_mut().find(|b| b.id() == be).unwrap();
        b.read(buf, 0, &mut raw).unwrap();
        let v = raw
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        after.insert(*id, v);
        bufs.insert(*id, (be, buf));
    }
    for b in &mut bes {
        b.capture(false).unwrap();
    }
    Run {
        graph: g,
        captures,
        after,
        bufs,
    }
}

fn metal() -> MetalBackend<EmuDevice> {
    MetalBackend::new(EmuDevice::new(Schedule::Forward), METAL, "metal-emu").with_weight_copy(true)
}

#[test]
fn metal_captures_equal_the_cpu_bit_for_bit_even_for_reused_buffers() {
    let (w, table) = table();
    let cpu = run(vec![Box::new(CpuBackend::new(1))], &w);
    let mtl = run(vec![Box::new(metal()), Box::new(CpuBackend::new(1))], &w);
    // Every executed f32 node is captured once, the host-filled input never.
    let names = |r: &Run| {
        let mut v: Vec<(NodeId, String)> = r
            .captures
            .keys()
            .map(|id| (*id, r.graph.node(*id).name.clone()))
            .collect();
        v.sort();
        v.into_iter().map(|(_, n)| n).collect::<Vec<_>>()
    };
    assert_eq!(names(&cpu), ["x", "a", "b", "c", "d", "e", "o"]);
    assert_eq!(names(&mtl), names(&cpu));
    assert!(
        mtl.graph
            .nodes
            .iter()
            .filter(|n| !matches!(n.op, Op::Input(_)))
            .all(|n| n.backend == Some(METAL)),
        "the Metal run really ran on Metal"
    );
    for (id, want) in &cpu.captures {
        let got = &mtl.captures[id];
        assert_eq!(bits(got), bits(want), "node {}", cpu.graph.node(*id).name);
    }
    // The captures hold the values: x is the table's rows, a = x + x.
    let x: Vec<f32> = IDS
        .iter()
        .flat_map(|&r| table[r as usize * D..(r as usize + 1) * D].to_vec())
        .collect();
    let by_name = |r: &Run, n: &str| {
        let id = r.graph.nodes.iter().find(|m| m.name == n).unwrap().id;
        r.captures[&id].clone()
    };
    assert_eq!(bits(&by_name(&mtl, "x")), bits(&x));
    let a: Vec<f32> = x.iter().map(|v| v + v).collect();
    assert_eq!(bits(&by_name(&mtl, "a")), bits(&a));
    // Control: on both backends some node's buffer is reused by a later node of the same
    // split, and reading it after the split gives the last writer's values, not the node's.
    for r in [&cpu, &mtl] {
        let mut reused = 0;
        for (id, (be, buf)) in &r.bufs {
            let last = r
                .bufs
                .iter()
                .filter(|(_, b)| **b == (*be, *buf))
                .map(|(m, _)| *m)
                .max()
                .unwrap();
            if last == *id {
                assert_eq!(bits(&r.after[id]), bits(&r.captures[id]));
                continue;
            }
            reused += 1;
            let name = &r.graph.node(*id).name;
            assert_eq!(bits(&r.after[id]), bits(&r.captures[&last]), "{name}");
            assert_ne!(
                bits(&r.after[id]),
                bits(&r.captures[id]),
                "{name}: its buffer after the split is not its own output"
            );
        }
        // a's buffer goes to e, b's holds c and then d (in place).
        assert!(reused >= 3, "only {reused} nodes share a buffer");
    }
}

/// Runs `nodes` of `g` (indices) as one split with the given (srcs, out) buffers.
fn split(
    be: &mut MetalBackend<EmuDevice>,
    g: &Graph,
    w: &Embd,
    nodes: &[(usize, Vec<BufId>, BufId)],
) {
    let srcs: Vec<Vec<Option<BufId>>> = nodes
        .iter()
        .map(|(_, s, _)| s.iter().copied().map(Some).collect())
        .collect();
    let run: Vec<_> = nodes.iter().map(|(i, _, _)| &g.nodes[*i]).collect();
    let args: Vec<ExecArgs> = nodes
        .iter()
        .zip(&srcs)
        .map(|((_, _, out), srcs)| ExecArgs {
            srcs,
            out: Some(*out),
            kv: None,
            weights: w,
        })
        .collect();
    be.execute_split(SplitKey::UNPLANNED, &run, &args).unwrap();
}

#[test]
fn staging_is_reused_at_exact_length_and_costs_nothing_disarmed() {
    let (w, _) = table();
    let g = graph(IDS.len());
    let mut be = metal();
    be.prepare_weights(&w, &[WeightId(0)]).unwrap();
    let bytes = 4 * D * IDS.len();
    let ids = be.alloc(4 * IDS.len()).unwrap();
    let ids_bytes: Vec<u8> = IDS.iter().flat_map(|v| v.to_le_bytes()).collect();
    be.write(ids, 0, &ids_bytes).unwrap();
    let (p, q) = (be.alloc(bytes).unwrap(), be.alloc(bytes).unwrap());
    // x -> p; a = x + x -> q; b = a * a -> p (x's buffer, reused in the split).
    let nodes = vec![(1, vec![ids], p), (2, vec![p, p], q), (3, vec![q, q], p)];
    split(&mut be, &g, &w, &nodes);
    assert!(be.take_captures().unwrap().is_empty(), "disarmed: nothing");
    assert_eq!(be.staging_buffers_made(), 0, "disarmed: no staging");
    be.capture(true).unwrap();
    split(&mut be, &g, &w, &nodes);
    let first = be.take_captures().unwrap();
    let made = be.staging_buffers_made();
    assert_eq!(made, 3, "one staging buffer per node in flight");
    for _ in 0..3 {
        split(&mut be, &g, &w, &nodes);
        let again = be.take_captures().unwrap();
        assert_eq!(again.len(), 3);
        for ((i, v), (j, u)) in first.iter().zip(&again) {
            assert_eq!((i, bits(v)), (j, bits(u)));
        }
    }
    assert_eq!(
        be.staging_buffers_made(),
        made,
        "warm: no new staging buffer"
    );
    // x's capture is x, though p holds b after the split (the control).
    let mut raw = vec![0u8; bytes];
    be.read(p, 0, &mut raw).unwrap();
    let p_after: Vec<f32> = raw
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(first[0].0, NodeId(1));
    assert_eq!(bits(&p_after), bits(&first[2].1), "p holds b");
    assert_ne!(
        bits(&p_after),
        bits(&first[0].1),
        "but x was captured before b"
    );
    // Disarmed again: nothing captured, no staging made.
    be.capture(false).unwrap();
    split(&mut be, &g, &w, &nodes);
    assert!(be.take_captures().unwrap().is_empty());
    assert_eq!(be.staging_buffers_made(), made);
    // A ceiling of one node's output: each blit is submitted and read back at once, so one
    // staging buffer serves the split, and the values are the same.
    let mut small = metal().with_staging_ceiling(bytes);
    small.prepare_weights(&w, &[WeightId(0)]).unwrap();
    let ids = small.alloc(4 * IDS.len()).unwrap();
    small.write(ids, 0, &ids_bytes).unwrap();
    let (p, q) = (small.alloc(bytes).unwrap(), small.alloc(bytes).unwrap());
    let nodes = vec![(1, vec![ids], p), (2, vec![p, p], q), (3, vec![q, q], p)];
    small.capture(true).unwrap();
    split(&mut small, &g, &w, &nodes);
    let flushed = small.take_captures().unwrap();
    assert_eq!(small.staging_buffers_made(), 1);
    assert_eq!(flushed.len(), first.len());
    for ((i, v), (j, u)) in first.iter().zip(&flushed) {
        assert_eq!((i, bits(v)), (j, bits(u)));
    }
}

/// Node times as a trace wants them: one per node that ran work, the nodes in `want` order
/// (execution order), each non-zero.
fn times_cover(times: &[(NodeId, u64)], want: &[u32]) -> Result<(), String> {
    let ids: Vec<u32> = times.iter().map(|(id, _)| id.0).collect();
    if ids != want {
        return Err(format!("timed nodes {ids:?}, ran {want:?}"));
    }
    match times.iter().find(|(_, ns)| *ns == 0) {
        Some((id, _)) => Err(format!("node {} has a zero time", id.0)),
        None => Ok(()),
    }
}

#[test]
fn node_times_cover_each_node_in_execution_order_only_while_armed() {
    let (w, _) = table();
    let g = graph(IDS.len());
    let mut be = metal();
    let what = be
        .node_time_source()
        .expect("the emulated device times its nodes");
    assert!(
        what.contains("emulator") && what.contains("not a GPU"),
        "{what}"
    );
    be.prepare_weights(&w, &[WeightId(0)]).unwrap();
    let bytes = 4 * D * IDS.len();
    let ids = be.alloc(4 * IDS.len()).unwrap();
    let ids_bytes: Vec<u8> = IDS.iter().flat_map(|v| v.to_le_bytes()).collect();
    be.write(ids, 0, &ids_bytes).unwrap();
    let (p, q) = (be.alloc(bytes).unwrap(), be.alloc(bytes).unwrap());
    let nodes = vec![(1, vec![ids], p), (2, vec![p, p], q), (3, vec![q, q], p)];
    split(&mut be, &g, &w, &nodes);
    be.synchronize().unwrap();
    assert!(be.take_node_times().is_empty(), "disarmed: no times");
    be.capture(true).unwrap();
    split(&mut be, &g, &w, &nodes);
    be.synchronize().unwrap();
    let times = be.take_node_times();
    times_cover(&times, &[1, 2, 3]).unwrap();
    // The control: the check fails when a node's time is missing or zero.
    assert!(times_cover(&times[1..], &[1, 2, 3]).is_err());
    let mut zero = times.clone();
    zero[1].1 = 0;
    assert!(times_cover(&zero, &[1, 2, 3]).is_err());
    assert!(be.take_node_times().is_empty(), "a take empties");
    // Execution order, not id order: the same nodes run b then a.
    let backwards = vec![(3, vec![q, q], p), (2, vec![p, p], q)];
    split(&mut be, &g, &w, &backwards);
    be.synchronize().unwrap();
    times_cover(&be.take_node_times(), &[3, 2]).unwrap();
    // Disarmed again: nothing.
    be.capture(false).unwrap();
    split(&mut be, &g, &w, &nodes);
    be.synchronize().unwrap();
    assert!(be.take_node_times().is_empty());
    // A staging ceiling of one node's output submits after each node: the spans of every
    // submit are kept, in order.
    let mut small = metal().with_staging_ceiling(bytes);
    small.prepare_weights(&w, &[WeightId(0)]).unwrap();
    let ids = small.alloc(4 * IDS.len()).unwrap();
    small.write(ids, 0, &ids_bytes).unwrap();
    let (p, q) = (small.alloc(bytes).unwrap(), small.alloc(bytes).unwrap());
    let nodes = vec![(1, vec![ids], p), (2, vec![p, p], q), (3, vec![q, q], p)];
    small.capture(true).unwrap();
    split(&mut small, &g, &w, &nodes);
    small.synchronize().unwrap();
    times_cover(&small.take_node_times(), &[1, 2, 3]).unwrap();
}

#[test]
fn the_emulator_times_a_span_only_when_it_ran_work() {
    use minfer_metal::Device;
    let dev = EmuDevice::new(Schedule::Forward);
    let (a, b) = (dev.new_buffer(64).unwrap(), dev.new_buffer(64).unwrap());
    dev.begin_span(7).unwrap();
    dev.end_span().unwrap();
    dev.begin_span(8).unwrap();
    dev.copy_rows(&a, &b, 16, 0, 0, 4).unwrap();
    dev.end_span().unwrap();
    // Work outside any span is nobody's.
    dev.copy_rows(&a, &b, 16, 0, 0, 4).unwrap();
    assert!(dev.take_spans().is_empty(), "nothing ran before the submit");
    dev.submit().unwrap();
    let spans = dev.take_spans();
    assert_eq!(spans.iter().map(|s| s.0).collect::<Vec<_>>(), [8]);
    assert!(spans[0].1 > 0);
    assert!(dev.take_spans().is_empty(), "a take empties");
}
