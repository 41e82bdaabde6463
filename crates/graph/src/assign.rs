//! Backend assignment, decided once at build time: every node goes to the first backend, in
//! the order the engine holds them (the registry's order, which is their priority: Metal, CUDA,
//! CPU), that holds the node's weights ([`Placement`]) and whose `supports_op` accepts it.
//! Under a layer plan (layer offload) a node's search starts at its block's backend
//! ([`crate::LayerPlan::home`]): a block on the CPU never sends a node to the device, and a
//! node a device block's backend refuses goes to a lower-priority one, as without a plan.
//! No backend accepting a node is an error naming each backend's reason, never a mid-run
//! fallback. A graph of prompt rows with streamed blocks ([`Graph::streamed_blocks`]) first
//! offers a CPU block's node that touches no KV to the device, which takes it when it runs
//! the op and holds or can stream each of its weights.

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
    let streamed = graph
        .streamed_blocks
        .and_then(|(dev, blocks)| Some((*order.iter().find(|b| b.id() == dev)?, blocks)));
    for node in graph.nodes.iter_mut().filter(|n| !n.dead) {
        if let (Some((dev, blocks)), Some(l)) = (streamed, node.layer) {
            let home = placement.layers().map(|p| p.home(node.layer));
            let takes = l < blocks
                && home != Some(dev.id())
                && node.op.kv_layer().is_none()
                && dev.supports_op(&node.op, node.dtype, weights).is_ok()
                && node.op.weights().all(|w| {
                    placement.holds_weight(dev.id(), w)
                        || weights
                            .weight(w)
                            .is_some_and(|r| dev.can_stream(&r).is_ok())
                });
            if takes {
                node.backend = Some(dev.id());
                continue;
            }
        }
        let reads_weights = node.op.weights().next().is_some();
        let first = match placement.layers() {
            Some(plan) => {
                let home = plan.home(node.layer);
                order.iter().position(|b| b.id() == home).unwrap_or(0)
            }
            None => 0,
        };
        let mut refusals = Vec::new();
        let mut chosen = None;
        for b in &order[first..] {
            let held = node.op.weights().all(|w| placement.holds_weight(b.id(), w));
            if reads_weights && !held {
                let what = if placement.layers().is_some() {
                    "holds none of this block's weights"
                } else {
                    "holds none of the model's weights"
                };
                refusals.push(format!("{} ({what})", b.name()));
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
