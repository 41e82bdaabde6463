//! The scheduler: runs live nodes in build order as contiguous same-backend splits, each
//! split whole, moves cross-backend values through host memory in two phases (the read is
//! begun when the producing split is submitted and finished before the consuming split
//! runs), and synchronises every backend once at the end. It never allocates buffers.

use crate::alloc::{Plan, Stage};
use crate::backend::{Backend, BackendId, ExecArgs, ReadTicket, SplitKey, WeightSource};
use crate::error::{Error, Result};
use crate::ir::{Graph, InputKind, Node, Op, RowClasses};

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

/// Runs a planned graph, each split under its [`SplitKey`] (the plan's id and the split's
/// index). Per split, in order: finish the reads of the values it consumes
/// from other backends (begun when their producers' splits were submitted) and write them
/// into its staging buffers, run the split whole, then begin the reads of its values that
/// later splits consume. Every backend is synchronised at the end. `rows` are the classes
/// of the forward's rows, handed to every backend first.
pub fn execute(
    graph: &Graph,
    plan: &Plan,
    backends: &mut [Box<dyn Backend>],
    weights: &dyn WeightSource,
    rows: &RowClasses,
) -> Result<()> {
    for b in backends.iter_mut() {
        b.set_row_classes(rows);
    }
    let splits = splits(graph);
    let mut split_of = vec![usize::MAX; graph.nodes.len()];
    for (k, (_, nodes)) in splits.iter().enumerate() {
        for &i in nodes {
            split_of[i] = k;
        }
    }
    // Every cross-backend copy, with the split that produces its value and the one that
    // consumes it (one copy per (value, destination) even when several nodes read it).
    let mut copies: Vec<(usize, usize, Stage)> = Vec::new();
    for (k, (_, nodes)) in splits.iter().enumerate() {
        for &i in nodes {
            for st in &plan.stages[i] {
                if !copies
                    .iter()
                    .any(|c| c.2.to == st.to && c.2.from == st.from)
                {
                    copies.push((split_of[st.producer.index()], k, *st));
                }
            }
        }
    }
    let mut tickets: Vec<Option<ReadTicket>> = vec![None; copies.len()];
    let mut host = Vec::new();
    let mut used = vec![false; backends.len()];
    for (k, (be, nodes)) in splits.iter().enumerate() {
        let bi = index_of(backends, *be)?;
        used[bi] = true;
        for (c, (_, consumer, st)) in copies.iter().enumerate() {
            if *consumer != k {
                continue;
            }
            let ticket = tickets[c].take().ok_or_else(|| {
                Error::Graph(format!(
                    "a value for split {k} was never read from backend {}",
                    st.from.0
                ))
            })?;
            host.resize(st.bytes, 0);
            let from = index_of(backends, st.from.0)?;
            backends[from].read_finish(ticket, &mut host)?;
            backends[bi].write(st.to, 0, &host)?;
        }
        let live = |nodes: &[usize]| -> (Vec<&Node>, Vec<ExecArgs>) {
            nodes
                .iter()
                .copied()
                .filter(|&i| !matches!(graph.nodes[i].op, Op::Input(_))) // host-filled
                .map(|i| {
                    let a = ExecArgs {
                        srcs: &plan.src_bufs[i],
                        out: plan.node_buf[i].map(|(_, b)| b),
                        kv: plan.kv[i],
                        weights,
                    };
                    (&graph.nodes[i], a)
                })
                .unzip()
        };
        let (run, args) = live(nodes);
        // With streamed blocks, the next split's backend, told ahead, copies that split's
        // weights in while this one runs (a graph without them has nothing to overlap).
        let ahead = graph.streamed_blocks.and(splits.get(k + 1));
        if let Some((next_be, next)) = ahead.filter(|(b, _)| b != be) {
            let (n_run, n_args) = live(next);
            if !n_run.is_empty() {
                let key = SplitKey {
                    plan: plan.id,
                    split: k as u32 + 1,
                };
                let ni = index_of(backends, *next_be)?;
                backends[ni].prefetch_split(key, &n_run, &n_args)?;
            }
        }
        if !run.is_empty() {
            let key = SplitKey {
                plan: plan.id,
                split: k as u32,
            };
            backends[bi].execute_split(key, &run, &args)?;
        }
        for (c, (producer, _, st)) in copies.iter().enumerate() {
            if *producer == k {
                tickets[c] = Some(backends[bi].read_begin(st.from.1, 0, st.bytes)?);
            }
        }
    }
    for (b, used) in backends.iter_mut().zip(used) {
        if used {
            b.synchronize()?;
        }
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
    let bi = index_of(backends, be)?;
    let n = node.n_elems();
    out.clear();
    out.resize(n, 0.0);
    if cfg!(target_endian = "little") {
        // Read straight into the floats (a forward's logits, read every step): buffers hold
        // little-endian f32, which on a little-endian host is the f32's own bytes.
        // SAFETY: `out` holds `n` initialised f32s, 4 bytes each; u8 has alignment 1, and
        // every byte pattern the read writes is a valid f32.
        let bytes = unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<u8>(), 4 * n) };
        return backends[bi].read(buf, 0, bytes);
    }
    let mut bytes = vec![0u8; 4 * n];
    backends[bi].read(buf, 0, &mut bytes)?;
    for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
        *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
    Ok(())
}
