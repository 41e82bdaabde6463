//! Assignment, fusion, allocation, scheduling and caching on small graphs run by a mock
//! elementwise backend (two instances with different ids force multi-split execution).

use minfer_gguf::GgmlType;
use minfer_graph::{
    alloc::size_class, assign_backends, execute, fill_input, fuse, read_output, sched::splits,
    Allocator, Backend, BackendId, BufId, Capabilities, DType, Error, ExecArgs, Executor, FusedOp,
    FusionConfig, Graph, GraphBuilder, GraphCache, GraphParams, Identity, InputKind, Memory, Node,
    Op, Placement, PlanId, RowClasses, SplitKey, Support, WeightId, WeightRef, WeightSource,
    WindowLayout,
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

fn everywhere(backends: &[Box<dyn Backend>]) -> Placement {
    Placement::everywhere(backends)
}

/// Runs Input/Add/Mul/Silu/SwiGLU on host vectors; `only_add` refuses everything but Add.
struct Mock {
    id: u16,
    only_add: bool,
    fused: bool,
    bufs: Vec<Option<Vec<f32>>>,
    log: Arc<Mutex<Vec<String>>>,
    /// Work submitted but not yet run, as a device queue holds it: (node, srcs, out).
    pending: Vec<(Node, Vec<Option<BufId>>, Option<BufId>)>,
    /// Queue work instead of running it at once (a device with asynchronous execution).
    deferred: bool,
    /// A broken device whose reads do not wait for queued work (the control).
    stale_reads: bool,
    /// A weight type this device cannot hold.
    refuse: Option<GgmlType>,
    /// Weights handed over by `prepare_weights`.
    prepared: Arc<Mutex<Vec<WeightId>>>,
    /// The key of every split run, and every plan the backend was told to forget.
    splits: Arc<Mutex<Vec<SplitKey>>>,
    forgotten: Arc<Mutex<Vec<PlanId>>>,
}

impl Mock {
    fn new(id: u16, log: &Arc<Mutex<Vec<String>>>) -> Mock {
        Mock {
            id,
            only_add: false,
            fused: true,
            bufs: Vec::new(),
            log: log.clone(),
            pending: Vec::new(),
            deferred: false,
            stale_reads: false,
            refuse: None,
            prepared: Arc::default(),
            splits: Arc::default(),
            forgotten: Arc::default(),
        }
    }

    fn flush(&mut self) -> minfer_graph::Result<()> {
        for (node, srcs, out) in std::mem::take(&mut self.pending) {
            self.run(&node, &srcs, out)?;
        }
        Ok(())
    }

    fn run(
        &mut self,
        node: &Node,
        srcs: &[Option<BufId>],
        out_buf: Option<BufId>,
    ) -> minfer_graph::Result<()> {
        let n = node.n_elems();
        // Inputs are i32 bit patterns; the mock reads them as integers.
        let get = |i: usize| -> Vec<f32> {
            let b = self.bufs[srcs[i].unwrap().0 as usize].as_ref().unwrap();
            b[..n].to_vec()
        };
        let val = |v: f32| v.to_bits() as i32 as f32;
        let a = get(0);
        let out: Vec<f32> = match node.op {
            Op::Add => a.iter().zip(get(1)).map(|(x, y)| x + y).collect(),
            Op::Mul => a.iter().zip(get(1)).map(|(x, y)| x * y).collect(),
            Op::Silu => a.iter().map(|x| silu(val(*x))).collect(),
            Op::SwiGLU => a
                .iter()
                .zip(get(1))
                .map(|(x, y)| silu(val(*x)) * y)
                .collect(),
            _ => {
                return Err(Error::Exec {
                    node: node.name.clone(),
                    problem: "mock".into(),
                })
            }
        };
        let o = self.bufs[out_buf.unwrap().0 as usize].as_mut().unwrap();
        o[..n].copy_from_slice(&out);
        Ok(())
    }
}

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

impl Identity for Mock {
    fn id(&self) -> BackendId {
        BackendId(self.id)
    }

    fn name(&self) -> &str {
        if self.id == 0 {
            "mock0"
        } else {
            "mock1"
        }
    }
}

impl Memory for Mock {
    fn can_hold(&self, w: &WeightRef) -> Support {
        match self.refuse {
            Some(t) if t == w.ty => Err(format!("no {t} kernels").into()),
            _ => Ok(()),
        }
    }

    fn prepare_weights(
        &mut self,
        _: &dyn WeightSource,
        ids: &[WeightId],
    ) -> minfer_graph::Result<()> {
        self.prepared.lock().unwrap().extend_from_slice(ids);
        Ok(())
    }

    fn alloc(&mut self, bytes: usize) -> minfer_graph::Result<BufId> {
        self.bufs.push(Some(vec![0.0; bytes / 4]));
        Ok(BufId(self.bufs.len() as u32 - 1))
    }

    fn free(&mut self, buf: BufId) {
        self.bufs[buf.0 as usize] = None;
    }

    fn write(&mut self, buf: BufId, offset: usize, data: &[u8]) -> minfer_graph::Result<()> {
        let b = self.bufs[buf.0 as usize].as_mut().unwrap();
        for (i, c) in data.chunks_exact(4).enumerate() {
            b[offset / 4 + i] = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        }
        Ok(())
    }

    fn read(&mut self, buf: BufId, offset: usize, out: &mut [u8]) -> minfer_graph::Result<()> {
        if !self.stale_reads {
            self.flush()?;
        }
        let b = self.bufs[buf.0 as usize].as_ref().unwrap();
        for (i, c) in out.chunks_exact_mut(4).enumerate() {
            c.copy_from_slice(&b[offset / 4 + i].to_le_bytes());
        }
        Ok(())
    }

    fn read_begin(
        &mut self,
        buf: BufId,
        offset: usize,
        len: usize,
    ) -> minfer_graph::Result<minfer_graph::ReadTicket> {
        self.log.lock().unwrap().push(format!("{}:begin", self.id));
        Ok(minfer_graph::ReadTicket {
            buf,
            offset,
            len,
            token: 7,
        })
    }

    fn read_finish(
        &mut self,
        t: minfer_graph::ReadTicket,
        out: &mut [u8],
    ) -> minfer_graph::Result<()> {
        assert_eq!(t.token, 7, "a ticket of this backend");
        self.log.lock().unwrap().push(format!("{}:finish", self.id));
        self.read(t.buf, t.offset, out)
    }
}

impl Capabilities for Mock {
    fn supports_op(&self, op: &Op, _: DType, _: &dyn WeightSource) -> Support {
        let ok = match op {
            Op::Add => true,
            Op::Input(_) | Op::Mul | Op::Silu | Op::SwiGLU => !self.only_add,
            _ => false,
        };
        if ok {
            Ok(())
        } else {
            Err(format!("no {} kernel", op.name()).into())
        }
    }

    fn supports_fused(&self, _: FusedOp) -> Support {
        if self.fused {
            Ok(())
        } else {
            Err("fusions off".into())
        }
    }
}

impl Executor for Mock {
    fn execute_node(&mut self, node: &Node, args: &ExecArgs) -> minfer_graph::Result<()> {
        self.log
            .lock()
            .unwrap()
            .push(format!("{}:{}", self.id, node.name));
        if self.deferred {
            self.pending
                .push((node.clone(), args.srcs.to_vec(), args.out));
            return Ok(());
        }
        self.run(node, args.srcs, args.out)
    }

    fn execute_split(
        &mut self,
        key: SplitKey,
        nodes: &[&Node],
        args: &[ExecArgs],
    ) -> minfer_graph::Result<()> {
        self.splits.lock().unwrap().push(key);
        self.log
            .lock()
            .unwrap()
            .push(format!("{}:split{}", self.id, nodes.len()));
        for (n, a) in nodes.iter().zip(args) {
            self.execute_node(n, a)?;
        }
        Ok(())
    }

    fn forget_plan(&mut self, plan: PlanId) {
        self.forgotten.lock().unwrap().push(plan);
    }

    fn synchronize(&mut self) -> minfer_graph::Result<()> {
        self.flush()?;
        self.log.lock().unwrap().push(format!("{}:sync", self.id));
        Ok(())
    }
}

/// out = silu(a) * silu(a) ... : `Mul(Silu(a), s2) + s2` where s2 = Silu(a) used twice.
fn ffn_like(n: usize) -> Graph {
    let mut g = GraphBuilder::new();
    let a = g.input(InputKind::TokenIds, [n, 1]);
    let b = g.input(InputKind::Positions, [n, 1]);
    let s = g.op("silu", Op::Silu, &[a], [n, 1]);
    let s2 = g.op("silu2", Op::Silu, &[b], [n, 1]);
    let m = g.op("mul", Op::Mul, &[s, s2], [n, 1]);
    let out = g.op("add", Op::Add, &[m, s2], [n, 1]);
    g.finish(out)
}

fn run(graph: &Graph, backends: &mut [Box<dyn Backend>]) -> Vec<f32> {
    let mut alloc = Allocator::new();
    let plan = alloc.plan(graph, backends, &|_| Ok(0)).unwrap();
    let n = graph.node(graph.output).n_elems();
    let a: Vec<i32> = (0..n as i32).collect();
    let b: Vec<i32> = (0..n as i32).map(|x| 2 - x).collect();
    fill_input(graph, &plan, backends, InputKind::TokenIds, &a).unwrap();
    fill_input(graph, &plan, backends, InputKind::Positions, &b).unwrap();
    execute(graph, &plan, backends, &NoWeights, &RowClasses::default()).unwrap();
    let mut out = Vec::new();
    read_output(graph, &plan, backends, &mut out).unwrap();
    out
}

/// The ffn-like test graph of `n` elements, built (or reused) by `cache`.
fn cached(
    cache: &mut GraphCache,
    alloc: &mut Allocator,
    backends: &mut [Box<dyn Backend>],
    placement: &Placement,
    n: usize,
) -> Vec<u32> {
    let p = GraphParams {
        n_tokens: n,
        n_out: 1,
        n_ctx: 16,
        cache_type: GgmlType::F32,
        window: WindowLayout::Span,
        prompt_rows: false,
    };
    let build = |p: &GraphParams| Ok(ffn_like(p.n_tokens));
    let (_, plan) = cache
        .get_or_build(
            &p,
            &build,
            &|_| Ok(0),
            backends,
            &NoWeights,
            placement,
            alloc,
        )
        .unwrap();
    plan.node_buf.iter().flatten().map(|b| b.1 .0).collect()
}

fn expected(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let s2 = silu(2.0 - i as f32);
            silu(i as f32) * s2 + s2
        })
        .collect()
}

#[test]
fn swiglu_fusion_rewrites_sole_consumer_only_and_keeps_results() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut backends: Vec<Box<dyn Backend>> = vec![Box::new(Mock::new(0, &log))];
    let mut g = ffn_like(8);
    assign_backends(&mut g, &backends, &NoWeights, &everywhere(&backends)).unwrap();
    // silu2 has two consumers, so only `silu` may fuse.
    assert_eq!(fuse(&mut g, &backends, &NoWeights, FusionConfig::ALL), 1);
    let mul = g.nodes.iter().find(|n| n.name == "mul").unwrap();
    assert_eq!(mul.op, Op::SwiGLU);
    assert!(g.nodes.iter().find(|n| n.name == "silu").unwrap().dead);
    let out = run(&g, &mut backends);
    for (a, b) in out.iter().zip(expected(8)) {
        assert!((a - b).abs() < 1e-6);
    }
    // Control: without fused support nothing is rewritten.
    let mut nf = Mock::new(0, &log);
    nf.fused = false;
    let nf: Vec<Box<dyn Backend>> = vec![Box::new(nf)];
    let mut g = ffn_like(8);
    assign_backends(&mut g, &nf, &NoWeights, &everywhere(&nf)).unwrap();
    assert_eq!(fuse(&mut g, &nf, &NoWeights, FusionConfig::ALL), 0);
}

#[test]
fn priority_assignment_splits_and_stages_across_backends() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut hi = Mock::new(1, &log);
    hi.only_add = true;
    let mut backends: Vec<Box<dyn Backend>> = vec![Box::new(hi), Box::new(Mock::new(0, &log))];
    let mut g = ffn_like(8);
    assign_backends(&mut g, &backends, &NoWeights, &everywhere(&backends)).unwrap();
    let be = |name: &str| {
        g.nodes
            .iter()
            .find(|n| n.name == name)
            .unwrap()
            .backend
            .unwrap()
    };
    assert_eq!(
        be("add"),
        BackendId(1),
        "the first backend (the higher priority) takes what it supports"
    );
    assert_eq!(be("mul"), BackendId(0));
    assert_eq!(splits(&g).len(), 2);
    let out = run(&g, &mut backends);
    for (a, b) in out.iter().zip(expected(8)) {
        assert!((a - b).abs() < 1e-6, "{a} vs {b}");
    }
    let log = log.lock().unwrap();
    // Two splits, each run whole; the values the add needs are read in two phases: begun
    // after backend 0's split was submitted, finished before backend 1's split; every
    // backend syncs once, at the end.
    let at = |s: &str| {
        log.iter()
            .position(|l| l == s)
            .unwrap_or_else(|| panic!("{s} not in {log:?}"))
    };
    assert!(at("0:split3") < at("0:mul") && at("0:mul") < at("0:begin"));
    assert!(at("0:begin") < at("0:finish") && at("0:finish") < at("1:split1"));
    assert!(at("1:split1") < at("1:add"));
    assert_eq!(log.iter().filter(|l| l.ends_with(":sync")).count(), 2);
    assert!(at("1:add") < at("0:sync") && at("1:add") < at("1:sync"));
}

/// A device that queues work: the staged read of its value must wait for the queued work
/// that writes it. Control: a device whose reads do not wait gives stale values.
#[test]
fn cross_backend_reads_wait_for_the_work_that_writes_them() {
    for stale in [false, true] {
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut lo = Mock::new(0, &log);
        lo.deferred = true;
        lo.stale_reads = stale;
        let mut hi = Mock::new(1, &log);
        hi.only_add = true;
        let mut backends: Vec<Box<dyn Backend>> = vec![Box::new(hi), Box::new(lo)];
        let mut g = ffn_like(8);
        assign_backends(&mut g, &backends, &NoWeights, &everywhere(&backends)).unwrap();
        let out = run(&g, &mut backends);
        let right = out
            .iter()
            .zip(expected(8))
            .all(|(a, b)| (a - b).abs() < 1e-6);
        assert_eq!(right, !stale, "stale reads {stale}: {out:?}");
    }
}

#[test]
fn a_node_no_backend_supports_is_refused_by_name() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut only = Mock::new(0, &log);
    only.only_add = true;
    let backends: Vec<Box<dyn Backend>> = vec![Box::new(only)];
    let mut g = ffn_like(4);
    let err = assign_backends(&mut g, &backends, &NoWeights, &everywhere(&backends)).unwrap_err();
    assert!(
        matches!(&err, Error::Unsupported { node, .. } if node == "token_ids"),
        "{err}"
    );
}

#[test]
fn allocator_reuses_dead_buffers_aliases_sole_consumers_and_enforces_the_budget() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut backends: Vec<Box<dyn Backend>> = vec![Box::new(Mock::new(0, &log))];
    // A chain x -> silu -> silu -> ... : every silu may run in place of its input's buffer
    // except the first (its input is a graph input).
    let mut b = GraphBuilder::new();
    let x = b.input(InputKind::TokenIds, [1024, 1]);
    let y = b.input(InputKind::Positions, [1024, 1]);
    let s1 = b.op("s1", Op::Silu, &[x], [1024, 1]);
    let s2 = b.op("s2", Op::Silu, &[s1], [1024, 1]);
    let m = b.op("m", Op::Mul, &[s2, y], [1024, 1]);
    // `m` has two consumers: neither may alias it.
    let a1 = b.op("a1", Op::Add, &[m, m], [1024, 1]);
    let a2 = b.op("a2", Op::Add, &[a1, m], [1024, 1]);
    let mut g = b.finish(a2);
    assign_backends(&mut g, &backends, &NoWeights, &everywhere(&backends)).unwrap();
    let mut alloc = Allocator::new();
    let plan = alloc.plan(&g, &mut backends, &|_| Ok(0)).unwrap();
    let buf = |id: minfer_graph::NodeId| plan.node_buf[id.index()].unwrap().1;
    assert_ne!(buf(s1), buf(x), "inputs are never aliased");
    assert_eq!(buf(s2), buf(s1), "sole consumer runs in place");
    assert_eq!(buf(m), buf(s2), "sole consumer runs in place");
    assert_ne!(buf(a1), buf(m), "m has two consumers");
    assert_ne!(buf(a2), buf(m), "m is still live when a2 runs");
    // Control: the sizes a plan needs, and a budget one class short is refused with figures.
    let used = alloc.in_use(BackendId(0));
    assert_eq!(used, 5 * size_class(4096));
    let mut small = Allocator::new();
    small.set_budget(BackendId(0), used - 1);
    let err = small.plan(&g, &mut backends, &|_| Ok(0)).unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(err, Error::OverBudget { .. }) && msg.contains("MiB"),
        "{msg}"
    );
}

#[test]
fn size_classes_are_powers_of_two_then_16k_steps() {
    assert_eq!(size_class(1), 4);
    assert_eq!(size_class(5), 8);
    assert_eq!(size_class(16 << 10), 16 << 10);
    assert_eq!(size_class((16 << 10) + 1), 32 << 10);
    assert_eq!(size_class((48 << 10) + 1), 64 << 10);
    assert_eq!(size_class((64 << 10) + 1), 80 << 10);
}

#[test]
fn the_cache_reuses_a_graph_for_equal_params() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut backends: Vec<Box<dyn Backend>> = vec![Box::new(Mock::new(0, &log))];
    let mut alloc = Allocator::new();
    let mut cache = GraphCache::new(2);
    let placement = everywhere(&backends);
    for n in [4, 4, 1, 1, 1, 4] {
        cached(&mut cache, &mut alloc, &mut backends, &placement, n);
    }
    assert_eq!(cache.builds(), 2);
    cached(&mut cache, &mut alloc, &mut backends, &placement, 2);
    cached(&mut cache, &mut alloc, &mut backends, &placement, 4);
    assert_eq!(cache.builds(), 3, "capacity 2 keeps the two most recent");
    cached(&mut cache, &mut alloc, &mut backends, &placement, 1);
    assert_eq!(cache.builds(), 4, "the least recent was evicted");
}

/// Two cached plans never share a buffer (a prefill and a decode graph may both be alive),
/// and evicting a plan frees its buffers on the backend: the bytes in use drop back. (Before
/// plans owned their buffers, the second plan took the first one's dead intermediates from
/// a shared free list, which the disjointness assertion catches.)
#[test]
fn cached_plans_own_their_buffers_and_eviction_frees_them() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut backends: Vec<Box<dyn Backend>> = vec![Box::new(Mock::new(0, &log))];
    let placement = everywhere(&backends);
    let mut alloc = Allocator::new();
    let mut cache = GraphCache::new(2);
    let set = |v: Vec<u32>| v.into_iter().collect::<std::collections::BTreeSet<u32>>();
    let a = set(cached(
        &mut cache,
        &mut alloc,
        &mut backends,
        &placement,
        64,
    ));
    let after_one = alloc.in_use(BackendId(0));
    let b = set(cached(
        &mut cache,
        &mut alloc,
        &mut backends,
        &placement,
        64 * 1024,
    ));
    assert!(
        a.is_disjoint(&b),
        "two cached plans share buffers: {a:?} {b:?}"
    );
    let after_two = alloc.in_use(BackendId(0));
    assert!(after_two > after_one);
    // A third shape evicts the first (capacity 2): its bytes are freed, the new ones taken.
    cached(&mut cache, &mut alloc, &mut backends, &placement, 64);
    cached(&mut cache, &mut alloc, &mut backends, &placement, 128);
    assert_eq!(cache.len(), 2);
    cache.clear(&mut alloc, &mut backends);
    assert_eq!(
        alloc.in_use(BackendId(0)),
        0,
        "clearing the cache frees everything"
    );
}

/// Every compiled plan runs its splits under its own id — the same key at each run of a
/// cached plan, a new id for every build, never one reused after an eviction — and releasing
/// a plan tells the backend to forget it: what CUDA's graph replay is keyed by
/// (crates/cuda/src/replay.rs).
#[test]
fn plans_run_under_their_own_id_and_release_forgets_it() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let mock = Mock::new(0, &log);
    let (splits, forgotten) = (mock.splits.clone(), mock.forgotten.clone());
    let mut backends: Vec<Box<dyn Backend>> = vec![Box::new(mock)];
    let placement = everywhere(&backends);
    let mut alloc = Allocator::new();
    let mut cache = GraphCache::new(1);
    let mut forward = |n: usize| -> PlanId {
        let p = GraphParams {
            n_tokens: n,
            n_out: 1,
            n_ctx: 16,
            cache_type: GgmlType::F32,
            window: WindowLayout::Span,
            prompt_rows: false,
        };
        let build = |p: &GraphParams| Ok(ffn_like(p.n_tokens));
        let (graph, plan) = cache
            .get_or_build(
                &p,
                &build,
                &|_| Ok(0),
                &mut backends,
                &NoWeights,
                &placement,
                &mut alloc,
            )
            .unwrap();
        execute(
            graph,
            plan,
            &mut backends,
            &NoWeights,
            &RowClasses::default(),
        )
        .unwrap();
        plan.id
    };
    let a = forward(4);
    assert_eq!(forward(4), a, "a hit runs the cached plan under its id");
    let keys = std::mem::take(&mut *splits.lock().unwrap());
    assert_eq!(keys.len(), 2, "one split per run: {keys:?}");
    assert!(keys.iter().all(|k| *k == SplitKey { plan: a, split: 0 }));
    assert!(forgotten.lock().unwrap().is_empty());
    let b = forward(1);
    assert_ne!(b, a);
    assert_eq!(
        *forgotten.lock().unwrap(),
        vec![a],
        "the evicted plan is forgotten"
    );
    let c = forward(4);
    assert!(
        c != a && c != b,
        "a rebuilt plan gets a new id: {a:?} {b:?} {c:?}"
    );
}

/// Two weights, one of a type backend 1 cannot hold.
struct TwoWeights(Vec<u8>);
impl WeightSource for TwoWeights {
    fn weight(&self, id: WeightId) -> Option<WeightRef<'_>> {
        let ty = [GgmlType::F32, GgmlType::Q4K][id.index()];
        Some(WeightRef {
            ty,
            ne0: 4,
            ne1: 1,
            bytes: &self.0,
        })
    }
    fn name(&self, id: WeightId) -> &str {
        ["a.weight", "b.weight"][id.index()]
    }
    fn id(&self, name: &str) -> Option<WeightId> {
        ["a.weight", "b.weight"]
            .iter()
            .position(|n| *n == name)
            .map(|i| WeightId(i as u32))
    }
    fn len(&self) -> usize {
        2
    }
}

/// Placement is all or nothing per backend: a device that cannot hold one weight holds none,
/// is told nothing, and the report names the weight and why; the CPU-like backend gets every
/// weight once. Assignment then keeps weight-reading nodes off the refusing backend.
#[test]
fn placement_is_all_or_nothing_and_names_the_weight_that_kept_a_device_out() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let host = Mock::new(0, &log);
    let host_prepared = host.prepared.clone();
    let mut dev = Mock::new(1, &log);
    dev.refuse = Some(GgmlType::Q4K);
    let dev_prepared = dev.prepared.clone();
    let mut backends: Vec<Box<dyn Backend>> = vec![Box::new(dev), Box::new(host)];
    let w = TwoWeights(vec![0; 16]);
    let placement =
        minfer_graph::place_weights(&mut backends, &w, &[WeightId(0), WeightId(1)]).unwrap();
    assert!(placement.holds(BackendId(0)) && !placement.holds(BackendId(1)));
    assert_eq!(
        *host_prepared.lock().unwrap(),
        vec![WeightId(0), WeightId(1)]
    );
    assert!(dev_prepared.lock().unwrap().is_empty());
    let report = placement.report().join("\n");
    assert!(
        report.contains("mock1") && report.contains("b.weight") && report.contains("Q4_K"),
        "{report}"
    );
    // Control: with only the F32 weight, the device holds it.
    let p2 = minfer_graph::place_weights(&mut backends, &w, &[WeightId(0)]).unwrap();
    assert!(p2.holds(BackendId(1)));
    // A graph node reading a weight only goes where the weights are.
    let mut g = GraphBuilder::new();
    let x = g.input(InputKind::TokenIds, [4, 1]);
    let r = g.op(
        "norm",
        Op::RmsNorm {
            eps: 1e-6,
            weight: WeightId(0),
            group: 4,
        },
        &[x],
        [4, 1],
    );
    let mut g = g.finish(r);
    let err = assign_backends(&mut g, &backends, &w, &placement).unwrap_err();
    assert!(
        err.to_string()
            .contains("holds none of the model's weights"),
        "{err}"
    );
}

/// The byte cap evicts the least recently used plans while the cache holds more than it
/// allows (the newest plan always stays), freeing their buffers.
#[test]
fn the_byte_cap_evicts_old_plans() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut backends: Vec<Box<dyn Backend>> = vec![Box::new(Mock::new(0, &log))];
    let placement = everywhere(&backends);
    let mut alloc = Allocator::new();
    let p = |n| GraphParams {
        n_tokens: n,
        n_out: 1,
        n_ctx: 16,
        cache_type: GgmlType::F32,
        window: WindowLayout::Span,
        prompt_rows: false,
    };
    let build = |p: &GraphParams| Ok(ffn_like(p.n_tokens));
    let mut one = GraphCache::new(8);
    one.get_or_build(
        &p(4096),
        &build,
        &|_| Ok(0),
        &mut backends,
        &NoWeights,
        &placement,
        &mut alloc,
    )
    .unwrap();
    let big = one.bytes();
    one.clear(&mut alloc, &mut backends);
    let mut cache = GraphCache::with_byte_cap(8, big + big / 2);
    for n in [4096, 4000, 3900] {
        cache
            .get_or_build(
                &p(n),
                &build,
                &|_| Ok(0),
                &mut backends,
                &NoWeights,
                &placement,
                &mut alloc,
            )
            .unwrap();
        assert!(cache.len() == 1 && cache.bytes() <= big + big / 2);
    }
    assert_eq!(
        alloc.in_use(BackendId(0)),
        cache.bytes(),
        "evicted plans were freed"
    );
    // Control: without the cap all three stay.
    let mut all = GraphCache::new(8);
    for n in [4096, 4000, 3900] {
        all.get_or_build(
            &p(n),
            &build,
            &|_| Ok(0),
            &mut backends,
            &NoWeights,
            &placement,
            &mut alloc,
        )
        .unwrap();
    }
    assert_eq!(all.len(), 3);
}
