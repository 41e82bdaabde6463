//! Backend assignment, decided once at build time: every node goes to the first backend, in
//! the order the engine holds them (the registry's order, which is their priority: Metal, CUDA,
//! CPU), that holds the node's weights ([`Placement`]) and whose `supports_op` accepts it. No
//! backend accepting a node is an error naming each backend's reason, never a mid-run
//! fallback.

use crate::backend::{Backend, WeightSource};
use crate::error::{Error, Result};
use crate::ir::Graph;
use crate::placement::Placement;

pub fn assign_backends(
    graph: &mut Graph,
    backends: &[Box<dyn Backend>],
    weights: &dyn WeightSource,
    placement: &Placement,
) -> Result<()> {
    let order: Vec<&dyn Backend> = backends.iter().map(|b| b.as_ref()).collect();
    for node in graph.nodes.iter_mut().filter(|n| !n.dead) {
        let reads_weights = node.op.weights().next().is_some();
        let mut refusals = Vec::new();
        let mut chosen = None;
        for b in &order {
            if reads_weights && !placement.holds(b.id()) {
                refusals.push(format!("{} (holds none of the model's weights)", b.name()));
                continue;
            }
            match b.supports_op(&node.op, node.dtype, weights) {
                Ok(()) => {
                    chosen = Some(*b);
                    break;
                }
                Err(why) => refusals.push(format!("{} ({why})", b.name())),
            }
        }
        let chosen = chosen.ok_or_else(|| Error::Unsupported {
            node: node.name.clone(),
            op: format!("{:?}", node.op),
            backends: refusals.join(", "),
        })?;
        node.backend = Some(chosen.id());
    }
    Ok(())
}
