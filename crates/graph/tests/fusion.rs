//! The decode fusion pass on hand-built layers shaped as `minfer_models::build_graph` emits
//! them: what is rewritten, where the fused node sits and what it reads, and each condition
//! that keeps the chain (a prefill graph, a value the chain does not own, a backend that says
//! no, the switches).

use minfer_gguf::GgmlType;
use minfer_graph::{
    fuse, Backend, BackendId, BufId, Capabilities, DType, ExecArgs, Executor, FusedOp,
    FusionConfig, Graph, GraphBuilder, Identity, InputKind, InputNorm, KvKind, Memory, Node,
    NodeId, Op, RopeStyle, Support, WeightId, WeightRef, WeightSource, WindowLayout,
};

struct NoWeights;
impl WeightSource for NoWeights {
    fn weight(&self, _: WeightId) -> Option<WeightRef<'_>> {
        None
    }
    fn name(&self, _: WeightId) -> &str {
        "?"
    }
    fn id(&self, _: &str) -> Option<WeightId> {
        None
    }
    fn len(&self) -> usize {
        0
    }
}

/// Accepts every op; `fused` decides `supports_fused` for the decode classes. Never runs.
struct Planner {
    fused: bool,
}

impl Identity for Planner {
    fn id(&self) -> BackendId {
        BackendId(1)
    }

    fn name(&self) -> &str {
        "planner"
    }
}

impl Memory for Planner {
    fn alloc(&mut self, _: usize) -> minfer_graph::Result<BufId> {
        unreachable!("planning only")
    }

    fn free(&mut self, _: BufId) {}

    fn write(&mut self, _: BufId, _: usize, _: &[u8]) -> minfer_graph::Result<()> {
        unreachable!("planning only")
    }

    fn read(&mut self, _: BufId, _: usize, _: &mut [u8]) -> minfer_graph::Result<()> {
        unreachable!("planning only")
    }
}

impl Capabilities for Planner {
    fn supports_op(&self, _: &Op, _: DType, _: &dyn WeightSource) -> Support {
        Ok(())
    }

    fn supports_fused(&self, op: FusedOp) -> Support {
        if op == FusedOp::SwiGLU || self.fused {
            Ok(())
        } else {
            Err("fusions off".into())
        }
    }
}

impl Executor for Planner {
    fn execute_node(&mut self, _: &Node, _: &ExecArgs) -> minfer_graph::Result<()> {
        unreachable!("planning only")
    }

    fn synchronize(&mut self) -> minfer_graph::Result<()> {
        Ok(())
    }
}

const D: usize = 64;
const HD: usize = 16;

/// One Qwen2-shaped layer (biases) or Qwen3-shaped (per-head norms) of `nt` tokens;
/// `leak_k` gives the roped k a second consumer.
fn layer(nt: usize, qwen3: bool, leak_k: bool) -> Graph {
    let w = |i: u32| WeightId(i);
    let mut g = GraphBuilder::new();
    let tokens = g.input(InputKind::TokenIds, [1, nt]);
    let pos = g.input(InputKind::Positions, [1, nt]);
    let cells = g.input(InputKind::KvCells, [1, nt]);
    let span = g.input(InputKind::AttnSpan, [2, nt]);
    g.set_layer(Some(0));
    let x = g.op("embd", Op::GetRows { weight: w(0) }, &[tokens], [D, nt]);
    let mm = |g: &mut GraphBuilder, name: &str, weight, bias: Option<u32>, n| {
        let op = Op::MatMul {
            weight: w(weight),
            bias: if qwen3 { None } else { bias.map(w) },
        };
        g.op(name, op, &[x], [n, nt])
    };
    let mut q = mm(&mut g, "q", 1, Some(4), 4 * HD);
    let mut k = mm(&mut g, "k", 2, Some(5), 2 * HD);
    let v = mm(&mut g, "v", 3, Some(6), 2 * HD);
    if qwen3 {
        let norm = |weight| Op::RmsNorm {
            eps: 1e-6,
            weight: w(weight),
            group: HD,
        };
        q = g.op("q_norm", norm(7), &[q], [4 * HD, nt]);
        k = g.op("k_norm", norm(8), &[k], [2 * HD, nt]);
    }
    let rope = |n_head| Op::Rope {
        style: RopeStyle::Neox,
        n_head,
        head_dim: HD,
        freq_base: 1e6,
        freq_scale: 1.0,
    };
    let qr = g.op("q_rope", rope(4), &[q, pos], [4 * HD, nt]);
    let kr = g.op("k_rope", rope(2), &[k, pos], [2 * HD, nt]);
    let store = |kind| Op::KvStore {
        layer: 0,
        kind,
        cache_type: GgmlType::F16,
    };
    let ks = g.op("k_store", store(KvKind::K), &[kr, cells], [2 * HD, nt]);
    let vs = g.op("v_store", store(KvKind::V), &[v, cells], [2 * HD, nt]);
    let attn = Op::Attention {
        layer: 0,
        n_head: 4,
        n_head_kv: 2,
        head_dim: HD,
        scale: 0.25,
        cache_type: GgmlType::F16,
        window: WindowLayout::Span,
    };
    let a = g.op("attn", attn, &[qr, span, ks, vs], [4 * HD, nt]);
    let a = if leak_k {
        g.op("leak", Op::Add, &[a, kr], [4 * HD, nt])
    } else {
        a
    };
    let gate = g.op(
        "gate",
        Op::MatMul {
            weight: w(9),
            bias: None,
        },
        &[a],
        [96, nt],
    );
    let up = g.op(
        "up",
        Op::MatMul {
            weight: w(10),
            bias: None,
        },
        &[a],
        [96, nt],
    );
    let s = g.op("silu", Op::Silu, &[gate], [96, nt]);
    let m = g.op("gate_up", Op::Mul, &[s, up], [96, nt]);
    let mut graph = g.finish(m);
    for n in &mut graph.nodes {
        n.backend = Some(BackendId(1));
    }
    graph
}

fn by_name<'a>(g: &'a Graph, name: &str) -> &'a Node {
    g.nodes.iter().find(|n| n.name == name).unwrap()
}

fn live(g: &Graph, op: &str) -> usize {
    g.nodes
        .iter()
        .filter(|n| !n.dead && n.op.name() == op)
        .count()
}

fn run(g: &mut Graph, fused: bool, cfg: FusionConfig) -> usize {
    let bes: Vec<Box<dyn Backend>> = vec![Box::new(Planner { fused })];
    fuse(g, &bes, &NoWeights, cfg)
}

#[test]
fn a_decode_layer_becomes_one_qkv_node_and_one_ffn_node() {
    for qwen3 in [false, true] {
        let mut g = layer(1, qwen3, false);
        assert_eq!(run(&mut g, true, FusionConfig::ALL), 2);
        let class = if qwen3 {
            "QkvNormRopeStore"
        } else {
            "QkvRopeStore"
        };
        assert_eq!(live(&g, class), 1);
        assert_eq!(live(&g, "FfnGateUp"), 1);
        for gone in ["KvStore", "Rope", "Silu", "Mul", "SwiGLU", "RmsNorm"] {
            assert_eq!(live(&g, gone), 0, "{gone}");
        }
        // The five projections are all inside the fused nodes.
        assert_eq!(live(&g, "MatMul"), 0);
        // The fused node takes the q RoPE's slot and reads [x, positions, cells]; the
        // attention reads it as its query.
        let f = by_name(&g, "L0.qkv");
        assert_eq!(f.id, by_name(&layer(1, qwen3, false), "q_rope").id);
        let ids =
            |names: &[&str]| -> Vec<NodeId> { names.iter().map(|n| by_name(&g, n).id).collect() };
        assert_eq!(f.src, ids(&["embd", "positions", "kv_cells"]));
        assert_eq!(by_name(&g, "attn").src, ids(&["L0.qkv", "attn_span"]));
        let Op::QkvRopeStore(q) = &f.op else {
            panic!("{:?}", f.op)
        };
        assert_eq!(q.bias.is_some(), !qwen3);
        assert_eq!(q.norm.is_some(), qwen3);
        assert_eq!(
            (q.layer, q.cache_type, q.n_head, q.n_head_kv),
            (0, GgmlType::F16, 4, 2)
        );
        assert_eq!(f.shape, [4 * HD, 1]);
        let ffn = by_name(&g, "gate_up");
        assert_eq!(
            ffn.op,
            Op::FfnGateUp {
                gate: WeightId(9),
                up: WeightId(10),
                in_norm: None,
            }
        );
        assert_eq!(ffn.src, ids(&["attn"]));
    }
}

#[test]
fn what_keeps_the_chain() {
    // A prefill graph: only the SwiGLU rewrite.
    let mut g = layer(4, false, false);
    assert_eq!(run(&mut g, true, FusionConfig::ALL), 1);
    assert_eq!((live(&g, "QkvRopeStore"), live(&g, "SwiGLU")), (0, 1));
    // The roped k is read outside the chain: the QKV stays, the FFN still fuses.
    let mut g = layer(1, false, true);
    assert_eq!(run(&mut g, true, FusionConfig::ALL), 1);
    assert_eq!((live(&g, "QkvRopeStore"), live(&g, "FfnGateUp")), (0, 1));
    // A backend without the decode classes (the CPU): only SwiGLU.
    let mut g = layer(1, true, false);
    assert_eq!(run(&mut g, false, FusionConfig::ALL), 1);
    assert_eq!((live(&g, "QkvNormRopeStore"), live(&g, "SwiGLU")), (0, 1));
    // The switches, one at a time.
    let mut g = layer(1, false, false);
    assert_eq!(
        run(
            &mut g,
            true,
            FusionConfig {
                qkv: false,
                ffn: true,
                ..FusionConfig::NONE
            }
        ),
        1
    );
    assert_eq!((live(&g, "QkvRopeStore"), live(&g, "FfnGateUp")), (0, 1));
    let mut g = layer(1, false, false);
    assert_eq!(
        run(
            &mut g,
            true,
            FusionConfig {
                qkv: true,
                ffn: false,
                ..FusionConfig::NONE
            }
        ),
        2
    );
    assert_eq!((live(&g, "QkvRopeStore"), live(&g, "SwiGLU")), (1, 1));
    let mut g = layer(1, false, false);
    assert_eq!(run(&mut g, true, FusionConfig::NONE), 1);
    assert_eq!(live(&g, "SwiGLU"), 1);
}

/// A decode FFN block with its pre-norm and residual: `x + down(swiglu(gate(n), up(n)))`
/// with `n = RmsNorm(x)` (`group` elements per norm group); `leak_norm` gives the norm a
/// second consumer.
fn ffn_block(nt: usize, group: usize, leak_norm: bool) -> Graph {
    let w = |i: u32| WeightId(i);
    let mm = |weight: u32| Op::MatMul {
        weight: w(weight),
        bias: None,
    };
    let mut g = GraphBuilder::new();
    let tokens = g.input(InputKind::TokenIds, [1, nt]);
    g.set_layer(Some(0));
    let x = g.op("embd", Op::GetRows { weight: w(0) }, &[tokens], [D, nt]);
    let norm = Op::RmsNorm {
        eps: 1e-6,
        weight: w(1),
        group,
    };
    let n = g.op("ffn_norm", norm, &[x], [D, nt]);
    let gate = g.op("gate", mm(2), &[n], [96, nt]);
    let up = g.op("up", mm(3), &[n], [96, nt]);
    let s = g.op("swiglu", Op::SwiGLU, &[gate, up], [96, nt]);
    let down = g.op("down", mm(4), &[s], [D, nt]);
    let mut out = g.op("residual", Op::Add, &[x, down], [D, nt]);
    if leak_norm {
        out = g.op("leak", Op::Add, &[out, n], [D, nt]);
    }
    let mut graph = g.finish(out);
    for n in &mut graph.nodes {
        n.backend = Some(BackendId(1));
    }
    graph
}

#[test]
fn the_pre_norm_and_the_residual_fold_into_the_decode_nodes() {
    let mut g = ffn_block(1, D, false);
    // gate/up/SwiGLU, then the norm into it, then down + residual.
    assert_eq!(run(&mut g, true, FusionConfig::ALL), 3);
    let ffn = by_name(&g, "swiglu");
    assert_eq!(
        ffn.op,
        Op::FfnGateUp {
            gate: WeightId(2),
            up: WeightId(3),
            in_norm: Some(InputNorm {
                weight: WeightId(1),
                eps: 1e-6
            }),
        }
    );
    assert_eq!(ffn.src, [by_name(&g, "embd").id]);
    let res = by_name(&g, "residual");
    assert_eq!(
        res.op,
        Op::MatMulAdd {
            weight: WeightId(4),
            bias: None
        }
    );
    assert_eq!(res.src, [ffn.id, by_name(&g, "embd").id]);
    assert_eq!(
        (live(&g, "RmsNorm"), live(&g, "MatMul"), live(&g, "Add")),
        (0, 0, 0)
    );

    // Controls: each switch alone, a norm by groups, a norm with another consumer, prefill,
    // a backend without the fused classes.
    let mut g = ffn_block(1, D, false);
    let cfg = FusionConfig {
        norm: false,
        ..FusionConfig::ALL
    };
    assert_eq!(run(&mut g, true, cfg), 2);
    assert_eq!((live(&g, "RmsNorm"), live(&g, "MatMulAdd")), (1, 1));
    let mut g = ffn_block(1, D, false);
    let cfg = FusionConfig {
        add: false,
        ..FusionConfig::ALL
    };
    assert_eq!(run(&mut g, true, cfg), 2);
    assert_eq!(
        (live(&g, "RmsNorm"), live(&g, "Add"), live(&g, "MatMul")),
        (0, 1, 1)
    );
    let mut g = ffn_block(1, HD, false);
    run(&mut g, true, FusionConfig::ALL);
    assert_eq!(
        live(&g, "RmsNorm"),
        1,
        "a norm by {HD}-element groups stays"
    );
    let mut g = ffn_block(1, D, true);
    run(&mut g, true, FusionConfig::ALL);
    assert_eq!(live(&g, "RmsNorm"), 1, "a norm read twice stays");
    let mut g = ffn_block(2, D, false);
    run(&mut g, true, FusionConfig::ALL);
    assert_eq!(
        (live(&g, "RmsNorm"), live(&g, "MatMulAdd")),
        (1, 0),
        "prefill"
    );
    let mut g = ffn_block(1, D, false);
    assert_eq!(run(&mut g, false, FusionConfig::ALL), 0);
}
