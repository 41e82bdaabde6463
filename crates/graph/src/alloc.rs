//! The allocator: the single owner of every buffer. Backends own pools; the allocator
//! decides which node gets which buffer.
//!
//! Rules:
//! - a plan owns every buffer it uses: two cached plans never share one (a prefill graph
//!   and a decode graph, a target and a draft, may be alive at once), and releasing a plan
//!   frees its buffers on their backends;
//! - within a plan, liveness in build order: a buffer returns to the plan's size-class free
//!   list after the last live consumer (in build order) of every node that uses it, and a
//!   later node of the same plan may take it;
//! - graph inputs and the output get buffers of their own, never recycled while the plan lives;
//! - in-place aliasing only for elementwise ops whose `src[0]` has this node as its sole
//!   consumer on the same backend (cross-backend values are staged, never aliased);
//! - persistent K/V regions per layer, created on the backend running that layer's KV ops,
//!   surviving graph rebuilds;
//! - every allocation from a backend is checked against that backend's budget first.

use crate::backend::{Backend, BackendId, BufId, KvPair, PlanId};
use crate::error::{Error, Result};
use crate::ir::{DType, Graph, InputKind, NodeId, Op};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// The next plan's id: process-wide, so no two plans alive anywhere share one (a backend
/// keyed by plan ids never confuses two engines' plans).
static NEXT_PLAN: AtomicU64 = AtomicU64::new(1);

/// Size classes: powers of two up to 16 KiB, then 16 KiB steps.
pub fn size_class(bytes: usize) -> usize {
    const STEP: usize = 16 << 10;
    let bytes = bytes.max(4);
    if bytes <= STEP {
        bytes.next_power_of_two()
    } else {
        bytes.div_ceil(STEP) * STEP
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvRegion {
    pub backend: BackendId,
    pub pair: KvPair,
    /// Bytes of each of K and V.
    pub bytes: usize,
}

/// A value copied from another backend before a node runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stage {
    /// The node that produces the value (its split begins the read).
    pub producer: NodeId,
    pub from: (BackendId, BufId),
    pub to: BufId,
    pub bytes: usize,
}

/// Buffers of one graph.
#[derive(Debug)]
pub struct Plan {
    /// This plan's identity (unique in the process, never reused): splits run under it
    /// ([`crate::SplitKey`]) and backends drop what they keep for it when it is released.
    pub id: PlanId,
    /// Output buffer of each node (None for dead nodes and region writers).
    pub node_buf: Vec<Option<(BackendId, BufId)>>,
    /// Per node, one buffer per src on the node's own backend.
    pub src_bufs: Vec<Vec<Option<BufId>>>,
    /// Per node, the copies to make before it runs.
    pub stages: Vec<Vec<Stage>>,
    /// Per node, the KV regions it touches.
    pub kv: Vec<Option<KvPair>>,
    /// Buffers this plan holds for its lifetime: (backend, buffer, size class).
    owned: Vec<(BackendId, BufId, usize)>,
}

#[derive(Default)]
pub struct Allocator {
    in_use: HashMap<BackendId, usize>,
    budget: HashMap<BackendId, usize>,
    kv: HashMap<usize, KvRegion>,
}

fn mib(b: usize) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

fn backend_mut(backends: &mut [Box<dyn Backend>], id: BackendId) -> Result<&mut Box<dyn Backend>> {
    backends
        .iter_mut()
        .find(|b| b.id() == id)
        .ok_or_else(|| Error::Graph(format!("backend {id} does not participate")))
}

struct BufRec {
    backend: BackendId,
    id: BufId,
    class: usize,
    deadline: usize,
    owned: bool,
}

impl Allocator {
    pub fn new() -> Self {
        Self::default()
    }

    /// Limits what may be allocated from `backend` (bytes, at size class).
    pub fn set_budget(&mut self, backend: BackendId, bytes: usize) {
        self.budget.insert(backend, bytes);
    }

    /// Bytes allocated from `backend` (size classes, KV regions included).
    pub fn in_use(&self, backend: BackendId) -> usize {
        self.in_use.get(&backend).copied().unwrap_or(0)
    }

    pub fn kv_region(&self, layer: usize) -> Option<KvRegion> {
        self.kv.get(&layer).copied()
    }

    fn alloc_raw(
        &mut self,
        backends: &mut [Box<dyn Backend>],
        be: BackendId,
        class: usize,
    ) -> Result<BufId> {
        // Weights a device holds count against its budget too (they share its memory).
        let used = self.in_use(be) + backend_mut(backends, be)?.weights_bytes();
        if let Some(&budget) = self.budget.get(&be) {
            if used + class > budget {
                return Err(Error::OverBudget {
                    backend: be,
                    request_mib: mib(class),
                    in_use_mib: mib(used),
                    budget_mib: mib(budget),
                });
            }
        }
        let id = backend_mut(backends, be)?.alloc(class)?;
        *self.in_use.entry(be).or_default() += class;
        Ok(id)
    }

    /// A buffer of at least `bytes` for the plan being built: recycled from the plan's own
    /// free list when one of its class is there, else allocated (and owned by the plan).
    fn take(
        &mut self,
        backends: &mut [Box<dyn Backend>],
        free: &mut FreeList,
        owned: &mut Vec<(BackendId, BufId, usize)>,
        be: BackendId,
        bytes: usize,
    ) -> Result<(BufId, usize)> {
        let class = size_class(bytes);
        if let Some(id) = free.get_mut(&(be, class)).and_then(|v| v.pop()) {
            return Ok((id, class));
        }
        let id = self.alloc_raw(backends, be, class)?;
        owned.push((be, id, class));
        Ok((id, class))
    }

    /// The layer's K/V regions, created on `be` on first use; a second request must match.
    pub fn ensure_kv(
        &mut self,
        backends: &mut [Box<dyn Backend>],
        layer: usize,
        be: BackendId,
        bytes: usize,
    ) -> Result<KvPair> {
        if let Some(r) = self.kv.get(&layer) {
            if r.backend != be || r.bytes != bytes {
                return Err(Error::Kv {
                    layer,
                    problem: format!(
                        "exists on backend {} with {} bytes each, requested on {} with {}",
                        r.backend, r.bytes, be, bytes
                    ),
                });
            }
            return Ok(r.pair);
        }
        let k = self.alloc_raw(backends, be, bytes)?;
        let v = self.alloc_raw(backends, be, bytes)?;
        let pair = KvPair { k, v };
        self.kv.insert(
            layer,
            KvRegion {
                backend: be,
                pair,
                bytes,
            },
        );
        Ok(pair)
    }

    /// Frees a plan's buffers on their backends, and tells every backend the plan is gone
    /// ([`crate::Executor::forget_plan`]).
    pub fn release(&mut self, plan: Plan, backends: &mut [Box<dyn Backend>]) {
        for b in backends.iter_mut() {
            b.forget_plan(plan.id);
        }
        for (be, id, class) in plan.owned {
            if let Ok(b) = backend_mut(backends, be) {
                b.free(id);
            }
            if let Some(u) = self.in_use.get_mut(&be) {
                *u = u.saturating_sub(class);
            }
        }
    }

    /// Assigns buffers to an assigned (and fused) graph. `kv_bytes(node)` gives the bytes of
    /// each K/V region a KV op's layer needs.
    pub fn plan(
        &mut self,
        graph: &Graph,
        backends: &mut [Box<dyn Backend>],
        kv_bytes: &dyn Fn(&crate::ir::Node) -> Result<usize>,
    ) -> Result<Plan> {
        let n = graph.nodes.len();
        let mut plan = Plan {
            id: PlanId(NEXT_PLAN.fetch_add(1, Ordering::Relaxed)),
            node_buf: vec![None; n],
            src_bufs: vec![Vec::new(); n],
            stages: vec![Vec::new(); n],
            kv: vec![None; n],
            owned: Vec::new(),
        };
        // Buffers belong to the plan from their allocation, so a failure part way through
        // (a budget) frees what was taken.
        if let Err(e) = self.plan_into(graph, backends, kv_bytes, &mut plan) {
            self.release(plan, backends);
            return Err(e);
        }
        Ok(plan)
    }

    fn plan_into(
        &mut self,
        graph: &Graph,
        backends: &mut [Box<dyn Backend>],
        kv_bytes: &dyn Fn(&crate::ir::Node) -> Result<usize>,
        plan: &mut Plan,
    ) -> Result<()> {
        let n = graph.nodes.len();
        let consumers = graph.consumers();
        let mut last_use: Vec<usize> = (0..n)
            .map(|i| consumers[i].iter().map(|c| c.index()).max().unwrap_or(i))
            .collect();
        last_use[graph.output.index()] = usize::MAX;
        for &(_, id) in &graph.inputs {
            last_use[id.index()] = usize::MAX;
        }
        let mut staged: HashMap<(NodeId, BackendId), BufId> = HashMap::new();
        let mut free = FreeList::new();
        let is_input = |id: NodeId| matches!(graph.node(id).op, Op::Input(_));
        let mut recs: Vec<BufRec> = Vec::new();
        let mut node_rec: Vec<Option<usize>> = vec![None; n];
        for node in graph.nodes.iter().filter(|n| !n.dead) {
            let i = node.id.index();
            let be = node
                .backend
                .ok_or_else(|| Error::Graph(format!("node {} has no backend", node.name)))?;
            let mut srcs = Vec::with_capacity(node.src.len());
            for &s in &node.src {
                let Some((sbe, sbuf)) = plan.node_buf[s.index()] else {
                    srcs.push(None);
                    continue;
                };
                if sbe == be {
                    srcs.push(Some(sbuf));
                    continue;
                }
                let bytes = graph.node(s).n_bytes();
                let to = match staged.get(&(s, be)) {
                    Some(&b) => b,
                    None => {
                        // Staged copies live as long as the plan: never recycled.
                        let class = size_class(bytes);
                        let b = self.alloc_raw(backends, be, class)?;
                        plan.owned.push((be, b, class));
                        staged.insert((s, be), b);
                        b
                    }
                };
                plan.stages[i].push(Stage {
                    producer: s,
                    from: (sbe, sbuf),
                    to,
                    bytes,
                });
                srcs.push(Some(to));
            }
            if let Some(layer) = node.op.kv_layer() {
                plan.kv[i] = Some(self.ensure_kv(backends, layer, be, kv_bytes(node)?)?);
            }
            if node.dtype != DType::None {
                let bytes = node.n_bytes();
                let src0 = node.src.first().copied();
                let alias = src0.filter(|&s| {
                    node.op.can_alias_src0()
                        && last_use[i] != usize::MAX
                        && !is_input(s)
                        && s != graph.output
                        && consumers[s.index()].len() == 1
                        && plan.node_buf[s.index()].map(|(b, _)| b) == Some(be)
                        && node_rec[s.index()]
                            .is_some_and(|r| recs[r].class >= bytes && !recs[r].owned)
                });
                if let Some(s) = alias {
                    let r = node_rec[s.index()].unwrap_or_default();
                    recs[r].deadline = last_use[i];
                    node_rec[i] = Some(r);
                } else {
                    // Inputs and the output are never recycled within the plan.
                    let owned = last_use[i] == usize::MAX;
                    let (id, class) = self.take(backends, &mut free, &mut plan.owned, be, bytes)?;
                    recs.push(BufRec {
                        backend: be,
                        id,
                        class,
                        deadline: last_use[i],
                        owned,
                    });
                    node_rec[i] = Some(recs.len() - 1);
                }
                let r = &recs[node_rec[i].unwrap_or_default()];
                plan.node_buf[i] = Some((r.backend, r.id));
            }
            plan.src_bufs[i] = srcs;
            // Free what dies here: buffers of srcs (and of this node if unused) whose deadline is now.
            let mut dying: Vec<usize> = node
                .src
                .iter()
                .filter_map(|s| node_rec[s.index()])
                .collect();
            dying.extend(node_rec[i]);
            dying.sort_unstable();
            dying.dedup();
            for r in dying {
                if recs[r].deadline == i && !recs[r].owned {
                    recs[r].deadline = usize::MAX - 1; // freed once
                    let (be, id, class) = (recs[r].backend, recs[r].id, recs[r].class);
                    free.entry((be, class)).or_default().push(id);
                }
            }
        }
        Ok(())
    }
}

/// Free buffers of the plan being built, per (backend, size class).
type FreeList = HashMap<(BackendId, usize), Vec<BufId>>;

impl Plan {
    /// Bytes of the buffers this plan owns (size classes; KV regions are not the plan's).
    pub fn bytes(&self) -> usize {
        self.owned.iter().map(|o| o.2).sum()
    }

    /// The backend and buffer of a graph input.
    pub fn input_buf(&self, graph: &Graph, kind: InputKind) -> Option<(BackendId, BufId)> {
        graph.input(kind).and_then(|id| self.node_buf[id.index()])
    }
}
