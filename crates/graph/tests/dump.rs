//! Graph exports carry every live node, its backend and its edges.

use minfer_graph::{dump, BackendId, GraphBuilder, InputKind, Op};

#[test]
fn dot_and_json_show_nodes_edges_and_backends() {
    let mut g = GraphBuilder::new();
    let a = g.input(InputKind::TokenIds, [4, 1]);
    let s = g.op("act", Op::Silu, &[a], [4, 1]);
    let out = g.op("sum", Op::Add, &[s, a], [4, 1]);
    let mut graph = g.finish(out);
    graph.nodes[1].backend = Some(BackendId(0));
    graph.nodes[2].backend = Some(BackendId(1));
    let name = |b: BackendId| ["cpu", "metal"][b.0 as usize].to_string();
    let dot = dump::to_dot(&graph, &name, &|w| format!("w{}", w.0));
    assert!(dot.starts_with("digraph"));
    assert!(dot.contains("n0 -> n1;") && dot.contains("n1 -> n2;") && dot.contains("n0 -> n2;"));
    assert!(
        dot.contains("fillcolor=lightblue") && dot.contains("fillcolor=lightsalmon"),
        "{dot}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&dump::to_json(&graph, &name, &|w| format!("w{}", w.0))).unwrap();
    assert_eq!(json["output"], 2);
    assert_eq!(json["nodes"][2]["backend_name"], "metal");
    assert_eq!(json["nodes"][2]["src"], serde_json::json!([1, 0]));
}
