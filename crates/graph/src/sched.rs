//! The scheduler: runs live nodes in build order as contiguous same-backend splits, stages
//! cross-backend values through host memory before the consuming node, and synchronises a
//! backend whenever the split changes and once at the end. It never allocates.

use crate::alloc::Plan;
use crate::backend::{Backend, BackendId, ExecArgs, WeightSource};
use crate::error::{Error, Result};
use crate::ir::{Graph, InputKind};

fn index_of(backends: &[Box<dyn Backend>], id: BackendId) -> Result<usize> {
    backends
        .iter()
        .position(|b| b.id() == id)
        .ok_or_else(|| Error::Graph(format!("backend {id} does not participate")))
}

/// The contiguous same-backend runs of live nodes: (backend, node indices).
pub fn splits(graph: &Graph) -> Vec<(BackendId, Vec<usize>)> {
    let mut out: Vec<(BackendId, Vec<usize>)> = Vec::new();
    for n in graph.nodes.iter().filter(|n| !n.dead) {
        let Some(be) = n.backend else { continue };
        match out.last_mut() {
            Some((b, v)) if *b == be => v.push(n.id.index()),
            _ => out.push((be, vec![n.id.index()])),
        }
    }
    out
}

pub fn execute(
    graph: &Graph,
    plan: &Plan,
    backends: &mut [Box<dyn Backend>],
    weights: &dyn WeightSource,
) -> Result<()> {
    let mut host = Vec::new();
    for (be, nodes) in splits(graph) {
        let bi = index_of(backends, be)?;
        for i in nodes {
            let node = &graph.nodes[i];
            if matches!(node.op, crate::ir::Op::Input(_)) {
                continue; // host-filled
            }
            for st in &plan.stages[i] {
                host.resize(st.bytes, 0);
                let from = index_of(backends, st.from.0)?;
                backends[from].read(st.from.1, 0, &mut host)?;
                backends[bi].write(st.to, 0, &host)?;
            }
            let args = ExecArgs {
                srcs: &plan.src_bufs[i],
                out: plan.node_buf[i].map(|(_, b)| b),
                kv: plan.kv[i],
                weights,
            };
            backends[bi].execute_node(node, &args)?;
        }
        backends[bi].synchronize()?;
    }
    Ok(())
}

/// Writes an i32 input; its length must be the input's element count.
pub fn fill_input(
    graph: &Graph,
    plan: &Plan,
    backends: &mut [Box<dyn Backend>],
    kind: InputKind,
    data: &[i32],
) -> Result<()> {
    let id = graph.input(kind).ok_or_else(|| Error::Input {
        input: kind.name().into(),
        problem: "the graph has no such input".into(),
    })?;
    let want = graph.node(id).n_elems();
    if data.len() != want {
        return Err(Error::Input {
            input: kind.name().into(),
            problem: format!("{} values given, the graph takes {want}", data.len()),
        });
    }
    let (be, buf) = plan.node_buf[id.index()]
        .ok_or_else(|| Error::Graph(format!("input {} has no buffer", kind.name())))?;
    let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
    let bi = index_of(backends, be)?;
    backends[bi].write(buf, 0, &bytes)
}

/// The output node's values.
pub fn read_output(
    graph: &Graph,
    plan: &Plan,
    backends: &mut [Box<dyn Backend>],
    out: &mut Vec<f32>,
) -> Result<()> {
    let node = graph.node(graph.output);
    let (be, buf) = plan.node_buf[graph.output.index()]
        .ok_or_else(|| Error::Graph("the output has no buffer".into()))?;
    let mut bytes = vec![0u8; node.n_bytes()];
    let bi = index_of(backends, be)?;
    backends[bi].read(buf, 0, &mut bytes)?;
    out.clear();
    out.extend(
        bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
    );
    Ok(())
}
