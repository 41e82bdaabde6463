//! A sequence's KV cell operations as a graph (ADR 0012 step 6): a copy of cells (a
//! defragmentation's move, a prefix copied into fresh cells, copy-on-write) or a re-rope of
//! K rows (a shift) becomes one node per layer and region, on the backend that holds the
//! layer's regions, planned and run by the scheduler like a forward.

use crate::backend::{BackendId, KvLayout, RopeSpec};
use crate::ir::{Graph, GraphBuilder, KvKind, Op};

/// One KV cell operation of a sequence: what [`cell_ops_graph`] turns into nodes per layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CellWork {
    /// `n` cells from `src` to `dst` in K and V.
    Copy { src: usize, dst: usize, n: usize },
    /// The K rows of `cell..cell + n` rotated by `delta` positions.
    Shift { cell: usize, n: usize, delta: i64 },
}

/// The graph of a batch of cell operations over the layers that hold KV regions: per
/// layer and operation in order, a [`Op::KvCopy`] for K and one for V, or a
/// [`Op::KvRopeShift`] of K, each on the backend holding that layer's regions. Nodes of
/// one layer run in the order given (an operation may read cells an earlier one wrote);
/// layers are independent. `regions` lists `(layer, backend)` in layer order. The graph
/// has no inputs, and its output is its last node (a region writer: no buffer).
pub fn cell_ops_graph(
    regions: &[(usize, BackendId)],
    work: &[CellWork],
    layout: KvLayout,
    rope: RopeSpec,
) -> Option<Graph> {
    let mut b = GraphBuilder::new();
    let mut last = None;
    for &(layer, backend) in regions {
        b.set_layer(Some(layer));
        for w in work {
            let ops = match *w {
                CellWork::Copy { src, dst, n } => [KvKind::K, KvKind::V]
                    .map(|kind| {
                        let name = format!("L{layer}.kv_copy_{}", kind.name());
                        (
                            name,
                            Op::KvCopy {
                                layer,
                                kind,
                                layout,
                                src,
                                dst,
                                n,
                            },
                        )
                    })
                    .to_vec(),
                CellWork::Shift { cell, n, delta } => vec![(
                    format!("L{layer}.kv_shift_k"),
                    Op::KvRopeShift {
                        layer,
                        layout,
                        rope,
                        cell,
                        n,
                        delta,
                    },
                )],
            };
            for (name, op) in ops {
                let id = b.region_op(name, op);
                b.set_backend(id, backend);
                last = Some(id);
            }
        }
    }
    last.map(|out| b.finish(out))
}
