//! The backend contract. CPU, CUDA and Metal implement it unchanged; the graph crate only
//! sees ids, buffers and nodes.

use crate::error::{Error, Result};
use crate::ir::{DType, Node, NodeId, Op, RopeStyle, RowClasses, Windows};
use minfer_gguf::GgmlType;
use std::fmt;

/// A fixed, append-only backend id (written into session files and graph dumps).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BackendId(pub u16);

impl fmt::Display for BackendId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// A buffer in one backend's pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BufId(pub u32);

/// Persistent K and V regions of one layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvPair {
    pub k: BufId,
    pub v: BufId,
}

/// Rewrites a backend may run as one kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FusedOp {
    SwiGLU,
    /// [`crate::Op::QkvRopeStore`] without per-head norm (Qwen2, LLaMA).
    QkvRopeStore,
    /// [`crate::Op::QkvRopeStore`] with per-head Q/K norm (Qwen3).
    QkvNormRopeStore,
    /// [`crate::Op::FfnGateUp`].
    FfnGateUp,
    /// A whole-row RMSNorm folded into the fused node that consumes it
    /// ([`crate::ir::InputNorm`] on [`crate::Op::FfnGateUp`] or [`crate::Op::QkvRopeStore`]).
    InputNorm,
    /// [`crate::Op::MatMulAdd`].
    MatMulAdd,
}

/// A model weight, interned once at load: ops name weights by id, and the hot path indexes
/// a table with it (never a lookup by name).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WeightId(pub u32);

impl WeightId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// A weight's bytes as stored in the model file (zero-copy from the mmap).
#[derive(Clone, Copy, Debug)]
pub struct WeightRef<'a> {
    pub ty: GgmlType,
    /// GGUF dims, innermost first.
    pub ne0: usize,
    pub ne1: usize,
    pub bytes: &'a [u8],
}

/// Every weight of a model under its interned id.
pub trait WeightSource: Sync {
    /// The weight's bytes and shape (an index, O(1)).
    fn weight(&self, id: WeightId) -> Option<WeightRef<'_>>;
    /// Its name in the model file (messages, dumps).
    fn name(&self, id: WeightId) -> &str;
    /// The id of a named weight: graph builders resolve names once, at build time.
    fn id(&self, name: &str) -> Option<WeightId>;
    /// How many weights there are (ids are `0..len`).
    fn len(&self) -> usize;
    /// The mapped file part holding a weight: its index and the whole mapping (page-aligned
    /// base), so a device can wrap each part once, zero-copy, and address the weight at
    /// `bytes.as_ptr() - mapping.as_ptr()`. `None` when the weight is not in a mapping (the
    /// device copies it).
    fn part(&self, _id: WeightId) -> Option<(usize, &[u8])> {
        None
    }
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The RoPE of a model's K rows: what a KV shift re-applies.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeSpec {
    pub style: RopeStyle,
    pub head_dim: usize,
    pub freq_base: f32,
    pub freq_scale: f32,
}

/// The shape of one layer's K or V region, as region operations see it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KvLayout {
    pub cache_type: GgmlType,
    pub n_head_kv: usize,
    pub head_dim: usize,
    /// Bytes of one cell (one row of `n_head_kv * head_dim` values of `cache_type`).
    pub cell_bytes: usize,
}

/// A read of a backend buffer begun by [`Memory::read_begin`] and completed by
/// [`Memory::read_finish`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadTicket {
    pub buf: BufId,
    pub offset: usize,
    pub len: usize,
    /// Backend-defined (a copy queue slot, an event); 0 for synchronous backends.
    pub token: u64,
}

/// The chunk copies `(src, dst, len)` that move `n` rows from `src` to `dst` like
/// `memmove`: when each chunk is read whole before it is written, no chunk reads a row an
/// earlier chunk overwrote (ascending when moving down, descending when moving up).
pub fn move_plan(src: usize, dst: usize, n: usize, chunk: usize) -> Vec<(usize, usize, usize)> {
    let chunk = chunk.max(1);
    let mut plan = Vec::with_capacity(n.div_ceil(chunk));
    if n == 0 || src == dst {
        return plan;
    }
    if dst < src {
        let mut off = 0;
        while off < n {
            let len = chunk.min(n - off);
            plan.push((src + off, dst + off, len));
            off += len;
        }
    } else {
        let mut end = n;
        while end > 0 {
            let len = chunk.min(end);
            plan.push((src + end - len, dst + end - len, len));
            end -= len;
        }
    }
    plan
}

/// [`crate::Op::KvCopy`] through host memory: `n` cells of `region` from cell `src` to
/// `dst` (memmove semantics), in chunks of 64 cells ordered by [`move_plan`]. For a backend
/// whose memory has no device-side copy.
pub fn copy_cells_through_host<M: Memory + ?Sized>(
    mem: &mut M,
    region: BufId,
    cell_bytes: usize,
    src: usize,
    dst: usize,
    n: usize,
) -> Result<()> {
    const CHUNK: usize = 64;
    let mut tmp = vec![0u8; CHUNK.min(n) * cell_bytes];
    for (s, d, len) in move_plan(src, dst, n, CHUNK) {
        let t = &mut tmp[..len * cell_bytes];
        mem.read(region, s * cell_bytes, t)?;
        mem.write(region, d * cell_bytes, t)?;
    }
    Ok(())
}

/// The buffers one node execution reads and writes.
pub struct ExecArgs<'a> {
    /// One buffer per `node.src`, on this backend (staged if produced elsewhere); `None` for
    /// srcs that only order execution (KV stores).
    pub srcs: &'a [Option<BufId>],
    /// The output buffer (`None` for nodes that write a persistent region).
    pub out: Option<BufId>,
    /// The layer's K/V regions for KV store and attention nodes.
    pub kv: Option<KvPair>,
    pub weights: &'a dyn WeightSource,
}

/// Why a backend cannot hold a weight, run an op or a fused class, or read a KV type: the
/// one shape every capability question of the contract answers in (ADR 0012).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal(pub String);

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<String> for Refusal {
    fn from(s: String) -> Self {
        Refusal(s)
    }
}

impl From<&str> for Refusal {
    fn from(s: &str) -> Self {
        Refusal(s.into())
    }
}

/// A capability answer: yes, or no with the reason.
pub type Support = std::result::Result<(), Refusal>;

/// `Ok` for no reason, the refusal for one: the bridge from a backend's
/// `Option<String>` check.
pub fn support(refusal: Option<String>) -> Support {
    refusal.map_or(Ok(()), |r| Err(Refusal(r)))
}

/// The identity of a compiled plan: given by the allocator when it plans a graph (unique for
/// the allocator's lifetime, never reused), so a backend may key what it derives from a
/// plan's execution (CUDA: its recorded graphs) by it, and drop that when the plan is
/// released ([`Executor::forget_plan`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PlanId(pub u64);

/// One split of a plan: the plan's id and the split's index in execution order
/// ([`crate::sched::splits`]). The same plan's split `k` is the same nodes with the same
/// buffers every time it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SplitKey {
    pub plan: PlanId,
    pub split: u32,
}

impl SplitKey {
    /// A split run outside any plan (a test driving a backend directly): plan 0, which no
    /// allocator gives, so a backend keeps nothing under it.
    pub const UNPLANNED: SplitKey = SplitKey {
        plan: PlanId(0),
        split: 0,
    };
}

/// Who a backend is: its fixed id and its name (messages, dumps). The layers below build on it.
pub trait Identity {
    fn id(&self) -> BackendId;
    fn name(&self) -> &str;
}

/// The memory layer: weights placed on the backend and the buffers the allocator takes.
///
/// [`Memory::can_hold`] is asked for every weight of a model and
/// [`Memory::prepare_weights`] receives those placed on it, once, at load; the allocator then
/// takes buffers ([`Memory::alloc`]) for each planned graph; values move between backends in
/// two phases ([`Memory::read_begin`], [`Memory::read_finish`]).
pub trait Memory: Identity {
    /// Whether this backend can hold a weight (its type and shape); the refusal says why,
    /// and the engine shows it when it keeps a model off this backend.
    fn can_hold(&self, _w: &WeightRef) -> Support {
        Ok(())
    }
    /// Receives the weights placed on this backend, once, before the first forward: a device
    /// uploads or wraps them, the CPU derives what it would otherwise compute per call.
    fn prepare_weights(&mut self, _weights: &dyn WeightSource, _ids: &[WeightId]) -> Result<()> {
        Ok(())
    }
    /// Receives, once at load after [`Memory::prepare_weights`], the weight groups its fused
    /// nodes read as one matrix ([`crate::Op::concat_groups`]: rows of each group appended):
    /// a device builds each concatenation once here, never per step, and charges it in
    /// [`Memory::weights_bytes`].
    fn prepare_concat(
        &mut self,
        _weights: &dyn WeightSource,
        _groups: &[Vec<WeightId>],
    ) -> Result<()> {
        Ok(())
    }
    /// Op offload (ADR 0014): another backend will read these weights' host bytes at run
    /// time (copying a CPU block's matrices to the device per call), so a backend that would
    /// release their pages once it derived its own layout keeps them. Given once, after
    /// [`Memory::prepare_weights`]. Default: nothing released, nothing to keep.
    fn keep_weight_bytes(&mut self, _ids: &[WeightId]) {}
    /// Streamed blocks (ADR 0014): the weights this backend will copy in per forward without
    /// holding them, told once at load, so a device can make their host bytes ready for
    /// direct copies (CUDA page-locks the span of the mapping they lie in, and only it).
    /// Default: nothing to prepare.
    fn prepare_streamed(&mut self, _weights: &dyn WeightSource, _ids: &[WeightId]) -> Result<()> {
        Ok(())
    }
    /// Bytes of device memory the prepared weights occupy (wrapped or copied); memory budgets
    /// charge them next to KV regions and activations. 0 for a backend reading the host's
    /// mapping in place (the CPU).
    fn weights_bytes(&self) -> usize {
        0
    }
    /// Bytes of device memory free for this engine now (layer offload sizes its plan by it
    /// when no `--gpu-mem` is given). A failed query is the refusal with the device's reason,
    /// never a zero: the engine then refuses to guess. Default: this backend does not say.
    fn free_memory(&self) -> std::result::Result<usize, Refusal> {
        Err(Refusal(format!(
            "{} does not report its free memory",
            self.name()
        )))
    }
    /// The most device memory this backend may hold from now on, what it holds already
    /// (weights included) counted: the engine hands a device the budget its layer plan was
    /// fitted to (issue 32). The allocator checks the graph's buffers against the same
    /// budget; a backend that also allocates outside it (scratch, a library's workspace)
    /// checks each such allocation before making it and refuses with the MiB figures.
    /// Default: nothing (a backend whose device memory is all the allocator's).
    fn set_device_budget(&mut self, _bytes: usize) {}
    /// Device memory this backend allocates beside the graph's buffers, at most, when it
    /// runs (or streams) the weights `ids` in forwards of up to `n_batch` rows: layer
    /// offload charges it in the reserve its plan keeps free. Default: none.
    fn scratch_bytes(
        &self,
        _weights: &dyn WeightSource,
        _ids: &[WeightId],
        _n_batch: usize,
    ) -> u64 {
        0
    }
    /// A second backend on this one's device that reads this one's prepared weights (and
    /// concatenations) where they are, never a copy, and runs the kernels this one compiled,
    /// with its own queue, buffer pool and plan state (its buffers, KV regions and recorded
    /// splits are its own): what a second engine over the same model runs on (a self-draft,
    /// issue 31, ADR 0013). Made after [`Memory::prepare_weights`] and
    /// [`Memory::prepare_concat`]: the sibling's own `prepare_weights` and `prepare_concat`
    /// make nothing, they check that what they are handed is among the shared weights (a
    /// refusal naming the first that is not), and its [`Memory::weights_bytes`] is 0 (the
    /// memory is charged to this backend). The two run one after the other, each forward
    /// synchronised, as one engine's forwards are. Default: refused, naming the backend.
    fn sibling(&self) -> Result<Box<dyn Backend>> {
        Err(Error::Backend {
            backend: self.name().into(),
            problem: "this backend cannot share its weights with a second engine".into(),
        })
    }
    /// A zeroed buffer of `bytes` bytes.
    fn alloc(&mut self, bytes: usize) -> Result<BufId>;
    fn free(&mut self, buf: BufId);
    fn write(&mut self, buf: BufId, offset: usize, data: &[u8]) -> Result<()>;
    /// Reads buffer bytes. Ordered after all submitted work that writes `buf`: a backend with
    /// queued work waits for it first (never a stale read).
    fn read(&mut self, buf: BufId, offset: usize, out: &mut [u8]) -> Result<()>;
    /// Starts moving `len` bytes of `buf` to the host after the submitted work that writes
    /// it, without waiting (a device enqueues a copy). Default: nothing to start.
    fn read_begin(&mut self, buf: BufId, offset: usize, len: usize) -> Result<ReadTicket> {
        Ok(ReadTicket {
            buf,
            offset,
            len,
            token: 0,
        })
    }
    /// Waits for a begun read and delivers its bytes (`out.len() == ticket.len`).
    fn read_finish(&mut self, ticket: ReadTicket, out: &mut [u8]) -> Result<()> {
        if out.len() != ticket.len {
            return Err(Error::Backend {
                backend: self.name().into(),
                problem: format!("read of {} bytes delivered into {}", ticket.len, out.len()),
            });
        }
        self.read(ticket.buf, ticket.offset, out)
    }
}

/// The capability layer: every question answers in one [`Support`] (yes, or the refusal
/// with its reason), asked at assignment and fusion time, never per step.
pub trait Capabilities: Identity {
    /// Whether every row's result is independent of the other rows in a forward and of their
    /// number (see docs/PRECISION.md). A backend that copies another engine's row-count
    /// dependent arithmetic says no, and the engine then runs forwards at their exact shape
    /// (no bucket padding).
    fn batch_invariant(&self) -> bool {
        true
    }
    /// KV element types this backend's KV stores and attention read and write; the refusal
    /// says why a type is refused (given the backend's settings).
    fn check_kv_type(&self, _ty: GgmlType) -> Support {
        Ok(())
    }
    /// Whether this backend can run `op` producing `dtype` (weights resolved through `weights`,
    /// so a backend may refuse a weight type); the refusal is shown in the assignment error.
    fn supports_op(&self, op: &Op, dtype: DType, weights: &dyn WeightSource) -> Support;
    /// Whether the graph may rewrite a chain into the fused class `op` for this backend (the
    /// fused node itself is then asked of [`Capabilities::supports_op`] like any other).
    fn supports_fused(&self, op: FusedOp) -> Support;
    /// Whether a node reading weight `w`, which this backend does not hold, may run here
    /// with the weight copied in for the split that reads it (streamed blocks, ADR 0014:
    /// [`crate::Graph::streamed_blocks`]). Default: refused.
    fn can_stream(&self, _w: &WeightRef<'_>) -> Support {
        Err(format!("{} reads only the weights it holds", self.name()).into())
    }
}

/// The execution layer: the splits of a compiled plan, identified by [`SplitKey`], run on
/// buffers the memory layer gave. KV regions are changed only by nodes: a forward's KV
/// stores, and a sequence's cell operations ([`crate::Op::KvCopy`],
/// [`crate::Op::KvRopeShift`] in the graph [`crate::cells::cell_ops_graph`] builds), besides
/// host reads and writes (sessions).
pub trait Executor: Memory {
    /// The classes of the next forward's rows, given before its first split runs. A backend
    /// whose arithmetic differs by class (docs/PRECISION.md, "Row classes") chooses each
    /// node's kernels from them; one whose arithmetic is the same for both ignores them
    /// (the default).
    fn set_row_classes(&mut self, _rows: &RowClasses) {}
    /// The next forward's attention windows, typed (the values its window input holds),
    /// given before its first split by the engine that filled the input; a backend that
    /// checks windows or sizes its attention grids on the host reads them here, never by
    /// decoding the input's bytes back. They hold until the forward's
    /// [`Executor::synchronize`]. Default: ignored (the kernels read the input).
    fn set_windows(&mut self, _windows: &Windows) {}
    fn execute_node(&mut self, node: &Node, args: &ExecArgs) -> Result<()>;
    /// Runs split `key` of a plan (consecutive nodes of one graph assigned to this backend)
    /// as a whole: a device encodes it as one command buffer or replays the graph it
    /// recorded for the key. The default runs the nodes one by one.
    fn execute_split(&mut self, _key: SplitKey, nodes: &[&Node], args: &[ExecArgs]) -> Result<()> {
        for (node, a) in nodes.iter().zip(args) {
            self.execute_node(node, a)?;
        }
        Ok(())
    }
    /// Split `key`, which this backend runs next, is told ahead while another backend runs
    /// the split before it, so work that needs nothing of that split's inputs (a streamed
    /// block's weight copies, ADR 0014) starts now and overlaps the other backend's. The
    /// same nodes and arguments reach [`Executor::execute_split`] after. Default: nothing.
    fn prefetch_split(
        &mut self,
        _key: SplitKey,
        _nodes: &[&Node],
        _args: &[ExecArgs],
    ) -> Result<()> {
        Ok(())
    }
    /// The plan `plan` was released (its buffers freed): whatever the backend keeps under
    /// its id is dropped. Default: nothing kept.
    fn forget_plan(&mut self, _plan: PlanId) {}
    /// Completes all work submitted so far; called at the end of a forward.
    fn synchronize(&mut self) -> Result<()>;
    /// Arms (`true`) or disarms capture of node outputs for a trace (see
    /// [`crate::capture`]): while armed, every executed node with an f32 output keeps a copy
    /// of its `n_elems` values as they were when it ran (a device stages them inside its
    /// command stream, since a later node of the split may reuse the buffer). Disarmed, it
    /// costs one branch per node. Default: a backend that cannot capture refuses to arm.
    fn capture(&mut self, on: bool) -> Result<()> {
        if !on {
            return Ok(());
        }
        Err(Error::Backend {
            backend: self.name().into(),
            problem: "this backend cannot capture node outputs (trace)".into(),
        })
    }
    /// The captures of the nodes executed since the last take, in execution order, after
    /// the work producing them has completed. Default: none.
    fn take_captures(&mut self) -> Result<Vec<(NodeId, Vec<f32>)>> {
        Ok(Vec::new())
    }
    /// While armed, the nanoseconds each executed node that did work took since the last
    /// take, in execution order, once the forward has synchronised, for a backend that
    /// times its nodes (what the time is: [`Executor::node_time_source`]); a trace's
    /// per-node time, `minfer viz`'s timeline. Default: none.
    fn take_node_times(&mut self) -> Vec<(NodeId, u64)> {
        Vec::new()
    }
    /// What [`Executor::take_node_times`]'s times measure, in a phrase a trace carries (the
    /// CPU: its kernel call's wall time; CUDA: the device between events around the node's
    /// launches; the MSL emulator: its own wall time, no GPU clock). None: this backend
    /// does not time its nodes.
    fn node_time_source(&self) -> Option<&'static str> {
        None
    }
}

/// A device as the graph sees it: the three layers together. Implemented for every type
/// that implements them (a backend implements [`Identity`], [`Memory`], [`Capabilities`] and
/// [`Executor`]); callers hold `Box<dyn Backend>`.
pub trait Backend: Memory + Capabilities + Executor + Send {}

impl<T: Memory + Capabilities + Executor + Send> Backend for T {}
