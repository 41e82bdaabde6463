//! The graph IR: nodes with exactly one output each, 2-D shapes, dtypes and op metadata.
//!
//! Shapes are `[ne0, ne1]`: `ne0` is the row length (innermost, contiguous), `ne1` the
//! number of rows (tokens for activations). Memory is row-major `[ne1][ne0]`. Weights are
//! referenced by GGUF name; a matmul weight with `ne0 = in`, `ne1 = out` computes
//! `y[t][o] = sum_i w[o][i] x[t][i]`.

use crate::backend::{BackendId, FusedOp, KvLayout, RopeSpec, WeightId};
use minfer_gguf::GgmlType;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub u32);

impl NodeId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// Element type of a node's output. Activations are f32; integer inputs are i32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    I32,
    /// The node writes into a persistent region and has no output buffer of its own.
    None,
}

impl DType {
    pub fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::None => 0,
        }
    }
}

/// Runs of cells a [`InputKind::KvMap`] row holds: up to six segments of shared prefixes
/// (a tree of cached prompts: system prompt, then common openings of user turns), a private
/// tail and one more; a sequence that needs more is defragmented first. The map costs
/// 2 i32 per run and query row, so a wide map is cheap.
pub const KV_MAP_RUNS: usize = 8;

/// Host-filled graph inputs (all i32).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InputKind {
    /// `[n_tokens]` token ids.
    TokenIds,
    /// `[n_tokens]` sequence positions (drive RoPE and the causal bound).
    Positions,
    /// `[n_tokens]` KV cells (arena rows) the new K/V rows are written to.
    KvCells,
    /// `[2, n_tokens]` per query `[lo, hi)` KV cells it attends to (one run of cells).
    AttnSpan,
    /// `[2 * KV_MAP_RUNS, n_tokens]` per query up to [`KV_MAP_RUNS`] `(cell, len)` runs it
    /// attends to, in position order (unused runs have `len` 0). The host derives the runs
    /// from the cells' positions, so the causal bound is already applied.
    KvMap,
    /// `[n_out]` which rows of the final hidden state get logits.
    TailIds,
}

impl InputKind {
    pub fn name(self) -> &'static str {
        match self {
            InputKind::TokenIds => "token_ids",
            InputKind::Positions => "positions",
            InputKind::KvCells => "kv_cells",
            InputKind::AttnSpan => "attn_span",
            InputKind::KvMap => "kv_map",
            InputKind::TailIds => "tail_ids",
        }
    }
}

/// How RoPE pairs dimensions: the one enum of the workspace (the models pick it per
/// architecture, every backend's kernels read it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RopeStyle {
    /// Pairs `(i, i + d/2)`.
    Neox,
    /// Pairs `(2i, 2i + 1)`.
    Normal,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KvKind {
    K,
    V,
}

impl KvKind {
    pub fn name(self) -> &'static str {
        match self {
            KvKind::K => "k",
            KvKind::V => "v",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    Input(InputKind),
    /// Rows of a weight matrix selected by the i32 ids in `src[0]`, dequantized to f32.
    GetRows {
        weight: WeightId,
    },
    /// Rows of activation `src[0]` selected by the i32 ids in `src[1]`.
    SelectRows,
    /// `src[0] · weightᵀ (+ bias)`.
    MatMul {
        weight: WeightId,
        bias: Option<WeightId>,
    },
    /// RMSNorm over groups of `group` elements of each row, times `weight` (length `group`).
    RmsNorm {
        eps: f32,
        weight: WeightId,
        group: usize,
    },
    /// RoPE on `src[0]` (`n_head` heads of `head_dim`) at the positions in `src[1]`.
    Rope {
        style: RopeStyle,
        n_head: usize,
        head_dim: usize,
        freq_base: f32,
        freq_scale: f32,
    },
    Add,
    Mul,
    Silu,
    /// `silu(src[0]) * src[1]` (produced by fusion).
    SwiGLU,
    /// Writes `src[0]` rows into the layer's K or V region at the cells in `src[1]`.
    KvStore {
        layer: usize,
        kind: KvKind,
        cache_type: GgmlType,
    },
    /// GQA attention of `src[0]` (queries) over the layer's KV region, each query limited to
    /// its window `src[1]`: an [`InputKind::AttnSpan`] (`[2, n]`, one `[lo, hi)` range) or an
    /// [`InputKind::KvMap`] (`[2 * KV_MAP_RUNS, n]`, `(cell, len)` runs); the input's size
    /// selects the layout. The window is the query's whole causal context: the host derives
    /// it from positions. A row's result depends only on its query and the K/V values its
    /// window lists, in order (not on which cells hold them, nor on other rows).
    /// `src[2..]` are the KV stores it must run after.
    Attention {
        layer: usize,
        n_head: usize,
        n_head_kv: usize,
        head_dim: usize,
        scale: f32,
        cache_type: GgmlType,
        /// The layout of `src[1]`.
        window: WindowLayout,
    },
    /// Fused decode Q/K/V (one token, `src = [x, positions, cells]`): `q = x·Wqᵀ`,
    /// `k = x·Wkᵀ`, `v = x·Wvᵀ`, each plus its bias ([`QkvFused::bias`]) or per-head RMSNorm
    /// ([`QkvFused::norm`]), RoPE on q and k at the position, k and v written into the
    /// layer's K/V regions at the cell; the output is the roped q `[n_head * head_dim, 1]`.
    /// Exactly the unfused chain MatMul(+bias) / RmsNorm → Rope → KvStore. Produced by fusion
    /// for decode graphs only; a backend refuses `nt != 1`.
    QkvRopeStore(Box<QkvFused>),
    /// Fused decode FFN gate/up (one token, `src = [x]`): `silu(x·Wgᵀ) * (x·Wuᵀ)`, exactly
    /// MatMul, MatMul and SwiGLU; with `in_norm`, x is first the row's RMSNorm (exactly the
    /// RmsNorm node it replaced). Produced by fusion for decode graphs only.
    FfnGateUp {
        gate: WeightId,
        up: WeightId,
        in_norm: Option<InputNorm>,
    },
    /// Fused decode projection plus residual (one token, `src = [x, residual]`):
    /// `x·Wᵀ (+ bias) + residual`, exactly MatMul then Add. Produced by fusion for decode
    /// graphs only.
    MatMulAdd {
        weight: WeightId,
        bias: Option<WeightId>,
    },
    /// Copies `n` cells of the layer's K or V region from cell `src` to cell `dst`, bit for
    /// bit, with memmove semantics (overlapping ranges are safe): a defragmentation's move,
    /// a prefix copied into fresh cells, a copy before a shared cell is rotated. No srcs, no
    /// output; built by the engine for a sequence's KV operation
    /// ([`crate::cells::cell_ops_graph`]), never inside a forward.
    KvCopy {
        layer: usize,
        kind: KvKind,
        layout: KvLayout,
        src: usize,
        dst: usize,
        n: usize,
    },
    /// Rotates the K rows of cells `cell..cell + n` of the layer's K region by `delta`
    /// positions (the re-rope of a KV shift: `R(p + δ) = R(δ)·R(p)`). No srcs, no output;
    /// a backend refuses a KV type it cannot rotate in place.
    KvRopeShift {
        layer: usize,
        layout: KvLayout,
        rope: RopeSpec,
        cell: usize,
        n: usize,
        delta: i64,
    },
}

/// The whole-row RMSNorm a fused node applies to its input first (`x / rms(x) * weight`,
/// the RmsNorm op's arithmetic with `group` = the row).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct InputNorm {
    pub weight: WeightId,
    pub eps: f32,
}

/// What a [`Op::QkvRopeStore`] computes (the unfused chain's parameters).
#[derive(Clone, Debug, PartialEq)]
pub struct QkvFused {
    pub wq: WeightId,
    pub wk: WeightId,
    pub wv: WeightId,
    /// The biases of q, k and v (Qwen2).
    pub bias: Option<[WeightId; 3]>,
    /// Per-head RMSNorm of q and k before RoPE (Qwen3).
    pub norm: Option<QkNormSpec>,
    /// The RMSNorm of x before the projections (the layer's attention norm).
    pub in_norm: Option<InputNorm>,
    pub rope: RopeSpec,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub layer: usize,
    pub cache_type: GgmlType,
}

/// The per-head Q/K RMSNorm of a [`QkvFused`]: gains of `head_dim` elements.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QkNormSpec {
    pub q: WeightId,
    pub k: WeightId,
    pub eps: f32,
}

impl QkvFused {
    pub fn q_dim(&self) -> usize {
        self.n_head * self.rope.head_dim
    }
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.rope.head_dim
    }
}

impl Op {
    pub fn name(&self) -> &'static str {
        match self {
            Op::Input(_) => "Input",
            Op::GetRows { .. } => "GetRows",
            Op::SelectRows => "SelectRows",
            Op::MatMul { .. } => "MatMul",
            Op::RmsNorm { .. } => "RmsNorm",
            Op::Rope { .. } => "Rope",
            Op::Add => "Add",
            Op::Mul => "Mul",
            Op::Silu => "Silu",
            Op::SwiGLU => "SwiGLU",
            Op::KvStore { .. } => "KvStore",
            Op::Attention { .. } => "Attention",
            Op::QkvRopeStore(f) if f.norm.is_some() => "QkvNormRopeStore",
            Op::QkvRopeStore(_) => "QkvRopeStore",
            Op::FfnGateUp { .. } => "FfnGateUp",
            Op::MatMulAdd { .. } => "MatMulAdd",
            Op::KvCopy { .. } => "KvCopy",
            Op::KvRopeShift { .. } => "KvRopeShift",
        }
    }

    /// The fused-op class a node of this op is (None: an unfused op).
    pub fn fused_class(&self) -> Option<FusedOp> {
        match self {
            Op::SwiGLU => Some(FusedOp::SwiGLU),
            Op::QkvRopeStore(f) if f.norm.is_some() => Some(FusedOp::QkvNormRopeStore),
            Op::QkvRopeStore(_) => Some(FusedOp::QkvRopeStore),
            Op::FfnGateUp { .. } => Some(FusedOp::FfnGateUp),
            Op::MatMulAdd { .. } => Some(FusedOp::MatMulAdd),
            _ => None,
        }
    }

    /// The weight matrices a fused op reads as one, rows appended in order (q|k|v, gate|up):
    /// a backend builds each concatenation once, at load ([`crate::Memory::prepare_concat`]).
    pub fn concat_groups(&self) -> Vec<Vec<WeightId>> {
        match self {
            Op::QkvRopeStore(f) => vec![vec![f.wq, f.wk, f.wv]],
            Op::FfnGateUp { gate, up, .. } => vec![vec![*gate, *up]],
            _ => Vec::new(),
        }
    }

    /// The KV element type of an op that reads or writes the layer's regions.
    pub fn kv_cache_type(&self) -> Option<GgmlType> {
        match self {
            Op::KvStore { cache_type, .. } | Op::Attention { cache_type, .. } => Some(*cache_type),
            Op::QkvRopeStore(f) => Some(f.cache_type),
            Op::KvCopy { layout, .. } | Op::KvRopeShift { layout, .. } => Some(layout.cache_type),
            _ => None,
        }
    }

    /// A sequence's KV cell operation ([`crate::cells::cell_ops_graph`]), not forward work: it reads and
    /// writes only the layer's regions, and a device runs it eagerly (never recorded for
    /// replay).
    pub fn is_cell_op(&self) -> bool {
        matches!(self, Op::KvCopy { .. } | Op::KvRopeShift { .. })
    }

    /// The weights an op reads.
    pub fn weights(&self) -> impl Iterator<Item = WeightId> {
        let v: Vec<WeightId> = match self {
            Op::GetRows { weight } | Op::RmsNorm { weight, .. } => vec![*weight],
            Op::MatMul { weight, bias } | Op::MatMulAdd { weight, bias } => {
                std::iter::once(*weight).chain(*bias).collect()
            }
            Op::QkvRopeStore(f) => [f.wq, f.wk, f.wv]
                .into_iter()
                .chain(f.bias.into_iter().flatten())
                .chain(f.norm.into_iter().flat_map(|n| [n.q, n.k]))
                .chain(f.in_norm.map(|n| n.weight))
                .collect(),
            Op::FfnGateUp { gate, up, in_norm } => [*gate, *up]
                .into_iter()
                .chain(in_norm.map(|n| n.weight))
                .collect(),
            _ => Vec::new(),
        };
        v.into_iter()
    }

    /// The KV layer an op reads or writes.
    pub fn kv_layer(&self) -> Option<usize> {
        match self {
            Op::KvStore { layer, .. } | Op::Attention { layer, .. } => Some(*layer),
            Op::QkvRopeStore(f) => Some(f.layer),
            Op::KvCopy { layer, .. } | Op::KvRopeShift { layer, .. } => Some(*layer),
            _ => None,
        }
    }

    /// Elementwise ops whose output may reuse the buffer of `src[0]`.
    pub fn can_alias_src0(&self) -> bool {
        matches!(
            self,
            Op::Silu | Op::SwiGLU | Op::Rope { .. } | Op::Add | Op::Mul
        )
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub id: NodeId,
    pub name: String,
    pub op: Op,
    pub src: Vec<NodeId>,
    pub shape: [usize; 2],
    pub dtype: DType,
    /// `None` until assigned.
    pub backend: Option<BackendId>,
    pub layer: Option<usize>,
    /// Removed by fusion: no buffer, never executed.
    pub dead: bool,
}

impl Node {
    pub fn n_elems(&self) -> usize {
        self.shape[0] * self.shape[1]
    }
    pub fn n_bytes(&self) -> usize {
        self.n_elems() * self.dtype.size()
    }
}

/// How attention windows are given to a graph (the window input's size).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum WindowLayout {
    /// [`InputKind::AttnSpan`]: one cell range per query.
    #[default]
    Span,
    /// [`InputKind::KvMap`]: up to [`KV_MAP_RUNS`] cell runs per query.
    KvMap,
}

impl WindowLayout {
    /// i32s per query row of the window input: `[lo, hi)` for a span, `KV_MAP_RUNS` pairs of
    /// (first cell, length) for a kv map.
    pub fn width(self) -> usize {
        match self {
            WindowLayout::Span => 2,
            WindowLayout::KvMap => 2 * KV_MAP_RUNS,
        }
    }
}

/// One forward's attention windows as typed values: the rows its window input holds on the
/// device (`layout.width()` i32s per query, padding rows included), handed to the backends
/// too ([`crate::Executor::set_windows`]) so none decodes them back from the input's bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Windows {
    pub layout: WindowLayout,
    pub values: std::sync::Arc<[i32]>,
}

/// What decides a graph's topology. Equal params give an identical graph, so the cache
/// reuses it; positions, cells and windows are input data, not part of it.
#[derive(Clone, Debug, PartialEq)]
pub struct GraphParams {
    pub n_tokens: usize,
    pub n_out: usize,
    pub n_ctx: usize,
    pub cache_type: GgmlType,
    pub window: WindowLayout,
    /// The forward holds prompt rows ([`RowClass::Prompt`]): the decode-only rewrites, whose
    /// kernels compute generation-row arithmetic, are not applied to its graph.
    pub prompt_rows: bool,
}

/// The class of a forward's row, a property of its sequence's phase, never of the forward's
/// shape (docs/PRECISION.md, "Row classes"). A backend may compute the two classes with
/// different arithmetic; within a class a row's bits never depend on the other rows of the
/// forward nor on how its prompt was chunked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum RowClass {
    /// A token the engine sampled, or a drafted token being verified.
    #[default]
    Generation,
    /// A token of a sequence's prefill (a chunk of any length, a 1-token remainder included).
    Prompt,
}

/// The classes of one forward's rows: its token rows (padding included) and the rows of
/// the nodes after the output gather (the logits rows), in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RowClasses {
    pub tokens: Vec<RowClass>,
    pub outputs: Vec<RowClass>,
}

impl RowClasses {
    /// Every row a generation row (the classes of a forward that names none).
    pub fn generation(n_tokens: usize, n_out: usize) -> Self {
        RowClasses {
            tokens: vec![RowClass::Generation; n_tokens],
            outputs: vec![RowClass::Generation; n_out],
        }
    }

    /// The classes of a node's `rows` rows: the token rows' or the output rows' (whichever
    /// count matches; both when they are equal), `None` for any other count.
    pub fn of(&self, rows: usize) -> Option<&[RowClass]> {
        if rows == self.tokens.len() {
            Some(&self.tokens)
        } else if rows == self.outputs.len() {
            Some(&self.outputs)
        } else {
            None
        }
    }

    /// Maximal runs of one class among `classes`: (first row, rows, class).
    pub fn runs(classes: &[RowClass]) -> Vec<(usize, usize, RowClass)> {
        let mut out: Vec<(usize, usize, RowClass)> = Vec::new();
        for (i, &c) in classes.iter().enumerate() {
            match out.last_mut() {
                Some((_, n, k)) if *k == c => *n += 1,
                _ => out.push((i, 1, c)),
            }
        }
        out
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Graph {
    /// Topologically ordered by construction; executed and planned in this order.
    pub nodes: Vec<Node>,
    pub inputs: Vec<(InputKind, NodeId)>,
    pub output: NodeId,
    /// Streamed blocks (ADR 0014): a graph whose rows are all prompt rows, on a plan that
    /// leaves blocks below the count given on the CPU, runs those blocks' nodes on this
    /// device but their KV stores and attention (the KV stays where the plan put it), the
    /// device copying their weights in per forward ([`crate::Capabilities::can_stream`]).
    /// None: every node at its block's home.
    pub streamed_blocks: Option<(crate::backend::BackendId, usize)>,
}

impl Graph {
    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.index()]
    }
    pub fn input(&self, kind: InputKind) -> Option<NodeId> {
        self.inputs
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|&(_, n)| n)
    }
    /// Consumers of each node among live nodes.
    pub fn consumers(&self) -> Vec<Vec<NodeId>> {
        let mut c = vec![Vec::new(); self.nodes.len()];
        for n in self.nodes.iter().filter(|n| !n.dead) {
            for s in &n.src {
                c[s.index()].push(n.id);
            }
        }
        c
    }
}

/// Appends nodes in build order.
#[derive(Default)]
pub struct GraphBuilder {
    nodes: Vec<Node>,
    inputs: Vec<(InputKind, NodeId)>,
    layer: Option<usize>,
}

impl GraphBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Nodes added from now on belong to `layer` (None: outside the blocks).
    pub fn set_layer(&mut self, layer: Option<usize>) {
        self.layer = layer;
    }

    pub fn input(&mut self, kind: InputKind, shape: [usize; 2]) -> NodeId {
        let id = self.push(
            kind.name().into(),
            Op::Input(kind),
            vec![],
            shape,
            DType::I32,
        );
        self.inputs.push((kind, id));
        id
    }

    /// An f32-output op.
    pub fn op(
        &mut self,
        name: impl Into<String>,
        op: Op,
        src: &[NodeId],
        shape: [usize; 2],
    ) -> NodeId {
        let dtype = if matches!(op, Op::KvStore { .. }) {
            DType::None
        } else {
            DType::F32
        };
        self.push(name.into(), op, src.to_vec(), shape, dtype)
    }

    pub fn shape(&self, id: NodeId) -> [usize; 2] {
        self.nodes[id.index()].shape
    }

    /// A node that only reads and writes its layer's KV regions: no srcs, no output.
    pub(crate) fn region_op(&mut self, name: String, op: Op) -> NodeId {
        self.push(name, op, Vec::new(), [0, 0], DType::None)
    }

    /// Assigns a node to a backend at build time (a graph the engine places itself).
    pub(crate) fn set_backend(&mut self, id: NodeId, backend: BackendId) {
        self.nodes[id.index()].backend = Some(backend);
    }

    fn push(
        &mut self,
        name: String,
        op: Op,
        src: Vec<NodeId>,
        shape: [usize; 2],
        dtype: DType,
    ) -> NodeId {
        let id = NodeId(self.nodes.len() as u32);
        self.nodes.push(Node {
            id,
            name,
            op,
            src,
            shape,
            dtype,
            backend: None,
            layer: self.layer,
            dead: false,
        });
        id
    }

    pub fn finish(self, output: NodeId) -> Graph {
        Graph {
            nodes: self.nodes,
            inputs: self.inputs,
            output,
            streamed_blocks: None,
        }
    }
}
