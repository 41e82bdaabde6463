//! Arming and ending a trace on an engine ([`crate::trace`] holds the format and what a
//! forward records).

use crate::engine::{Engine, Result};
use crate::trace::{Phase, Trace};
use minfer_graph::NodeId;

impl Engine {
    /// Arms capture on every backend and starts a trace (a running one is dropped).
    pub fn trace_begin(&mut self) -> Result<()> {
        for be in self.runner.backends_mut() {
            be.capture(true)?;
            be.take_captures()?;
        }
        let md = self.runner.model().metadata();
        let model = md
            .get_str("general.name")
            .or_else(|| md.get_str("general.architecture"))
            .unwrap_or("unknown")
            .to_string();
        // Listed by backend id (the CPU first), whatever the engine's priority order.
        let mut ids: Vec<_> = self.runner.backends().iter().map(|b| b.id()).collect();
        ids.sort_unstable();
        let backends = ids.into_iter().map(crate::backends::name_of).collect();
        let timing = self.node_time_sources();
        *self.runner.trace_slot() = Some(Trace {
            model,
            backends,
            timing,
            phases: Vec::new(),
        });
        Ok(())
    }

    /// Per backend that times its nodes while a trace is armed, what the times measure
    /// (backend id order, the CPU first): a trace's `timing`, `minfer viz`'s timeline.
    pub fn node_time_sources(&self) -> Vec<(String, String)> {
        let mut v: Vec<_> = self
            .runner
            .backends()
            .iter()
            .filter_map(|b| b.node_time_source().map(|w| (b.id(), w)))
            .collect();
        v.sort_unstable_by_key(|(id, _)| *id);
        v.into_iter()
            .map(|(id, w)| (crate::backends::name_of(id), w.to_string()))
            .collect()
    }

    /// The node times every backend holds now (taken): (backend, node, ns), each backend's
    /// in execution order. For the gates of the contract (an untraced forward leaves none);
    /// a trace takes them itself after each forward.
    #[doc(hidden)]
    pub fn take_node_times(&mut self) -> Vec<(String, NodeId, u64)> {
        let mut out = Vec::new();
        for b in self.runner.backends_mut() {
            let name = crate::backends::name_of(b.id());
            out.extend(
                b.take_node_times()
                    .into_iter()
                    .map(|(n, t)| (name.clone(), n, t)),
            );
        }
        out
    }

    /// A copy of the trace so far, capture staying armed (None when none was begun).
    pub fn trace_snapshot(&mut self) -> Option<Trace> {
        self.runner.trace_slot().clone()
    }

    /// Copies of the phases recorded from index `from` on, capture staying armed (empty
    /// when no trace was begun): what a live view streams after each forward.
    pub fn trace_phases_from(&mut self, from: usize) -> Vec<Phase> {
        self.runner
            .trace_slot()
            .as_ref()
            .map(|t| t.phases.get(from..).unwrap_or_default().to_vec())
            .unwrap_or_default()
    }

    /// Disarms capture and hands the trace over (None when none was begun).
    pub fn trace_end(&mut self) -> Result<Option<Trace>> {
        for be in self.runner.backends_mut() {
            be.capture(false)?;
        }
        Ok(self.runner.trace_slot().take())
    }
}
