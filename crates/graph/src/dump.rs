//! Graph exports: Graphviz DOT coloured by backend, and JSON.

use crate::backend::{BackendId, WeightId};
use crate::ir::{Graph, Op};
use serde_json::json;

const COLOURS: [&str; 6] = [
    "lightblue",
    "lightsalmon",
    "palegreen",
    "khaki",
    "plum",
    "lightgrey",
];

fn colour(be: Option<BackendId>) -> &'static str {
    match be {
        Some(b) => COLOURS[(b.0 as usize).min(COLOURS.len() - 2)],
        None => COLOURS[COLOURS.len() - 1],
    }
}

/// Names weights in dumps.
pub type WeightNames<'a> = &'a dyn Fn(WeightId) -> String;

fn detail(op: &Op, wn: WeightNames) -> String {
    match op {
        Op::Input(k) => k.name().into(),
        Op::GetRows { weight } => wn(*weight),
        Op::MatMul { weight, bias } => match bias {
            Some(b) => format!("{} + {}", wn(*weight), wn(*b)),
            None => wn(*weight),
        },
        Op::RmsNorm { weight, .. } => wn(*weight),
        Op::KvStore {
            layer,
            kind,
            cache_type,
        } => format!("L{layer} {kind:?} {cache_type}"),
        Op::Attention {
            layer,
            n_head,
            n_head_kv,
            head_dim,
            ..
        } => {
            format!("L{layer} {n_head}/{n_head_kv}x{head_dim}")
        }
        Op::Rope { style, .. } => format!("{style:?}"),
        Op::QkvRopeStore(f) => format!(
            "L{} {}|{}|{} {}",
            f.layer,
            wn(f.wq),
            wn(f.wk),
            wn(f.wv),
            f.cache_type
        ),
        Op::FfnGateUp { gate, up, .. } => format!("{}|{}", wn(*gate), wn(*up)),
        _ => String::new(),
    }
}

/// Graphviz DOT; `backend_name` maps ids to names for the legend.
pub fn to_dot(
    graph: &Graph,
    backend_name: &dyn Fn(BackendId) -> String,
    weight_name: WeightNames,
) -> String {
    let mut s = String::from(
        "digraph minfer {\n  node [shape=box, style=filled, fontname=\"monospace\"];\n",
    );
    let mut seen: Vec<BackendId> = Vec::new();
    for n in graph.nodes.iter().filter(|n| !n.dead) {
        let be = n
            .backend
            .map(backend_name)
            .unwrap_or_else(|| "unassigned".into());
        if let Some(b) = n.backend {
            if !seen.contains(&b) {
                seen.push(b);
            }
        }
        s += &format!(
            "  n{} [label=\"{}\\n{} {}\\n[{}, {}] {}\", fillcolor={}];\n",
            n.id.0,
            n.name.replace('"', "'"),
            n.op.name(),
            detail(&n.op, weight_name).replace('"', "'"),
            n.shape[0],
            n.shape[1],
            be,
            colour(n.backend)
        );
        for src in &n.src {
            s += &format!("  n{} -> n{};\n", src.0, n.id.0);
        }
    }
    s += "  subgraph cluster_legend { label=\"backends\";\n";
    for b in seen {
        s += &format!(
            "    legend{} [label=\"{}\", fillcolor={}];\n",
            b.0,
            backend_name(b),
            colour(Some(b))
        );
    }
    s += "  }\n}\n";
    s
}

/// JSON: `{"output": id, "nodes": [{id, name, op, detail, src, shape, dtype, backend, layer}]}`.
pub fn to_json(
    graph: &Graph,
    backend_name: &dyn Fn(BackendId) -> String,
    weight_name: WeightNames,
) -> String {
    let nodes: Vec<_> = graph
        .nodes
        .iter()
        .filter(|n| !n.dead)
        .map(|n| {
            json!({
                "id": n.id.0,
                "name": n.name,
                "op": n.op.name(),
                "detail": detail(&n.op, weight_name),
                "src": n.src.iter().map(|s| s.0).collect::<Vec<_>>(),
                "shape": n.shape,
                "dtype": format!("{:?}", n.dtype),
                "backend": n.backend.map(|b| b.0),
                "backend_name": n.backend.map(backend_name),
                "layer": n.layer,
            })
        })
        .collect();
    serde_json::to_string_pretty(&json!({"output": graph.output.0, "nodes": nodes}))
        .unwrap_or_default()
}
