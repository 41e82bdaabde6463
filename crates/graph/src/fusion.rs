//! Peephole fusion. A rewrite happens only where the node's backend says
//! [`crate::Capabilities::supports_fused`] for the class and
//! [`crate::Capabilities::supports_op`] accepts the fused node (its weights); every other
//! backend (the CPU) keeps the unfused chain. Replaced nodes
//! are marked dead (no buffer, never executed).
//!
//! - Decode graphs only (one token), each switchable by [`FusionConfig`]:
//!   - a layer's Q/K/V chain — `MatMul(+bias)` or `MatMul → RmsNorm(head)` for q, k and v,
//!     `Rope` of q and k, `KvStore` of k and v — becomes one [`Op::QkvRopeStore`] whose
//!     output is the roped q (the attention reads it; it runs after the stores it replaced);
//!   - the FFN `silu(x·Wg) * (x·Wu)` becomes [`Op::FfnGateUp`] (a backend that concatenates
//!     gate|up, Metal, refuses it past [`MAX_FUSED_FFN`] rows in its `supports_op`: a larger
//!     concatenation would cost more memory than the dispatch it saves; CUDA reads the two
//!     matrices where they are).
//!   - then a whole-row `RmsNorm` feeding only such a fused node folds into it as its
//!     [`InputNorm`] (the node normalises its input itself);
//!   - and `Add(MatMul(x), r)` (either side), the MatMul consumed by the Add alone, becomes
//!     [`Op::MatMulAdd`] (the residual added in the projection's epilogue).
//! - Every graph: `Mul(Silu(a), b)` (Silu on either side) becomes `SwiGLU(a, b)` when the Silu
//!   runs on the same backend and the Mul is its only consumer.

use crate::backend::FusedOp;
use crate::backend::{Backend, RopeSpec, WeightId, WeightSource};
use crate::error::Result;
use crate::ir::{
    DType, Graph, InputKind, InputNorm, KvKind, Node, NodeId, Op, QkNormSpec, QkvFused,
};

/// Largest FFN (rows of gate and of up) a backend that concatenates gate|up fuses into
/// [`Op::FfnGateUp`].
pub const MAX_FUSED_FFN: usize = 16384;

/// Which decode rewrites run (the SwiGLU rewrite always does).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FusionConfig {
    pub qkv: bool,
    pub ffn: bool,
    /// Input RMSNorm folded into the fused Q/K/V and gate/up nodes.
    pub norm: bool,
    /// Residual Add folded into the projection before it.
    pub add: bool,
}

impl FusionConfig {
    pub const ALL: FusionConfig = FusionConfig {
        qkv: true,
        ffn: true,
        norm: true,
        add: true,
    };
    pub const NONE: FusionConfig = FusionConfig {
        qkv: false,
        ffn: false,
        norm: false,
        add: false,
    };
}

impl Default for FusionConfig {
    fn default() -> Self {
        FusionConfig::from_env()
    }
}

/// Rewrites `graph` in place; returns the number of rewrites.
pub fn fuse(
    graph: &mut Graph,
    backends: &[Box<dyn Backend>],
    weights: &dyn WeightSource,
    cfg: FusionConfig,
) -> usize {
    let decode = graph
        .input(InputKind::TokenIds)
        .is_some_and(|t| graph.node(t).shape[1] == 1);
    let mut count = 0;
    if decode && cfg.qkv {
        count += fuse_qkv(graph, backends, weights);
    }
    if decode && cfg.ffn {
        count += fuse_ffn(graph, backends, weights);
    }
    if decode && cfg.norm {
        count += fuse_in_norm(graph, backends, weights);
    }
    if decode && cfg.add {
        count += fuse_residual(graph, backends, weights);
    }
    count + fuse_swiglu(graph, backends)
}

/// Hands each backend the weight groups its fused nodes in `graph` read as one matrix
/// ([`Op::concat_groups`], each group once), at load.
pub fn prepare_concats(
    graph: &Graph,
    backends: &mut [Box<dyn Backend>],
    weights: &dyn WeightSource,
) -> Result<()> {
    for be in backends.iter_mut() {
        let mut groups: Vec<Vec<WeightId>> = graph
            .nodes
            .iter()
            .filter(|n| !n.dead && n.backend == Some(be.id()))
            .flat_map(|n| n.op.concat_groups())
            .collect();
        groups.sort();
        groups.dedup();
        if !groups.is_empty() {
            be.prepare_concat(weights, &groups)?;
        }
    }
    Ok(())
}

fn backend_of<'a>(backends: &'a [Box<dyn Backend>], node: &Node) -> Option<&'a dyn Backend> {
    backends
        .iter()
        .find(|b| Some(b.id()) == node.backend)
        .map(|b| b.as_ref())
}

/// Whether `be` takes `op` as a fused node.
fn accepts(be: &dyn Backend, op: &Op, weights: &dyn WeightSource) -> bool {
    op.fused_class()
        .is_some_and(|c| be.supports_fused(c).is_ok())
        && be.supports_op(op, DType::F32, weights).is_ok()
}

/// The graph as the pattern matchers read it: live one-token nodes of one backend.
struct View<'a> {
    g: &'a Graph,
    consumers: &'a [Vec<NodeId>],
    backend: Option<crate::backend::BackendId>,
}

impl View<'_> {
    /// `id` when it is live, on the pattern's backend, one row, and consumed by `by` alone.
    fn only_for(&self, id: NodeId, by: NodeId) -> Option<&Node> {
        let n = self.g.node(id);
        (!n.dead
            && n.backend == self.backend
            && n.shape[1] == 1
            && self.consumers[id.index()] == [by])
        .then_some(n)
    }

    /// A projection feeding `by`: `MatMul{w, bias}(x)`, or `RmsNorm(head_dim)(MatMul{w}(x))`
    /// when `head_norm` is given. Returns (matmul node, x, weight, bias, norm, the nodes).
    #[allow(clippy::type_complexity)]
    fn projection(
        &self,
        id: NodeId,
        by: NodeId,
        head_dim: usize,
    ) -> Option<(
        NodeId,
        WeightId,
        Option<WeightId>,
        Option<(WeightId, f32)>,
        Vec<NodeId>,
    )> {
        let n = self.only_for(id, by)?;
        let (mm, norm, mut nodes) = match n.op {
            Op::RmsNorm { eps, weight, group } if group == head_dim => {
                (self.only_for(n.src[0], id)?, Some((weight, eps)), vec![id])
            }
            _ => (n, None, Vec::new()),
        };
        let Op::MatMul { weight, bias } = mm.op else {
            return None;
        };
        nodes.push(mm.id);
        Some((mm.src[0], weight, bias, norm, nodes))
    }
}

fn fuse_qkv(graph: &mut Graph, backends: &[Box<dyn Backend>], weights: &dyn WeightSource) -> usize {
    let consumers = graph.consumers();
    let mut rewrites = Vec::new();
    for attn in graph.nodes.iter().filter(|n| !n.dead) {
        let Some(be) = backend_of(backends, attn) else {
            continue;
        };
        let v = View {
            g: graph,
            consumers: &consumers,
            backend: attn.backend,
        };
        if let Some(r) = match_qkv(&v, attn).filter(|r| accepts(be, &r.op, weights)) {
            rewrites.push(r);
        }
    }
    let count = rewrites.len();
    for r in rewrites {
        let slot = &mut graph.nodes[r.slot.index()];
        slot.name = format!("L{}.qkv", r.layer);
        slot.op = r.op;
        slot.src = r.srcs.to_vec();
        for d in r.dead {
            graph.nodes[d.index()].dead = true;
        }
        let attn = &mut graph.nodes[r.attn.index()];
        attn.src = vec![r.slot, attn.src[1]];
    }
    count
}

struct QkvRewrite {
    attn: NodeId,
    /// The q RoPE node, rewritten into the fused node.
    slot: NodeId,
    layer: usize,
    op: Op,
    srcs: [NodeId; 3],
    dead: Vec<NodeId>,
}

fn match_qkv(v: &View, attn: &Node) -> Option<QkvRewrite> {
    let Op::Attention {
        layer,
        n_head,
        n_head_kv,
        head_dim,
        cache_type,
        ..
    } = attn.op
    else {
        return None;
    };
    if attn.src.len() != 4 || attn.shape[1] != 1 {
        return None;
    }
    let (qr, ks, vs) = (
        v.only_for(attn.src[0], attn.id)?,
        v.only_for(attn.src[2], attn.id)?,
        v.only_for(attn.src[3], attn.id)?,
    );
    let store = |n: &Node, want: KvKind| match n.op {
        Op::KvStore {
            layer: l,
            kind,
            cache_type: ct,
        } if l == layer && kind == want && ct == cache_type => Some((n.src[0], n.src[1])),
        _ => None,
    };
    let (kr_id, cells) = store(ks, KvKind::K)?;
    let (v_in, cells_v) = store(vs, KvKind::V)?;
    let kr = v.only_for(kr_id, ks.id)?;
    let rope = |n: &Node, heads: usize| match n.op {
        Op::Rope {
            style,
            n_head,
            head_dim: hd,
            freq_base,
            freq_scale,
        } if n_head == heads && hd == head_dim => Some((
            RopeSpec {
                style,
                head_dim,
                freq_base,
                freq_scale,
            },
            n.src[0],
            n.src[1],
        )),
        _ => None,
    };
    let (rope_q, q_in, pos) = rope(qr, n_head)?;
    let (rope_k, k_in, pos_k) = rope(kr, n_head_kv)?;
    if rope_q != rope_k || pos_k != pos || cells_v != cells {
        return None;
    }
    let (xq, wq, bq, nq, mut dead) = v.projection(q_in, qr.id, head_dim)?;
    let (xk, wk, bk, nk, dk) = v.projection(k_in, kr.id, head_dim)?;
    let (xv, wv, bv, nv, dv) = v.projection(v_in, vs.id, 0)?;
    if xq != xk || xq != xv || nv.is_some() {
        return None;
    }
    let bias = match (bq, bk, bv) {
        (Some(q), Some(k), Some(v)) => Some([q, k, v]),
        (None, None, None) => None,
        _ => return None,
    };
    let norm = match (nq, nk) {
        (Some((q, e)), Some((k, ek))) if e == ek => Some(QkNormSpec { q, k, eps: e }),
        (None, None) => None,
        _ => return None,
    };
    // Biases are added before a norm in the unfused chain; the fused kernels do one or the
    // other.
    if bias.is_some() && norm.is_some() {
        return None;
    }
    // The fused node takes the q RoPE's place: everything it reads must come before it.
    if [xq, pos, cells].iter().any(|s| s.index() >= qr.id.index()) {
        return None;
    }
    dead.extend(dk);
    dead.extend(dv);
    dead.extend([kr.id, ks.id, vs.id]);
    Some(QkvRewrite {
        attn: attn.id,
        slot: qr.id,
        layer,
        op: Op::QkvRopeStore(Box::new(QkvFused {
            wq,
            wk,
            wv,
            bias,
            norm,
            in_norm: None,
            rope: rope_q,
            n_head,
            n_head_kv,
            layer,
            cache_type,
        })),
        srcs: [xq, pos, cells],
        dead,
    })
}

fn fuse_ffn(graph: &mut Graph, backends: &[Box<dyn Backend>], weights: &dyn WeightSource) -> usize {
    let consumers = graph.consumers();
    let mut count = 0;
    for i in 0..graph.nodes.len() {
        let node = &graph.nodes[i];
        let Some(be) = backend_of(backends, node) else {
            continue;
        };
        let v = View {
            g: graph,
            consumers: &consumers,
            backend: node.backend,
        };
        let Some((x, op, dead)) = match_ffn(&v, node) else {
            continue;
        };
        if !accepts(be, &op, weights) {
            continue;
        }
        let node = &mut graph.nodes[i];
        node.op = op;
        node.src = vec![x];
        for d in dead {
            graph.nodes[d.index()].dead = true;
        }
        count += 1;
    }
    count
}

/// `SwiGLU(x·Wg, x·Wu)` or `Mul(Silu(x·Wg), x·Wu)` (either side) of one token.
fn match_ffn(v: &View, m: &Node) -> Option<(NodeId, Op, Vec<NodeId>)> {
    if m.dead || m.shape[1] != 1 || m.src.len() != 2 {
        return None;
    }
    let (gate_mm, up_mm, mut dead) = match m.op {
        Op::SwiGLU => (v.only_for(m.src[0], m.id)?, m.src[1], Vec::new()),
        Op::Mul => {
            let silu = |k: usize| {
                v.only_for(m.src[k], m.id)
                    .filter(|s| s.op == Op::Silu && s.shape == m.shape)
            };
            let (s, other) = match (silu(0), silu(1)) {
                (Some(s), _) => (s, m.src[1]),
                (None, Some(s)) => (s, m.src[0]),
                _ => return None,
            };
            (v.only_for(s.src[0], s.id)?, other, vec![s.id])
        }
        _ => return None,
    };
    let up_mm = v.only_for(up_mm, m.id)?;
    let (
        Op::MatMul {
            weight: gate,
            bias: None,
        },
        Op::MatMul {
            weight: up,
            bias: None,
        },
    ) = (&gate_mm.op, &up_mm.op)
    else {
        return None;
    };
    if gate_mm.src[0] != up_mm.src[0] || gate_mm.shape != m.shape || up_mm.shape != m.shape {
        return None;
    }
    dead.extend([gate_mm.id, up_mm.id]);
    let op = Op::FfnGateUp {
        gate: *gate,
        up: *up,
        in_norm: None,
    };
    Some((gate_mm.src[0], op, dead))
}

/// A fused Q/K/V or gate/up node whose input is a whole-row RmsNorm of one token consumed
/// by it alone takes the norm in ([`InputNorm`]); the RmsNorm node dies.
fn fuse_in_norm(
    graph: &mut Graph,
    backends: &[Box<dyn Backend>],
    weights: &dyn WeightSource,
) -> usize {
    let consumers = graph.consumers();
    let mut count = 0;
    for i in 0..graph.nodes.len() {
        let node = &graph.nodes[i];
        if node.dead || node.src.is_empty() {
            continue;
        }
        let Some(be) = backend_of(backends, node) else {
            continue;
        };
        if be.supports_fused(FusedOp::InputNorm).is_err() {
            continue;
        }
        let v = View {
            g: graph,
            consumers: &consumers,
            backend: node.backend,
        };
        let Some(norm) = v.only_for(node.src[0], node.id) else {
            continue;
        };
        let Op::RmsNorm { eps, weight, group } = norm.op else {
            continue;
        };
        if group != norm.shape[0] {
            continue;
        }
        let folded = Some(InputNorm { weight, eps });
        let op = match &node.op {
            Op::FfnGateUp {
                gate,
                up,
                in_norm: None,
            } => Op::FfnGateUp {
                gate: *gate,
                up: *up,
                in_norm: folded,
            },
            Op::QkvRopeStore(f) if f.in_norm.is_none() => {
                let mut f = f.clone();
                f.in_norm = folded;
                Op::QkvRopeStore(f)
            }
            _ => continue,
        };
        if be.supports_op(&op, DType::F32, weights).is_err() {
            continue;
        }
        let (norm_id, x) = (norm.id, norm.src[0]);
        let node = &mut graph.nodes[i];
        node.op = op;
        node.src[0] = x;
        graph.nodes[norm_id.index()].dead = true;
        count += 1;
    }
    count
}

/// `Add(MatMul(x), r)` of one token (the MatMul on either side, consumed by the Add alone)
/// becomes `MatMulAdd(x, r)` in the Add's place; the MatMul node dies.
fn fuse_residual(
    graph: &mut Graph,
    backends: &[Box<dyn Backend>],
    weights: &dyn WeightSource,
) -> usize {
    let consumers = graph.consumers();
    let mut count = 0;
    for i in 0..graph.nodes.len() {
        let node = &graph.nodes[i];
        if node.dead || node.op != Op::Add || node.src.len() != 2 || node.shape[1] != 1 {
            continue;
        }
        let Some(be) = backend_of(backends, node) else {
            continue;
        };
        let v = View {
            g: graph,
            consumers: &consumers,
            backend: node.backend,
        };
        let mm = |k: usize| {
            v.only_for(node.src[k], node.id)
                .filter(|m| matches!(m.op, Op::MatMul { .. }) && m.shape == node.shape)
        };
        let (m, residual) = match (mm(0), mm(1)) {
            (Some(m), _) => (m, node.src[1]),
            (None, Some(m)) => (m, node.src[0]),
            _ => continue,
        };
        let Op::MatMul { weight, bias } = m.op else {
            continue;
        };
        let op = Op::MatMulAdd { weight, bias };
        if !accepts(be, &op, weights) {
            continue;
        }
        let (mm_id, x) = (m.id, m.src[0]);
        let node = &mut graph.nodes[i];
        node.op = op;
        node.src = vec![x, residual];
        graph.nodes[mm_id.index()].dead = true;
        count += 1;
    }
    count
}

fn fuse_swiglu(graph: &mut Graph, backends: &[Box<dyn Backend>]) -> usize {
    let consumers = graph.consumers();
    let mut count = 0;
    for i in 0..graph.nodes.len() {
        let node = &graph.nodes[i];
        if node.dead || node.op != Op::Mul {
            continue;
        }
        let Some(be) = backend_of(backends, node) else {
            continue;
        };
        if be.supports_fused(crate::backend::FusedOp::SwiGLU).is_err() {
            continue;
        }
        let is_silu = |k: usize| {
            let s = &graph.nodes[node.src[k].index()];
            s.op == Op::Silu
                && !s.dead
                && s.backend == node.backend
                && consumers[s.id.index()].len() == 1
                && s.shape == node.shape
        };
        let (silu_side, other) = if is_silu(0) {
            (0, 1)
        } else if is_silu(1) {
            (1, 0)
        } else {
            continue;
        };
        let silu = node.src[silu_side];
        let gate = graph.nodes[silu.index()].src[0];
        let other = node.src[other];
        let node = &mut graph.nodes[i];
        node.op = Op::SwiGLU;
        node.src = vec![gate, other];
        graph.nodes[silu.index()].dead = true;
        count += 1;
    }
    count
}
