//! The graph cache: built, assigned, fused and planned graphs keyed by [`GraphParams`], most
//! recently used first. A hit reuses everything, so decode steps never rebuild.

use crate::alloc::{Allocator, Plan};
use crate::assign::assign_backends;
use crate::backend::{Backend, WeightSource};
use crate::error::Result;
use crate::fusion::fuse;
use crate::ir::{Graph, GraphParams, Node};

pub struct GraphCache {
    entries: Vec<(GraphParams, Graph, Plan)>,
    capacity: usize,
    builds: usize,
}

impl GraphCache {
    pub fn new(capacity: usize) -> Self {
        GraphCache {
            entries: Vec::new(),
            capacity: capacity.max(1),
            builds: 0,
        }
    }

    /// How many graphs were built so far (misses).
    pub fn builds(&self) -> usize {
        self.builds
    }

    /// Drops every cached graph, returning its buffers to the allocator.
    pub fn clear(&mut self, alloc: &mut Allocator) {
        for (_, _, plan) in self.entries.drain(..) {
            alloc.release(plan);
        }
    }

    /// The graph for `params`: reused when cached, else built by `build`, assigned, fused
    /// and planned.
    #[allow(clippy::too_many_arguments)]
    pub fn get_or_build(
        &mut self,
        params: &GraphParams,
        build: &dyn Fn(&GraphParams) -> Result<Graph>,
        kv_bytes: &dyn Fn(&Node) -> Result<usize>,
        backends: &mut [Box<dyn Backend>],
        weights: &dyn WeightSource,
        alloc: &mut Allocator,
    ) -> Result<(&Graph, &Plan)> {
        if let Some(pos) = self.entries.iter().position(|(p, _, _)| p == params) {
            let e = self.entries.remove(pos);
            self.entries.insert(0, e);
        } else {
            let mut graph = build(params)?;
            assign_backends(&mut graph, backends, weights)?;
            fuse(&mut graph, backends);
            let plan = alloc.plan(&graph, backends, kv_bytes)?;
            self.builds += 1;
            self.entries.insert(0, (params.clone(), graph, plan));
            while self.entries.len() > self.capacity {
                if let Some((_, _, plan)) = self.entries.pop() {
                    alloc.release(plan);
                }
            }
        }
        let (_, g, p) = &self.entries[0];
        Ok((g, p))
    }
}
