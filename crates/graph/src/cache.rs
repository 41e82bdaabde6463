//! The graph cache: built, assigned, fused and planned graphs keyed by [`GraphParams`], most
//! recently used first. A hit reuses everything, so decode steps never rebuild. Each entry's
//! plan owns its intermediate buffers (two cached graphs never share one); evicting an entry
//! frees them on their backends.

use crate::alloc::{Allocator, Plan};
use crate::assign::assign_backends;
use crate::backend::{Backend, WeightSource};
use crate::error::Result;
use crate::fusion::{fuse, FusionConfig};
use crate::ir::{Graph, GraphParams, Node};
use crate::placement::Placement;

pub struct GraphCache {
    entries: Vec<(GraphParams, Graph, Plan)>,
    capacity: usize,
    /// Most bytes the cached plans may hold together (the newest is always kept).
    max_bytes: usize,
    builds: usize,
    /// Which decode rewrites the built graphs get.
    fusion: FusionConfig,
}

impl GraphCache {
    pub fn new(capacity: usize) -> Self {
        GraphCache {
            entries: Vec::new(),
            capacity: capacity.max(1),
            max_bytes: usize::MAX,
            builds: 0,
            fusion: FusionConfig::from_env(),
        }
    }

    /// A cache that also evicts the least recently used plans while the plans hold more than
    /// `max_bytes` of buffers together.
    pub fn with_byte_cap(capacity: usize, max_bytes: usize) -> Self {
        GraphCache {
            max_bytes,
            ..GraphCache::new(capacity)
        }
    }

    /// Which decode rewrites graphs built from now on get (default: [`FusionConfig::from_env`]).
    /// The rewrites this cache's graphs get.
    pub fn fusion(&self) -> FusionConfig {
        self.fusion
    }

    pub fn set_fusion(&mut self, fusion: FusionConfig) {
        self.fusion = fusion;
    }

    /// Bytes of buffers the cached plans hold.
    pub fn bytes(&self) -> usize {
        self.entries.iter().map(|(_, _, p)| p.bytes()).sum()
    }

    /// How many graphs were built so far (misses).
    pub fn builds(&self) -> usize {
        self.builds
    }

    /// The most recently used graph and plan.
    pub fn most_recent(&self) -> Option<(&Graph, &Plan)> {
        self.entries.first().map(|(_, g, p)| (g, p))
    }

    /// Graphs held now.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Drops every cached graph, freeing its buffers on their backends.
    pub fn clear(&mut self, alloc: &mut Allocator, backends: &mut [Box<dyn Backend>]) {
        for (_, _, plan) in self.entries.drain(..) {
            alloc.release(plan, backends);
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
        placement: &Placement,
        alloc: &mut Allocator,
    ) -> Result<(&Graph, &Plan)> {
        if let Some(pos) = self.entries.iter().position(|(p, _, _)| p == params) {
            let e = self.entries.remove(pos);
            self.entries.insert(0, e);
        } else {
            let mut graph = build(params)?;
            assign_backends(&mut graph, backends, weights, placement)?;
            // The decode rewrites run generation-row kernels: a graph with prompt rows
            // keeps its plain nodes (SwiGLU aside), whose kernels each backend chooses per
            // class.
            let fusion = if params.prompt_rows {
                FusionConfig::NONE
            } else {
                self.fusion
            };
            fuse(&mut graph, backends, weights, fusion);
            // Evict first, so the new plan's buffers fit a budget the old ones filled.
            while self.entries.len() >= self.capacity {
                if let Some((_, _, plan)) = self.entries.pop() {
                    alloc.release(plan, backends);
                }
            }
            let plan = alloc.plan(&graph, backends, kv_bytes)?;
            self.builds += 1;
            self.entries.insert(0, (params.clone(), graph, plan));
            while self.entries.len() > 1 && self.bytes() > self.max_bytes {
                if let Some((_, _, plan)) = self.entries.pop() {
                    alloc.release(plan, backends);
                }
            }
        }
        let (_, g, p) = &self.entries[0];
        Ok((g, p))
    }
}
