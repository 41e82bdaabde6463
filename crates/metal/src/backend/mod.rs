//! `MetalBackend`: the graph executor on a Metal [`Identity`] (seed §2.2, §4.1–4.9). The same
//! code drives a real GPU (crate `minfer-metal-objc`) and the MSL emulator (crate
//! `minfer-msl-emu`), so the emulator proves the executor, not just the kernels.
//!
//! Rhythm: a split's nodes are encoded into the device's pending command buffer, each
//! dispatch followed by a buffer-scope barrier (the launch fns do that), and the buffer is
//! submitted at the end of the split; `synchronize` and `Drop` submit anything pending. Host
//! reads and writes of a buffer first submit pending work (a host view is only meaningful
//! after the submit that produced it: the seed's stale-read rule). Every kernel-invariant
//! violation is an `Err` naming the node; nothing falls back to the CPU mid-run.

mod capture;
mod cells;
mod exec;
mod fused;
mod pool;
mod profile;
mod resident;

use std::time::Instant;

use minfer_gguf::GgmlType;
use minfer_graph::{
    support, BackendId, BufId, Capabilities, DType, Error as GraphError, ExecArgs, Executor,
    FusedOp, Identity, Memory, Node, NodeId, Op, Refusal, Result as GraphResult, RowClasses,
    SplitKey, Support, WeightId, WeightRef, WeightSource,
};

use crate::device::Device;
use crate::error::Error;
use crate::launch::KvType;
use capture::Staging;
use pool::Pool;
use profile::{OpProfile, TraceRing};
use resident::Residency;

/// KV element types the Metal kernels read and write.
pub const METAL_KV_TYPES: [GgmlType; 3] = [GgmlType::F32, GgmlType::F16, GgmlType::Q8_0];

pub struct MetalBackend<D: Device> {
    id: BackendId,
    name: String,
    dev: D,
    pool: Pool<D>,
    weights: Residency<D>,
    /// Attention partials, grown on demand and reused by every attention dispatch (each
    /// dispatch's combine runs, behind a barrier, before the next one writes it).
    scratch: Option<D::Buffer>,
    /// Commands encoded since the last submit.
    pending: bool,
    profile: Option<OpProfile>,
    trace: Option<TraceRing>,
    /// `MINFER_WEIGHT_COPY=1`: copy weights instead of wrapping the mapping.
    weight_copy: bool,
    /// Nodes encoded so far (tests check a device path really ran).
    encoded: u64,
    /// Trace capture staging (armed by [`minfer_graph::Executor::capture`]).
    capture: Staging<D>,
    /// Whether the device times spans ([`Device::span_clock`]): while a trace is armed each
    /// node's dispatches are one span, its node time.
    spans: bool,
    /// The classes of the forward's rows ([`Executor::set_row_classes`]): each run of one
    /// class takes its class's matmul tier and attention family.
    rows: RowClasses,
    /// `MINFER_METAL_TIER_CONTROL=by-rows`: the gates' control, tiers by the row count.
    tier_by_rows: bool,
    /// A sibling ([`Memory::sibling`]): `weights` are handles on another backend's resident
    /// weights, so `prepare_weights` and `prepare_concat` make nothing and check instead.
    shared: bool,
    /// The device budget ([`Memory::set_device_budget`]) the scratch's growth is checked
    /// against (the allocator checks the pool's buffers against the same figure).
    budget: Option<usize>,
}

impl<D: Device> MetalBackend<D> {
    /// A backend over `dev`, registered under `id` and shown as `name` (e.g. "metal",
    /// "metal-emu").
    pub fn new(dev: D, id: BackendId, name: impl Into<String>) -> Self {
        Self::with_settings(dev, id, name, &crate::MetalSettings::from_env())
    }

    /// [`MetalBackend::new`] with the knobs of `s` (what the engine instantiates).
    pub fn with_settings(
        dev: D,
        id: BackendId,
        name: impl Into<String>,
        s: &crate::MetalSettings,
    ) -> Self {
        MetalBackend {
            id,
            name: name.into(),
            pool: Pool::default(),
            weights: Residency::default(),
            scratch: None,
            pending: false,
            profile: s.op_profile.then(OpProfile::default),
            trace: s.trace_ring.then(TraceRing::default),
            weight_copy: s.weight_copy,
            encoded: 0,
            capture: Staging::default(),
            spans: dev.span_clock().is_some(),
            dev,
            rows: RowClasses::default(),
            tier_by_rows: s.tier_by_rows,
            shared: false,
            budget: None,
        }
    }

    /// The same backend copying weights (`true`) or wrapping the mapping (`false`), whatever
    /// `MINFER_WEIGHT_COPY` says; takes effect at `prepare_weights`.
    pub fn with_weight_copy(mut self, copy: bool) -> Self {
        self.weight_copy = copy;
        self
    }

    /// Nodes encoded since the backend was made.
    pub fn nodes_encoded(&self) -> u64 {
        self.encoded
    }

    /// The device buffer behind a graph buffer, read without submitting pending work: only
    /// for the stale-read gate's control arm.
    #[doc(hidden)]
    pub fn raw_buffer(&self, id: BufId) -> Option<&D::Buffer> {
        self.pool.get(id.0)
    }

    pub fn device(&self) -> &D {
        &self.dev
    }

    /// Whether the weights were copied (`MINFER_WEIGHT_COPY=1`) rather than wrapped.
    pub fn weights_copied(&self) -> bool {
        self.weights.copied
    }

    /// Weight concatenations made resident so far: (addressed in place, copied).
    pub fn concats(&self) -> (usize, usize) {
        (self.weights.concat_views, self.weights.concat_copies)
    }

    /// Whether this backend is a sibling reading another's resident weights.
    pub fn is_sibling(&self) -> bool {
        self.shared
    }

    /// The resident weights' device buffers (the part wraps, per-weight copies, vectors and
    /// concatenations), by host address: a sibling's are its origin's, the same buffers.
    pub fn weight_buffer_addresses(&self) -> Vec<usize> {
        let mut v: Vec<usize> = self
            .weights
            .buffers
            .iter()
            .map(|b| self.dev.contents(b) as usize)
            .collect();
        for r in self.weights.by_id.iter().flatten() {
            if let resident::Resident::Vector { buf, .. } = r {
                v.push(self.dev.contents(buf) as usize);
            }
        }
        v
    }

    /// Bytes the pool holds (live and free buffers; never released).
    pub fn pool_bytes(&self) -> usize {
        self.pool.held_bytes()
    }

    fn err(&self, problem: impl std::fmt::Display) -> GraphError {
        GraphError::Backend {
            backend: self.name.clone(),
            problem: problem.to_string(),
        }
    }

    fn buffer(&self, id: BufId) -> GraphResult<&D::Buffer> {
        self.pool
            .get(id.0)
            .ok_or_else(|| self.err(format!("buffer {} does not exist", id.0)))
    }

    /// Submits pending commands, bounded by the device; an error carries the device's
    /// recent dispatch labels (and, with `MINFER_TRACE`, the last nodes encoded).
    fn submit(&mut self) -> GraphResult<()> {
        if !self.pending {
            return Ok(());
        }
        self.pending = false;
        let t0 = Instant::now();
        let mut r = self.dev.submit();
        if let Some(p) = &mut self.profile {
            p.submitted(t0.elapsed());
        }
        if self.capture.armed() {
            // The staging this submit filled is read back now (and freed for reuse).
            let staged = self.capture.submitted(&self.dev, r.is_ok());
            // The device keeps only a completed submit's spans.
            for (tag, ns) in self.dev.take_spans() {
                self.capture.record_time(NodeId(tag), ns);
            }
            r = r.and(staged);
        }
        r.map_err(|e| match &self.trace {
            Some(t) => self.err(format!("{e}; {}", t.describe())),
            None => self.err(e),
        })
    }

    /// The scratch buffer, at least `bytes` long.
    fn scratch(&mut self, bytes: usize) -> Result<D::Buffer, Error>
    where
        D::Buffer: Clone,
    {
        let room = self.room();
        grown(&self.dev, &mut self.scratch, bytes, room)
    }

    /// What the budget leaves beside the pool, the weights and the scratch (None: no budget).
    pub(crate) fn room(&self) -> Option<usize> {
        let held = self.pool.held_bytes()
            + if self.shared { 0 } else { self.weights.bytes }
            + self.scratch.as_ref().map_or(0, |s| self.dev.buffer_len(s));
        self.budget.map(|b| b.saturating_sub(held))
    }

    fn kv_type(op: &'static str, ty: GgmlType) -> Result<KvType, Error> {
        match ty {
            GgmlType::F32 => Ok(KvType::F32),
            GgmlType::F16 => Ok(KvType::F16),
            GgmlType::Q8_0 => Ok(KvType::Q8_0),
            other => Err(Error::UnsupportedType {
                op,
                ty: format!("{other} KV cache"),
            }),
        }
    }
}

/// The buffer in `slot`, replaced by a larger one when it holds fewer than `bytes` (a free
/// function, so a launch can grow the scratch while other fields of the backend are borrowed).
/// `room`: what the device budget leaves (the growth is checked against it before the
/// buffer is made; None: no budget).
pub(crate) fn grown<D: Device>(
    dev: &D,
    slot: &mut Option<D::Buffer>,
    bytes: usize,
    room: Option<usize>,
) -> Result<D::Buffer, Error>
where
    D::Buffer: Clone,
{
    let old = match slot {
        Some(s) if dev.buffer_len(s) >= bytes => return Ok(s.clone()),
        Some(s) => dev.buffer_len(s),
        None => 0,
    };
    let new = bytes.max(16);
    // The old buffer is released when the new one replaces it.
    if let Some(room) = room.filter(|&r| new - old.min(new) > r) {
        let mib = |b: usize| b as f64 / (1 << 20) as f64;
        return Err(Error::OverBudget {
            what: "attention scratch",
            asked_mib: mib(new - old.min(new)),
            room_mib: mib(room),
        });
    }
    let s = dev.new_buffer(new)?;
    *slot = Some(s.clone());
    Ok(s)
}

impl<D: Device> Drop for MetalBackend<D> {
    fn drop(&mut self) {
        if let Err(e) = self.submit() {
            tracing::error!("{}: pending work failed at shutdown: {e}", self.name);
        }
        if let Some(p) = &self.profile {
            p.print("at exit");
        }
    }
}

impl<D> Identity for MetalBackend<D>
where
    D: Device + Send,
    D::Buffer: Clone + Send,
{
    fn id(&self) -> BackendId {
        self.id
    }

    fn name(&self) -> &str {
        &self.name
    }
}

impl<D> Memory for MetalBackend<D>
where
    D: Device + Send + 'static,
    D::Buffer: Clone + Send,
{
    fn can_hold(&self, w: &WeightRef) -> Support {
        if w.ne1 == 1 {
            // Gains and biases become f32 vectors at load.
            return quants_ok(w.ty).map_err(Refusal);
        }
        support(exec::matrix_refusal(&self.dev, w.ty, w.ne0))
    }

    fn prepare_weights(&mut self, weights: &dyn WeightSource, ids: &[WeightId]) -> GraphResult<()> {
        if self.shared {
            return self.check_shared(weights, ids);
        }
        self.weights =
            Residency::load(&self.dev, weights, ids, self.weight_copy).map_err(|e| self.err(e))?;
        Ok(())
    }

    fn prepare_concat(
        &mut self,
        weights: &dyn WeightSource,
        groups: &[Vec<WeightId>],
    ) -> GraphResult<()> {
        if self.shared {
            return match groups.iter().find(|g| self.weights.concat_of(g).is_none()) {
                Some(g) => Err(self.err(format!(
                    "the concatenation of {} is not among the weights this sibling shares \
                     (nothing is made a second time)",
                    g.iter()
                        .map(|&id| weights.name(id))
                        .collect::<Vec<_>>()
                        .join("|")
                ))),
                None => Ok(()),
            };
        }
        for g in groups {
            self.weights
                .concat(&self.dev, weights, g)
                .map_err(|e| self.err(e))?;
        }
        Ok(())
    }

    fn weights_bytes(&self) -> usize {
        // A sibling's weights are its origin's, charged there.
        if self.shared {
            0
        } else {
            self.weights.bytes
        }
    }

    fn sibling(&self) -> GraphResult<Box<dyn minfer_graph::Backend>> {
        let dev = self.dev.sibling().ok_or_else(|| {
            self.err(format!(
                "{} cannot make a second handle for a sibling backend",
                self.dev.name()
            ))
        })?;
        let spans = dev.span_clock().is_some();
        Ok(Box::new(MetalBackend {
            id: self.id,
            name: self.name.clone(),
            dev,
            pool: Pool::default(),
            weights: self.weights.clone(),
            scratch: None,
            pending: false,
            profile: self.profile.as_ref().map(|_| OpProfile::default()),
            trace: self.trace.as_ref().map(|_| TraceRing::default()),
            weight_copy: self.weight_copy,
            encoded: 0,
            capture: Staging::default(),
            spans,
            rows: RowClasses::default(),
            tier_by_rows: self.tier_by_rows,
            shared: true,
            budget: None,
        }))
    }

    fn free_memory(&self) -> std::result::Result<usize, Refusal> {
        self.dev.free_memory().map_err(Refusal)
    }

    fn set_device_budget(&mut self, bytes: usize) {
        // The pool's buffers are the allocator's, checked there against the same figure;
        // the attention scratch grows here and is checked against what is left.
        self.budget = Some(bytes);
    }

    fn alloc(&mut self, bytes: usize) -> GraphResult<BufId> {
        let (id, reused) = self.pool.take(&self.dev, bytes).map_err(|e| self.err(e))?;
        if reused {
            // Zeroed on the host, so no pending command may still use it.
            self.submit()?;
            let len = self.dev.buffer_len(self.buffer(BufId(id))?);
            let zeros = vec![0u8; len];
            let buf = self.buffer(BufId(id))?;
            self.dev
                .write_bytes(buf, 0, &zeros)
                .map_err(|e| self.err(e))?;
        }
        Ok(BufId(id))
    }

    fn free(&mut self, buf: BufId) {
        self.pool.give_back(&self.dev, buf.0);
    }

    fn write(&mut self, buf: BufId, offset: usize, data: &[u8]) -> GraphResult<()> {
        // A host write must not change the input of a command not yet run.
        self.submit()?;
        let b = self.buffer(buf)?;
        self.dev
            .write_bytes(b, offset, data)
            .map_err(|e| self.err(e))
    }

    fn read(&mut self, buf: BufId, offset: usize, out: &mut [u8]) -> GraphResult<()> {
        // Ordered after the pending work that may write `buf` (never a stale read).
        self.submit()?;
        let b = self.buffer(buf)?;
        self.dev.read_bytes(b, offset, out).map_err(|e| self.err(e))
    }
}

impl<D> Capabilities for MetalBackend<D>
where
    D: Device + Send,
    D::Buffer: Clone + Send,
{
    fn batch_invariant(&self) -> bool {
        // The matmul tier and the attention family follow each row's class, never the
        // forward's row count, and each is batch invariant on its own (docs/PRECISION.md,
        // "Row classes"). The gates' control chooses them by the row count again: a row's
        // bits then depend on its batch, and the engine must run exact shapes.
        !self.tier_by_rows
    }

    fn check_kv_type(&self, ty: GgmlType) -> Support {
        if METAL_KV_TYPES.contains(&ty) {
            Ok(())
        } else {
            Err(format!("{} reads f32, f16 and q8_0 KV caches", self.name).into())
        }
    }

    fn supports_op(&self, op: &Op, _dtype: DType, weights: &dyn WeightSource) -> Support {
        support(exec::op_refusal(&self.dev, op, weights))
    }

    fn supports_fused(&self, op: FusedOp) -> Support {
        match op {
            FusedOp::SwiGLU
            | FusedOp::QkvRopeStore
            | FusedOp::QkvNormRopeStore
            | FusedOp::FfnGateUp => Ok(()),
            // Not written for Metal yet: the chain runs unfused.
            FusedOp::InputNorm | FusedOp::MatMulAdd => {
                Err(format!("{op:?} is not written for Metal").into())
            }
        }
    }
}

impl<D> Executor for MetalBackend<D>
where
    D: Device + Send + 'static,
    D::Buffer: Clone + Send,
{
    fn set_row_classes(&mut self, rows: &RowClasses) {
        self.rows.clone_from(rows);
    }

    fn execute_node(&mut self, node: &Node, args: &ExecArgs) -> GraphResult<()> {
        let t0 = self.profile.as_ref().map(|_| Instant::now());
        if let Some(t) = &mut self.trace {
            t.push(&node.name);
        }
        // A node's dispatches are its span; the staging blit after them is not.
        let span = self.spans && self.capture.armed();
        let mut r = if span {
            self.dev.begin_span(node.id.0)
        } else {
            Ok(())
        };
        r = r.and_then(|_| self.encode(node, args));
        if span {
            let ended = self.dev.end_span();
            r = r.and(ended);
        }
        if self.capture.armed() && r.is_ok() {
            r = self.stage_capture(node, args);
        }
        self.pending = true;
        self.encoded += 1;
        if let (Some(p), Some(t0)) = (&mut self.profile, t0) {
            p.encoded(node.op.name(), t0.elapsed());
        }
        r.map_err(|e| GraphError::Exec {
            node: node.name.clone(),
            problem: format!("{} ({}): {e}", self.name, node.op.name()),
        })
    }

    fn execute_split(
        &mut self,
        _key: SplitKey,
        nodes: &[&Node],
        args: &[ExecArgs],
    ) -> GraphResult<()> {
        for (node, a) in nodes.iter().zip(args) {
            if let Err(e) = self.execute_node(node, a) {
                // What was encoded is valid work (KV stores among it): run it, then fail.
                let _ = self.submit();
                return Err(e);
            }
        }
        // One command buffer per split, submitted at the split boundary.
        self.submit()
    }

    fn synchronize(&mut self) -> GraphResult<()> {
        self.submit()
    }

    fn capture(&mut self, on: bool) -> GraphResult<()> {
        // What is staged in pending work belongs to the old setting: run it first.
        self.submit()?;
        self.capture.arm(on);
        Ok(())
    }

    fn take_captures(&mut self) -> GraphResult<Vec<(NodeId, Vec<f32>)>> {
        self.submit()?;
        Ok(self.capture.take())
    }

    fn take_node_times(&mut self) -> Vec<(NodeId, u64)> {
        self.capture.take_times()
    }

    fn node_time_source(&self) -> Option<&'static str> {
        self.dev.span_clock()
    }
}

impl<D: Device> MetalBackend<D> {
    /// A sibling's `prepare_weights`: every weight of `ids` must be resident in the shared
    /// weights as the model holds it (a vector of its length, a matrix of its type and
    /// shape); nothing is wrapped or copied.
    fn check_shared(&self, weights: &dyn WeightSource, ids: &[WeightId]) -> GraphResult<()> {
        for &id in ids {
            let name = weights.name(id);
            let w = weights
                .weight(id)
                .ok_or_else(|| self.err(format!("weight {name} is not in the model")))?;
            let ok = match self.weights.by_id.get(id.index()).and_then(|r| r.as_ref()) {
                Some(resident::Resident::Vector { len, .. }) => w.ne1 == 1 && *len == w.ne0,
                Some(resident::Resident::Matrix(m)) => {
                    m.ty == w.ty && m.ne0 == w.ne0 && m.ne1 == w.ne1
                }
                None => false,
            };
            if !ok {
                return Err(self.err(format!(
                    "weight {name} is not among the weights this sibling shares (nothing is \
                     made resident a second time)"
                )));
            }
        }
        Ok(())
    }
}

fn quants_ok(ty: GgmlType) -> std::result::Result<(), String> {
    if ty.is_supported() {
        Ok(())
    } else {
        Err(format!("{ty} vectors cannot be converted to f32"))
    }
}
