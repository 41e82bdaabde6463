//! The model runner: a loaded model on its backends, turning typed forward inputs into
//! logits.
//!
//! It owns what a forward needs and nothing about sequences: the backends, the mapped model
//! and its interned weight names, where each weight lives, the graph cache and the allocator
//! its plans draw from, and the output buffer. Which cells a row writes and which it reads
//! are the KV cache's answer ([`crate::kvcache`]), handed over as a [`ForwardInput`].

use crate::config::EngineConfig;
use crate::error::{Error, KvError, Result};
use crate::kvcells::CellOp;
use crate::model::{bucket, BatchLogits, ForwardInput};
use crate::weights::intern;
use crate::weights::ModelWeights;
use minfer_gguf::{GgmlType, GgufModel};
use minfer_graph::{
    cell_ops_graph, sched, Allocator, Backend, BackendId, CellWork, Graph, GraphCache, GraphParams,
    InputKind, KvLayout, KvRegion, Node, Placement, Plan, RopeSpec, RowClass, RowClasses, WeightId,
    WindowLayout, Windows, KV_MAP_RUNS,
};
use minfer_models::{build_graph, output_weight_name, HParams};
use std::collections::HashMap;
use std::sync::Arc;

// Graphs kept built (token and output buckets, both window layouts), and the most bytes of
// activation buffers their plans may hold together (each plan owns its buffers).
use crate::config::{GRAPH_CACHE, GRAPH_CACHE_BYTES};

pub(crate) struct ModelRunner {
    /// Declared before `model`: fields drop in order, and a device backend may hold
    /// zero-copy wraps of the model's mapping (and submit pending work when dropped).
    backends: Vec<Box<dyn Backend>>,
    /// Shared with a self-drafting engine over the same weights (`Engine::self_draft`): one
    /// mapping, never a second copy.
    model: Arc<GgufModel>,
    ids: HashMap<String, WeightId>,
    hp: HParams,
    output_weight: &'static str,
    placement: Placement,
    /// The layer-offload plan taken at load (None: no device backend, or one that holds
    /// none of the weights).
    offload: Option<crate::offload::Offload>,
    cache: GraphCache,
    alloc: Allocator,
    /// Positions of the context: the scratch cell padding rows use is the one past it.
    n_ctx: usize,
    /// How the context was sized (the startup line).
    kv_plan: crate::KvPlan,
    cache_type: GgmlType,
    out: BatchLogits,
    /// Every backend is batch invariant, so forwards may be padded to a bucket.
    bucketed: bool,
    /// The trace being recorded (`Engine::trace_begin`).
    trace: Option<crate::trace::Trace>,
}

/// The graph of `params`, built (assigned, fused, planned) on a miss, with the plan it runs
/// by. A free function over the fields it needs, so the caller keeps the backends free to run
/// the plan it gets back.
#[allow(clippy::too_many_arguments)]
fn graph_for<'c>(
    cache: &'c mut GraphCache,
    backends: &mut [Box<dyn Backend>],
    weights: &ModelWeights<'_>,
    hp: &HParams,
    output_weight: &'static str,
    placement: &Placement,
    alloc: &mut Allocator,
    params: &GraphParams,
    op_offload: Option<(minfer_graph::BackendId, usize)>,
) -> Result<(&'c Graph, &'c Plan)> {
    let build = |p: &GraphParams| {
        let mut g = build_graph(hp, weights, output_weight, p)
            .map_err(|e| minfer_graph::Error::Graph(e.to_string()))?;
        // A forward of prompt rows runs the CPU blocks on the device, streaming their
        // weights (a mixed forward is run as one forward per class: `ModelRunner::forward`).
        g.streamed_blocks = op_offload.filter(|_| p.prompt_rows);
        Ok(g)
    };
    // One cell past the context: the scratch cell padding rows write and read.
    let n_cells = params.n_ctx + 1;
    let kv_bytes = |n: &Node| -> minfer_graph::Result<usize> {
        let Some(ty) = n.op.kv_cache_type() else {
            return Ok(0);
        };
        let n_embd_kv = (hp.head_count_kv * hp.head_dim) as u64;
        let row = ty
            .row_bytes(n_embd_kv)
            .ok_or_else(|| minfer_graph::Error::Kv {
                layer: n.layer.unwrap_or(0),
                problem: format!("a row of {n_embd_kv} is not whole {ty} blocks"),
            })?;
        Ok(row as usize * n_cells)
    };
    Ok(cache.get_or_build(
        params, &build, &kv_bytes, backends, weights, placement, alloc,
    )?)
}

impl ModelRunner {
    /// Places the model's weights on the backends (the weights a forward reads: those of the
    /// smallest graph, which every graph reads too) and builds the concatenations the decode
    /// graph's fused nodes name, once. `plan`: the blocks on the device, whether the head is
    /// and whether the embedding is, taken as given instead of from `cfg` (a self-draft's, as
    /// its target placed them).
    pub(crate) fn new(
        mut backends: Vec<Box<dyn Backend>>,
        model: Arc<GgufModel>,
        hp: HParams,
        n_ctx: usize,
        cfg: &EngineConfig,
        plan: Option<(usize, bool, bool)>,
    ) -> Result<ModelRunner> {
        let output_weight = output_weight_name(&model);
        let names = intern(&model);
        let planned = {
            let weights = ModelWeights {
                model: &model,
                ids: &names,
            };
            // The weights a forward reads: those of the smallest graph (every graph reads
            // the same ones), each with its block, which the offload plan places.
            let mut probe = build_graph(&hp, &weights, output_weight, &probe_params(n_ctx, cfg))?;
            let planned =
                crate::offload::place(&mut backends, &weights, &probe, &hp, n_ctx, cfg, plan)?;
            // The probe is a decode graph: its fused nodes name the weight concatenations a
            // device builds now, once.
            minfer_graph::assign_backends(&mut probe, &backends, &weights, &planned.placement)?;
            minfer_graph::fuse(&mut probe, &backends, &weights, cfg.settings.fusion);
            minfer_graph::prepare_concats(&probe, &mut backends, &weights)?;
            planned
        };
        // The weights are on their devices now: the KV is sized from what is left.
        let kv_plan = kv_plan(&backends, &planned, &hp, n_ctx, cfg)?;
        let n_ctx = kv_plan.n_ctx;
        let mut cache = GraphCache::with_byte_cap(GRAPH_CACHE, GRAPH_CACHE_BYTES);
        cache.set_fusion(cfg.settings.fusion);
        let mut alloc = Allocator::new();
        if let Some(b) = cfg.memory_budget {
            for be in &backends {
                alloc.set_budget(be.id(), b);
            }
        }
        // The budget the offload plan fitted is the device allocator's limit too: every
        // device allocation is checked against it before it is made.
        // The device's own allocations outside the allocator (scratch, the stream arena, a
        // library's workspace) are checked against it by the backend.
        if let Some((device, b)) = planned.budget {
            let b = cfg.memory_budget.map_or(b, |m| m.min(b));
            alloc.set_budget(device, b);
            if let Some(be) = backends.iter_mut().find(|be| be.id() == device) {
                be.set_device_budget(b);
            }
        }
        let bucketed = backends.iter().all(|b| b.batch_invariant());
        Ok(ModelRunner {
            backends,
            model,
            ids: names,
            hp,
            output_weight,
            placement: planned.placement,
            offload: planned.offload,
            cache,
            alloc,
            n_ctx,
            kv_plan,
            cache_type: cfg.cache_type,
            out: BatchLogits::default(),
            bucketed,
            trace: None,
        })
    }

    pub(crate) fn hp(&self) -> &HParams {
        &self.hp
    }
    pub(crate) fn n_ctx(&self) -> usize {
        self.n_ctx
    }
    pub(crate) fn kv_plan(&self) -> &crate::KvPlan {
        &self.kv_plan
    }
    pub(crate) fn cache_type(&self) -> GgmlType {
        self.cache_type
    }
    pub(crate) fn model(&self) -> &GgufModel {
        &self.model
    }
    /// The mapped model, shared (a self-drafting engine reads the same mapping).
    pub(crate) fn model_arc(&self) -> Arc<GgufModel> {
        Arc::clone(&self.model)
    }
    pub(crate) fn placement(&self) -> &Placement {
        &self.placement
    }
    pub(crate) fn offload(&self) -> Option<&crate::offload::Offload> {
        self.offload.as_ref()
    }
    pub(crate) fn graph_cache(&self) -> &GraphCache {
        &self.cache
    }
    pub(crate) fn alloc(&self) -> &Allocator {
        &self.alloc
    }
    pub(crate) fn backends(&self) -> &[Box<dyn Backend>] {
        &self.backends
    }
    /// The backends, for the work that is not a forward: KV rows written by a session,
    /// captures armed by a trace.
    pub(crate) fn backends_mut(&mut self) -> &mut [Box<dyn Backend>] {
        &mut self.backends
    }
    /// The logits of the last forward.
    pub(crate) fn out(&self) -> &BatchLogits {
        &self.out
    }
    /// The logits of the last forward, for a fault a test armed to poison.
    pub(crate) fn out_mut(&mut self) -> &mut BatchLogits {
        &mut self.out
    }
    pub(crate) fn trace_slot(&mut self) -> &mut Option<crate::trace::Trace> {
        &mut self.trace
    }

    /// The KV cache's row layout, as the backends' cell operations need it.
    pub(crate) fn kv_layout(&self) -> KvLayout {
        let n_embd_kv = (self.hp.head_count_kv * self.hp.head_dim) as u64;
        KvLayout {
            cache_type: self.cache_type,
            n_head_kv: self.hp.head_count_kv,
            head_dim: self.hp.head_dim,
            // Engine::load checked that a row is whole blocks of the cache type.
            cell_bytes: self.cache_type.row_bytes(n_embd_kv).unwrap_or(0) as usize,
        }
    }

    fn rope_spec(&self) -> RopeSpec {
        RopeSpec {
            style: self.hp.arch.rope_style(),
            head_dim: self.hp.head_dim,
            freq_base: self.hp.rope_freq_base,
            freq_scale: 1.0 / self.hp.rope_scale,
        }
    }

    /// Runs cell operations on every layer's regions as a graph ([`cell_ops_graph`]): one
    /// node per layer and region, on the backend holding the region, each asked
    /// [`minfer_graph::Capabilities::supports_op`] before anything runs, planned by the
    /// allocator (whose regions they name) and run by the scheduler like a forward. Before
    /// any graph has run there are no regions and nothing stored, so nothing to move.
    pub(crate) fn apply_cell_ops(&mut self, ops: &[CellOp]) -> Result<()> {
        let work: Vec<CellWork> = ops
            .iter()
            .map(|op| match *op {
                CellOp::Copy { src, dst, n } => CellWork::Copy { src, dst, n },
                CellOp::Shift { cell, n, delta } => CellWork::Shift { cell, n, delta },
            })
            .collect();
        let regions: Vec<(usize, KvRegion)> = (0..self.hp.block_count)
            .filter_map(|l| self.alloc.kv_region(l).map(|r| (l, r)))
            .collect();
        let owners: Vec<(usize, BackendId)> =
            regions.iter().map(|(l, r)| (*l, r.backend)).collect();
        let Some(graph) = cell_ops_graph(&owners, &work, self.kv_layout(), self.rope_spec()) else {
            return Ok(());
        };
        let weights = ModelWeights {
            model: &self.model,
            ids: &self.ids,
        };
        for node in &graph.nodes {
            let layer = node.layer.unwrap_or_default();
            let be = self
                .backends
                .iter()
                .find(|b| Some(b.id()) == node.backend)
                .ok_or_else(|| KvError::Region {
                    layer,
                    problem: format!("backend {:?} of the region is gone", node.backend),
                })?;
            be.supports_op(&node.op, node.dtype, &weights)
                .map_err(|why| KvError::Region {
                    layer,
                    problem: format!("{} cannot run {}: {why}", be.name(), node.op.name()),
                })?;
        }
        let kv_bytes = |n: &Node| -> minfer_graph::Result<usize> {
            let layer = n.op.kv_layer();
            regions
                .iter()
                .find(|(l, _)| Some(*l) == layer)
                .map(|(_, r)| r.bytes)
                .ok_or_else(|| minfer_graph::Error::Graph(format!("{}: no KV region", n.name)))
        };
        let plan = self.alloc.plan(&graph, &mut self.backends, &kv_bytes)?;
        let ran = sched::execute(
            &graph,
            &plan,
            &mut self.backends,
            &weights,
            &RowClasses::default(),
        );
        self.alloc.release(plan, &mut self.backends);
        Ok(ran?)
    }

    pub(crate) fn params(
        &self,
        n_tokens: usize,
        n_out: usize,
        window: WindowLayout,
    ) -> GraphParams {
        GraphParams {
            n_tokens,
            n_out,
            n_ctx: self.n_ctx,
            cache_type: self.cache_type,
            window,
            prompt_rows: false,
        }
    }

    /// Runs `look` over the graph of a request shape (built or reused) with the weights and
    /// backends beside it: the introspection calls (node counts, dumps) see the very graph a
    /// forward of that shape runs.
    pub(crate) fn inspect<R>(
        &mut self,
        params: &GraphParams,
        look: impl FnOnce(&Graph, &ModelWeights<'_>, &[Box<dyn Backend>]) -> R,
    ) -> Result<R> {
        let weights = ModelWeights {
            model: &self.model,
            ids: &self.ids,
        };
        let op_offload = self.offload.as_ref().and_then(|o| o.op_offload);
        let (graph, _) = graph_for(
            &mut self.cache,
            &mut self.backends,
            &weights,
            &self.hp,
            self.output_weight,
            &self.placement,
            &mut self.alloc,
            params,
            op_offload,
        )?;
        Ok(look(graph, &weights, &self.backends))
    }

    /// Creates the per-layer KV regions if no graph has run yet (planning a graph allocates
    /// them).
    pub(crate) fn ensure_kv_regions(&mut self) -> Result<()> {
        // Building (or finding) the one-token graph allocates every layer's KV region.
        let p = self.params(1, 1, WindowLayout::Span);
        self.inspect(&p, |_, _, _| ())
    }

    pub(crate) fn kv_region(&self, layer: usize) -> Option<minfer_graph::KvRegion> {
        self.alloc.kv_region(layer)
    }

    /// Runs one forward of `input`'s rows; the logits are in [`ModelRunner::out`] after.
    /// Under op offload a forward holding both row classes runs as two, the generation
    /// rows' and then the prompt rows': a graph of prompt rows runs the CPU blocks on the
    /// device (streamed blocks, ADR 0014) while a generation row stays on its block's
    /// backend, so neither class's path depends on the other's presence. The rows of the
    /// two classes are different sequences', which read and write only their own cells.
    pub(crate) fn forward(&mut self, input: ForwardInput) -> Result<&BatchLogits> {
        let streams = self
            .offload
            .as_ref()
            .is_some_and(|o| o.op_offload.is_some());
        let has = |c| input.classes.contains(&c);
        if !(streams && has(RowClass::Prompt) && has(RowClass::Generation)) {
            return self.forward_one(input);
        }
        let (parts, entry_class) = split_by_class(input);
        let mut logits: [Vec<Vec<f32>>; 2] = [Vec::new(), Vec::new()];
        let mut vocab = 0;
        for (part, out) in parts.into_iter().zip(logits.iter_mut()) {
            let o = self.forward_one(part)?;
            vocab = o.vocab();
            *out = (0..o.n_entries()).map(|i| o.logits(i).to_vec()).collect();
        }
        let mut data = self.out.take_buffer();
        data.clear();
        let mut rows = Vec::with_capacity(entry_class.len());
        let mut next = [0usize; 2];
        for c in entry_class {
            let at = data.len() / vocab.max(1);
            let Some(c) = c else {
                rows.push((at, 0));
                continue;
            };
            let l = &logits[c][next[c]];
            next[c] += 1;
            data.extend_from_slice(l);
            rows.push((at, l.len() / vocab.max(1)));
        }
        self.out = BatchLogits::from_rows(data, rows, vocab);
        Ok(&self.out)
    }

    /// One forward of `input`'s rows as one graph ([`ModelRunner::forward`]).
    /// Rows are padded to a bucket when every backend is batch invariant; padding rows use
    /// token 0 at position 0, write the scratch cell past the context and attend only to it.
    fn forward_one(&mut self, input: ForwardInput) -> Result<&BatchLogits> {
        let nt = input.tokens.len();
        if nt == 0 {
            return Err(Error::BadRequest("a forward of no rows".into()));
        }
        // A backend whose arithmetic depends on the row count runs the exact shape.
        let round = |n: usize| if self.bucketed { bucket(n) } else { n };
        let n_tok = round(nt);
        let n_real_out = input.out_rows.len();
        let n_out = round(n_real_out.max(1)).min(n_tok);
        let window = if input.windows.iter().all(|w| w.len() <= 1) {
            WindowLayout::Span
        } else {
            WindowLayout::KvMap
        };
        let mut params = self.params(n_tok, n_out, window);
        params.prompt_rows = input.classes.contains(&RowClass::Prompt);
        let scratch = self.n_ctx as i32;
        let ForwardInput {
            tokens: mut ids,
            positions: mut pos,
            kv_cells: mut kvc,
            windows,
            out_rows,
            classes,
            entry_logits,
        } = input;
        let trace_tokens: Option<Vec<u32>> = self
            .trace
            .is_some()
            .then(|| ids.iter().map(|&t| t as u32).collect());
        ids.resize(n_tok, 0);
        pos.resize(n_tok, 0);
        kvc.resize(n_tok, scratch);
        let win: Vec<i32> = match window {
            WindowLayout::Span => {
                let mut w = Vec::with_capacity(2 * n_tok);
                for runs in &windows {
                    let (c, len) = runs.first().copied().unwrap_or((0, 0));
                    w.extend([c as i32, (c + len) as i32]);
                }
                for _ in nt..n_tok {
                    w.extend([scratch, scratch + 1]);
                }
                w
            }
            WindowLayout::KvMap => {
                let width = 2 * KV_MAP_RUNS;
                let mut w = vec![0i32; width * n_tok];
                for (r, runs) in windows.iter().enumerate() {
                    for (k, &(c, len)) in runs.iter().enumerate() {
                        w[r * width + 2 * k] = c as i32;
                        w[r * width + 2 * k + 1] = len as i32;
                    }
                }
                for r in nt..n_tok {
                    w[r * width] = scratch;
                    w[r * width + 1] = 1;
                }
                w
            }
        };
        // With a tail, the graph gathers the output rows; without one (n_out == n_tok) every
        // row gets logits and the real ones are picked below.
        // A forward with no logit row still computes one output row (ignored).
        let tail: Option<Vec<i32>> = (n_out < n_tok).then(|| {
            let mut t: Vec<i32> = out_rows.iter().map(|&r| r as i32).collect();
            t.resize(n_out, (nt - 1) as i32);
            t
        });
        if self.trace.is_some() {
            // Captures of an earlier, failed forward belong to no phase.
            for b in &mut self.backends {
                b.take_captures()?;
                b.take_node_times();
            }
        }
        let weights = ModelWeights {
            model: &self.model,
            ids: &self.ids,
        };
        // The plan comes back from the cache that built or found it: no second lookup.
        let op_offload = self.offload.as_ref().and_then(|o| o.op_offload);
        let (graph, plan) = graph_for(
            &mut self.cache,
            &mut self.backends,
            &weights,
            &self.hp,
            self.output_weight,
            &self.placement,
            &mut self.alloc,
            &params,
            op_offload,
        )?;
        let be = &mut self.backends;
        sched::fill_input(graph, plan, be, InputKind::TokenIds, &ids)?;
        sched::fill_input(graph, plan, be, InputKind::Positions, &pos)?;
        sched::fill_input(graph, plan, be, InputKind::KvCells, &kvc)?;
        let win_kind = match window {
            WindowLayout::Span => InputKind::AttnSpan,
            WindowLayout::KvMap => InputKind::KvMap,
        };
        // The same values reach the backends typed: none decodes the input's bytes back.
        let windows = Windows {
            layout: window,
            values: win.into(),
        };
        sched::fill_input(graph, plan, be, win_kind, &windows.values)?;
        if let Some(t) = &tail {
            sched::fill_input(graph, plan, be, InputKind::TailIds, t)?;
        }
        // Padding rows take the class of the last real row (one run more would cost a
        // launch; a padding row's result is never read).
        let last = classes[nt - 1];
        let mut rows = RowClasses {
            tokens: classes,
            outputs: Vec::new(),
        };
        rows.tokens.resize(n_tok, last);
        rows.outputs = match &tail {
            Some(t) => t.iter().map(|&r| rows.tokens[r as usize]).collect(),
            None => rows.tokens.clone(),
        };
        for b in be.iter_mut() {
            b.set_windows(&windows);
        }
        sched::execute(graph, plan, be, &weights, &rows)?;
        // The output buffer is reused from the last forward; the real rows are compacted to
        // its front in place (with a tail they are already there).
        let mut data = self.out.take_buffer();
        sched::read_output(graph, plan, be, &mut data)?;
        let vocab = self.hp.vocab_size;
        if tail.is_none() {
            // Output rows ascend, so each one moves down (or stays): in place is safe.
            for (k, &r) in out_rows.iter().enumerate() {
                if r != k {
                    data.copy_within(r * vocab..(r + 1) * vocab, k * vocab);
                }
            }
        }
        data.truncate(n_real_out * vocab);
        let mut rows = Vec::with_capacity(entry_logits.len());
        let mut at = 0;
        for n in entry_logits {
            rows.push((at, n));
            at += n;
        }
        self.out = BatchLogits::from_rows(data, rows, vocab);
        if let (Some(tokens), Some(trace)) = (trace_tokens, self.trace.as_mut()) {
            let shape = crate::trace::ForwardShape {
                tokens,
                graph_tokens: n_tok,
                graph_out: n_out,
            };
            crate::trace::record(trace, &mut self.backends, graph, &self.out, shape)?;
        }
        Ok(&self.out)
    }
}

/// `input` as two forwards, its generation rows' and its prompt rows' (each in the order
/// they had), and per entry which of the two holds its logit rows (None: it has none).
fn split_by_class(input: ForwardInput) -> ([ForwardInput; 2], Vec<Option<usize>>) {
    let part = |c: RowClass| usize::from(c == RowClass::Prompt);
    let mut parts: [ForwardInput; 2] = Default::default();
    let mut index = Vec::with_capacity(input.tokens.len());
    for (r, &c) in input.classes.iter().enumerate() {
        let p = &mut parts[part(c)];
        index.push(p.tokens.len());
        p.tokens.push(input.tokens[r]);
        p.positions.push(input.positions[r]);
        p.kv_cells.push(input.kv_cells[r]);
        p.windows.push(input.windows[r].clone());
        p.classes.push(c);
    }
    let mut entry_class = Vec::with_capacity(input.entry_logits.len());
    let mut at = 0;
    for &n in &input.entry_logits {
        let rows = &input.out_rows[at..at + n];
        at += n;
        let Some(&first) = rows.first() else {
            entry_class.push(None);
            continue;
        };
        let c = part(input.classes[first]);
        let p = &mut parts[c];
        p.out_rows.extend(rows.iter().map(|&r| index[r]));
        p.entry_logits.push(n);
        entry_class.push(Some(c));
    }
    (parts, entry_class)
}

/// The shape used to find which weights a forward reads.
/// The arena's size under `cfg.kv_size` ([`crate::kvsize`]): the free-memory mode asks the
/// device backend that holds every block (the offload plan says which) how much is free now,
/// after the weights and concatenations.
fn kv_plan(
    backends: &[Box<dyn Backend>],
    planned: &crate::offload::Planned,
    hp: &HParams,
    n_ctx: usize,
    cfg: &EngineConfig,
) -> Result<crate::KvPlan> {
    let n_embd_kv = (hp.head_count_kv * hp.head_dim) as u64;
    let row = cfg.cache_type.row_bytes(n_embd_kv).unwrap_or(0);
    let per_cell = 2 * row * hp.block_count as u64;
    let device = backends.iter().find(|b| crate::backends::is_device(b.id()));
    let device = match (device, &planned.offload) {
        (None, _) => Err("no device backend runs the model".to_string()),
        (Some(b), Some(o)) if o.device == b.name() && o.on_device == o.n_layers => Ok(b.as_ref()),
        (Some(b), Some(o)) => Err(format!(
            "{} holds {} of {} blocks (the rest keep their KV on the host)",
            b.name(),
            o.on_device,
            o.n_layers
        )),
        (Some(b), None) => Err(format!("{} holds none of the model's blocks", b.name())),
    };
    let query = |b: &dyn Backend| b.free_memory().map(|f| f as u64).map_err(|e| e.0);
    let plan = match device {
        Ok(b) => {
            let q = || query(b);
            crate::kvsize::decide(
                cfg.kv_size,
                n_ctx,
                per_cell,
                cfg.cache_type,
                hp.context_length,
                Ok((b.name(), &q)),
            )
        }
        Err(why) => crate::kvsize::decide(
            cfg.kv_size,
            n_ctx,
            per_cell,
            cfg.cache_type,
            hp.context_length,
            Err(why),
        ),
    };
    plan.map_err(Error::KvMemory)
}

fn probe_params(n_ctx: usize, cfg: &EngineConfig) -> GraphParams {
    GraphParams {
        n_tokens: 1,
        n_out: 1,
        n_ctx,
        cache_type: cfg.cache_type,
        window: WindowLayout::Span,
        prompt_rows: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two sequences' prompt rows around a third's generation row, with logits for the
    /// generation row, the second prompt's last row and none for the first prompt (a chunk
    /// not at its end): each part keeps its rows in order, its output rows renumbered.
    #[test]
    fn a_mixed_forward_splits_by_class() {
        use RowClass::{Generation as G, Prompt as P};
        let input = ForwardInput {
            tokens: vec![10, 11, 20, 30, 31, 32],
            positions: vec![0, 1, 7, 0, 1, 2],
            kv_cells: vec![100, 101, 207, 300, 301, 302],
            windows: (0..6).map(|r| vec![(r, 1)]).collect(),
            out_rows: vec![2, 5],
            classes: vec![P, P, G, P, P, P],
            entry_logits: vec![0, 1, 1],
        };
        let ([g, p], entries) = split_by_class(input);
        assert_eq!(entries, vec![None, Some(0), Some(1)]);
        assert_eq!(g.tokens, vec![20]);
        assert_eq!((g.positions[0], g.kv_cells[0]), (7, 207));
        assert_eq!(
            (g.out_rows.clone(), g.entry_logits.clone()),
            (vec![0], vec![1])
        );
        assert_eq!(g.classes, vec![G]);
        assert_eq!(p.tokens, vec![10, 11, 30, 31, 32]);
        assert_eq!(p.kv_cells, vec![100, 101, 300, 301, 302]);
        assert_eq!(p.windows[2], vec![(3, 1)]);
        assert_eq!(
            (p.out_rows.clone(), p.entry_logits.clone()),
            (vec![4], vec![1])
        );
        assert_eq!(p.classes, vec![P; 5]);
    }
}
