//! Peephole fusion: `Mul(Silu(a), b)` (Silu on either side) becomes `SwiGLU(a, b)` when the
//! Mul's backend supports the fused op, the Silu runs on the same backend and the Mul is the
//! Silu's only consumer. The Silu node is marked dead (no buffer, never executed).

use crate::backend::{Backend, FusedOp};
use crate::ir::{Graph, Op};

/// Returns the number of rewrites.
pub fn fuse(graph: &mut Graph, backends: &[Box<dyn Backend>]) -> usize {
    let consumers = graph.consumers();
    let mut count = 0;
    for i in 0..graph.nodes.len() {
        let node = &graph.nodes[i];
        if node.dead || node.op != Op::Mul {
            continue;
        }
        let Some(be) = backends.iter().find(|b| Some(b.id()) == node.backend) else {
            continue;
        };
        if !be.supports_fused(FusedOp::SwiGLU) {
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
