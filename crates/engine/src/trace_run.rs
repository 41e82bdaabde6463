//! Arming and ending a trace on an engine ([`crate::trace`] holds the format and what a
//! forward records).

use crate::engine::{Engine, Result};
use crate::trace::{Phase, Trace};

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
        *self.runner.trace_slot() = Some(Trace {
            model,
            backends,
            phases: Vec::new(),
        });
        Ok(())
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
