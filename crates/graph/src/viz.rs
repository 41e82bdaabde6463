//! The graph as `minfer viz` draws it (`GET /viz/graph`): every live node with its op,
//! shape, backend, layer, weight type, the path it belongs to and, for a fused node, the
//! unfused ops it stands for; and every edge, KV edges marked.
//!
//! The page filters by `role` (attention path, FFN path, KV, inputs/outputs) and groups by
//! `layer`; per-step statistics from a trace are matched to nodes by `name`.

use crate::backend::{BackendId, WeightId, WeightSource};
use crate::ir::{Graph, Node, Op};
use serde_json::{json, Value};

/// Which part of the model a node computes, as the page's filters name it.
pub fn role(graph: &Graph, n: &Node) -> &'static str {
    role_by(n.op.name(), &n.name, n.id == graph.output)
}

/// [`role`] from an op's name and a node's name (a trace has no graph): the op decides
/// where it can, else the builders' name suffix (`L3.ffn_norm`).
pub fn role_by(op: &str, name: &str, is_output: bool) -> &'static str {
    match op {
        "Input" => return "input",
        "KvStore" => return "kv",
        "Attention" | "Rope" | "QkvRopeStore" => return "attention",
        "FfnGateUp" | "SwiGLU" | "Silu" => return "ffn",
        _ => {}
    }
    if is_output {
        return "output";
    }
    match name.rsplit('.').next().unwrap_or("") {
        "attn_norm" | "q" | "k" | "v" | "qkv" | "q_norm" | "k_norm" | "q_rope" | "k_rope"
        | "attn" | "attn_out" | "attn_res" | "attn_tail" => "attention",
        "ffn_norm" | "gate" | "up" | "silu" | "gate_up" | "down" | "ffn_res" | "ffn" => "ffn",
        "embd" => "input",
        "logits" => "output",
        _ => "other",
    }
}

/// The unfused ops a fused op of this name stands for, without the optional norms only the
/// op's parameters tell (a trace names ops, [`fused_from`] reads them).
pub fn fused_by_name(op: &str) -> Option<Vec<&'static str>> {
    Some(match op {
        "SwiGLU" => vec!["Silu", "Mul"],
        "MatMulAdd" => vec!["MatMul", "Add"],
        "FfnGateUp" => vec!["MatMul", "MatMul", "SwiGLU"],
        "QkvRopeStore" => vec![
            "MatMul", "MatMul", "MatMul", "Rope", "Rope", "KvStore", "KvStore",
        ],
        _ => return None,
    })
}

/// The unfused ops a fused node computes exactly (None for an unfused node).
pub fn fused_from(op: &Op) -> Option<Vec<&'static str>> {
    let with_norm = |norm: bool, mut v: Vec<&'static str>| {
        if norm {
            v.insert(0, "RmsNorm");
        }
        v
    };
    Some(match op {
        Op::SwiGLU => vec!["Silu", "Mul"],
        Op::MatMulAdd { .. } => vec!["MatMul", "Add"],
        Op::FfnGateUp { in_norm, .. } => {
            with_norm(in_norm.is_some(), vec!["MatMul", "MatMul", "SwiGLU"])
        }
        Op::QkvRopeStore(f) => {
            let mut v = vec!["MatMul", "MatMul", "MatMul"];
            if f.norm.is_some() {
                v.extend(["RmsNorm", "RmsNorm"]);
            }
            v.extend(["Rope", "Rope", "KvStore", "KvStore"]);
            with_norm(f.in_norm.is_some(), v)
        }
        _ => return None,
    })
}

/// The weight a node reads most of (a matmul's matrix, a norm's gain).
fn main_weight(op: &Op) -> Option<WeightId> {
    match op {
        Op::GetRows { weight } | Op::MatMul { weight, .. } | Op::RmsNorm { weight, .. } => {
            Some(*weight)
        }
        Op::MatMulAdd { weight, .. } => Some(*weight),
        Op::FfnGateUp { gate, .. } => Some(*gate),
        Op::QkvRopeStore(f) => Some(f.wq),
        _ => None,
    }
}

/// `{"output", "n_layers", "nodes": [{id, name, op, shape, dtype, backend, layer, role,
/// weight, weight_type, fused}], "edges": [{src, dst, kv}]}`; dead (fused-away) nodes are
/// left out.
pub fn to_viz(
    graph: &Graph,
    backend_name: &dyn Fn(BackendId) -> String,
    weights: &dyn WeightSource,
) -> Value {
    let live = || graph.nodes.iter().filter(|n| !n.dead);
    // The blocks are the layers that hold KV; the final norm and head carry the layer one
    // past the last block (the output position a layer plan places), drawn as the output.
    let n_layers = live()
        .filter(|n| n.op.kv_cache_type().is_some())
        .filter_map(|n| n.layer)
        .max()
        .map_or(0, |l| l + 1);
    let nodes: Vec<Value> = live()
        .map(|n| {
            let w = main_weight(&n.op);
            json!({
                "id": n.id.0,
                "name": n.name,
                "op": n.op.name(),
                "shape": n.shape,
                "dtype": format!("{:?}", n.dtype),
                "backend": n.backend.map(backend_name),
                "layer": n.layer.filter(|&l| l < n_layers),
                "role": role(graph, n),
                "weight": w.map(|w| weights.name(w).to_string()),
                "weight_type": w.and_then(|w| weights.weight(w)).map(|r| r.ty.name()),
                "fused": fused_from(&n.op),
            })
        })
        .collect();
    let is_kv = |id: crate::ir::NodeId| {
        graph
            .nodes
            .get(id.index())
            .is_some_and(|n| matches!(n.op, Op::KvStore { .. }))
    };
    let edges: Vec<Value> = live()
        .flat_map(|n| {
            n.src
                .iter()
                .map(move |&s| json!({"src": s.0, "dst": n.id.0, "kv": is_kv(s) || is_kv(n.id)}))
        })
        .collect();
    json!({"output": graph.output.0, "n_layers": n_layers, "nodes": nodes, "edges": edges})
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The op decides first, then the name's suffix; a node of neither path is "other".
    /// Control: the suffixes are the graph builders' (`L3.ffn_norm`), checked against a
    /// real graph's roles in server/tests/viz.rs.
    #[test]
    fn roles_from_op_then_name() {
        assert_eq!(role_by("Input", "positions", false), "input");
        assert_eq!(role_by("KvStore", "L0.k_store", false), "kv");
        assert_eq!(role_by("Attention", "L0.attn", false), "attention");
        assert_eq!(role_by("MatMul", "L2.q", false), "attention");
        assert_eq!(role_by("RmsNorm", "L2.ffn_norm", false), "ffn");
        assert_eq!(role_by("MatMulAdd", "L2.ffn_res", false), "ffn");
        assert_eq!(role_by("MatMul", "logits", true), "output");
        assert_eq!(role_by("RmsNorm", "output_norm", false), "other");
        assert_eq!(role_by("GetRows", "embd", false), "input");
    }

    #[test]
    fn fused_ops_name_what_they_stand_for() {
        assert_eq!(fused_by_name("SwiGLU"), Some(vec!["Silu", "Mul"]));
        assert_eq!(fused_by_name("MatMulAdd"), Some(vec!["MatMul", "Add"]));
        assert_eq!(fused_by_name("QkvRopeStore").map(|v| v.len()), Some(7));
        assert_eq!(fused_by_name("MatMul"), None);
        assert_eq!(fused_from(&Op::SwiGLU), fused_by_name("SwiGLU"));
        assert_eq!(fused_from(&Op::Add), None);
    }
}
