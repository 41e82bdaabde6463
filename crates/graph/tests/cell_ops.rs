//! A sequence's KV cell operations as a graph (ADR 0012 step 6): `cell_ops_graph` gives one
//! node per layer, region and operation, on the backend holding that layer's regions; the
//! allocator hands each node its layer's regions and owns no buffer for them; the scheduler
//! runs them as splits, in order, like a forward. A host backend (bytes in vectors) runs the
//! copies through `copy_cells_through_host` and records the rest.

use minfer_gguf::GgmlType;
use minfer_graph::{
    cell_ops_graph, copy_cells_through_host, execute, Allocator, Backend, BackendId, BufId,
    Capabilities, CellWork, DType, ExecArgs, Executor, FusedOp, Identity, KvKind, KvLayout, Memory,
    Node, Op, PlanId, RopeSpec, RopeStyle, RowClasses, SplitKey, Support, WeightId, WeightRef,
    WeightSource,
};
use std::sync::{Arc, Mutex};

struct NoWeights;
impl WeightSource for NoWeights {
    fn weight(&self, _: WeightId) -> Option<WeightRef<'_>> {
        None
    }
    fn name(&self, _: WeightId) -> &str {
        "none"
    }
    fn id(&self, _: &str) -> Option<WeightId> {
        None
    }
    fn len(&self) -> usize {
        0
    }
}

/// What the host backends saw: `backend:event` lines, the splits' keys and forgotten plans.
#[derive(Default)]
struct Seen {
    log: Vec<String>,
    splits: Vec<(u16, SplitKey)>,
    forgotten: Vec<(u16, PlanId)>,
}

struct Host {
    id: u16,
    bufs: Vec<Option<Vec<u8>>>,
    seen: Arc<Mutex<Seen>>,
    /// Refuses to re-rope (a backend without a shift kernel for the type).
    no_shift: bool,
}

impl Identity for Host {
    fn id(&self) -> BackendId {
        BackendId(self.id)
    }
    fn name(&self) -> &str {
        "host"
    }
}

impl Memory for Host {
    fn alloc(&mut self, bytes: usize) -> minfer_graph::Result<BufId> {
        self.bufs.push(Some(vec![0; bytes]));
        Ok(BufId(self.bufs.len() as u32 - 1))
    }
    fn free(&mut self, buf: BufId) {
        self.bufs[buf.0 as usize] = None;
    }
    fn write(&mut self, buf: BufId, offset: usize, data: &[u8]) -> minfer_graph::Result<()> {
        let b = self.bufs[buf.0 as usize].as_mut().unwrap();
        b[offset..offset + data.len()].copy_from_slice(data);
        Ok(())
    }
    fn read(&mut self, buf: BufId, offset: usize, out: &mut [u8]) -> minfer_graph::Result<()> {
        let b = self.bufs[buf.0 as usize].as_ref().unwrap();
        out.copy_from_slice(&b[offset..offset + out.len()]);
        Ok(())
    }
}

impl Capabilities for Host {
    fn supports_op(&self, op: &Op, _: DType, _: &dyn WeightSource) -> Support {
        match op {
            Op::KvRopeShift { .. } if self.no_shift => Err("no shift kernel".into()),
            Op::KvCopy { .. } | Op::KvRopeShift { .. } => Ok(()),
            _ => Err(format!("no {} kernel", op.name()).into()),
        }
    }
    fn supports_fused(&self, _: FusedOp) -> Support {
        Err("no fusions".into())
    }
}

impl Executor for Host {
    fn execute_node(&mut self, node: &Node, args: &ExecArgs) -> minfer_graph::Result<()> {
        let kv = args.kv.expect("a cell op gets its layer's regions");
        self.seen
            .lock()
            .unwrap()
            .log
            .push(format!("{}:{} k{} v{}", self.id, node.name, kv.k.0, kv.v.0));
        match node.op {
            Op::KvCopy {
                kind,
                layout,
                src,
                dst,
                n,
                ..
            } => {
                let region = match kind {
                    KvKind::K => kv.k,
                    KvKind::V => kv.v,
                };
                copy_cells_through_host(self, region, layout.cell_bytes, src, dst, n)
            }
            Op::KvRopeShift { .. } => Ok(()),
            _ => panic!("not a cell op: {}", node.name),
        }
    }
    fn execute_split(
        &mut self,
        key: SplitKey,
        nodes: &[&Node],
        args: &[ExecArgs],
    ) -> minfer_graph::Result<()> {
        self.seen.lock().unwrap().splits.push((self.id, key));
        for (n, a) in nodes.iter().zip(args) {
            self.execute_node(n, a)?;
        }
        Ok(())
    }
    fn forget_plan(&mut self, plan: PlanId) {
        self.seen.lock().unwrap().forgotten.push((self.id, plan));
    }
    fn synchronize(&mut self) -> minfer_graph::Result<()> {
        self.seen
            .lock()
            .unwrap()
            .log
            .push(format!("{}:sync", self.id));
        Ok(())
    }
}

const LAYOUT: KvLayout = KvLayout {
    cache_type: GgmlType::F32,
    n_head_kv: 1,
    head_dim: 2,
    cell_bytes: 8,
};
const ROPE: RopeSpec = RopeSpec {
    style: RopeStyle::Neox,
    head_dim: 2,
    freq_base: 10000.0,
    freq_scale: 1.0,
};
const CELLS: usize = 16;

fn hosts(seen: &Arc<Mutex<Seen>>) -> Vec<Box<dyn Backend>> {
    (0..2)
        .map(|id| {
            Box::new(Host {
                id,
                bufs: Vec::new(),
                seen: seen.clone(),
                no_shift: false,
            }) as Box<dyn Backend>
        })
        .collect()
}

#[test]
fn cell_ops_run_as_a_graph_on_the_backend_holding_each_layers_regions() {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let mut backends = hosts(&seen);
    let mut alloc = Allocator::new();
    let bytes = CELLS * LAYOUT.cell_bytes;
    // Layer 0's regions on backend 0, layer 1's on backend 1 (layer offload's shape).
    let kv0 = alloc
        .ensure_kv(&mut backends, 0, BackendId(0), bytes)
        .unwrap();
    let kv1 = alloc
        .ensure_kv(&mut backends, 1, BackendId(1), bytes)
        .unwrap();
    // Cell c of layer 1's K holds bytes 10c..10c+8, its V 100 + that: every cell distinct.
    let cell =
        |base: u8, c: usize| -> Vec<u8> { (0..8).map(|i| base + (10 * c + i) as u8).collect() };
    let fill = |base: u8| -> Vec<u8> { (0..CELLS).flat_map(|c| cell(base, c)).collect() };
    backends[1].write(kv1.k, 0, &fill(0)).unwrap();
    backends[1].write(kv1.v, 0, &fill(100)).unwrap();
    let in_use = (alloc.in_use(BackendId(0)), alloc.in_use(BackendId(1)));

    // Overlapping, moving up: a forward copy would read cells it already overwrote.
    let work = [
        CellWork::Copy {
            src: 0,
            dst: 4,
            n: 6,
        },
        CellWork::Shift {
            cell: 4,
            n: 2,
            delta: 3,
        },
    ];
    let g = cell_ops_graph(&[(0, BackendId(0)), (1, BackendId(1))], &work, LAYOUT, ROPE).unwrap();
    let names: Vec<&str> = g.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "L0.kv_copy_k",
            "L0.kv_copy_v",
            "L0.kv_shift_k",
            "L1.kv_copy_k",
            "L1.kv_copy_v",
            "L1.kv_shift_k"
        ]
    );
    for n in &g.nodes {
        let layer = n.layer.unwrap();
        assert_eq!(n.backend, Some(BackendId(layer as u16)), "{}", n.name);
        assert_eq!(n.op.kv_layer(), Some(layer));
        assert_eq!(n.dtype, DType::None);
        assert!(n.src.is_empty() && n.op.is_cell_op());
        assert!(backends[layer]
            .supports_op(&n.op, n.dtype, &NoWeights)
            .is_ok());
    }
    assert_eq!(g.output.index(), g.nodes.len() - 1);

    let plan = alloc.plan(&g, &mut backends, &|_| Ok(bytes)).unwrap();
    let kvs: Vec<_> = plan.kv.iter().map(|k| k.unwrap()).collect();
    assert_eq!(kvs, [kv0, kv0, kv0, kv1, kv1, kv1]);
    assert_eq!(plan.bytes(), 0, "a cell-op graph owns no buffers");
    execute(&g, &plan, &mut backends, &NoWeights, &RowClasses::default()).unwrap();
    let id = plan.id;
    alloc.release(plan, &mut backends);
    assert_eq!(
        (alloc.in_use(BackendId(0)), alloc.in_use(BackendId(1))),
        in_use,
        "the regions stay; nothing else was allocated"
    );

    let s = seen.lock().unwrap();
    let (k0, v0, k1, v1) = (kv0.k.0, kv0.v.0, kv1.k.0, kv1.v.0);
    assert_eq!(
        s.log,
        [
            format!("0:L0.kv_copy_k k{k0} v{v0}"),
            format!("0:L0.kv_copy_v k{k0} v{v0}"),
            format!("0:L0.kv_shift_k k{k0} v{v0}"),
            format!("1:L1.kv_copy_k k{k1} v{v1}"),
            format!("1:L1.kv_copy_v k{k1} v{v1}"),
            format!("1:L1.kv_shift_k k{k1} v{v1}"),
            "0:sync".to_string(),
            "1:sync".to_string(),
        ]
    );
    let keys: Vec<(u16, u32)> = s.splits.iter().map(|(b, k)| (*b, k.split)).collect();
    assert_eq!(keys, [(0, 0), (1, 1)], "one split per layer's backend");
    assert!(s.splits.iter().all(|(_, k)| k.plan == id));
    assert_eq!(s.forgotten, [(0, id), (1, id)]);
    drop(s);

    // memmove semantics: cells 4..10 now hold what cells 0..6 held; 0..4 and 10.. kept.
    for (region, base) in [(kv1.k, 0u8), (kv1.v, 100)] {
        let mut got = vec![0u8; bytes];
        backends[1].read(region, 0, &mut got).unwrap();
        for c in 0..CELLS {
            let from = if (4..10).contains(&c) { c - 4 } else { c };
            assert_eq!(
                got[c * 8..c * 8 + 8],
                cell(base, from)[..],
                "cell {c} of {base}"
            );
        }
    }
}

#[test]
fn no_regions_no_graph_and_a_refusal_is_the_backends_own() {
    let work = [CellWork::Shift {
        cell: 0,
        n: 1,
        delta: 1,
    }];
    assert!(cell_ops_graph(&[], &work, LAYOUT, ROPE).is_none());
    assert!(cell_ops_graph(&[(0, BackendId(0))], &[], LAYOUT, ROPE).is_none());
    let h = Host {
        id: 0,
        bufs: Vec::new(),
        seen: Arc::default(),
        no_shift: true,
    };
    let g = cell_ops_graph(&[(0, BackendId(0))], &work, LAYOUT, ROPE).unwrap();
    let why = h
        .supports_op(&g.nodes[0].op, DType::None, &NoWeights)
        .unwrap_err();
    assert_eq!(why.0, "no shift kernel");
}
