//! Faults a test arms on an engine, to prove what the layers above it do when a backend
//! fails in the middle of a batch or hands back NaN logits (the server's fault gates,
//! `crates/server/tests/faults.rs`; the engine's own, `tests/faults.rs`).
//!
//! A fault follows one sequence: every forward holding it strikes, until the fault is
//! cleared or the sequence released. A failing fault strikes *after* the backend ran, so the
//! batch's cells were reserved and its KV rows written: what undoes that is the staging
//! checkpoint ([`crate::kvcells`]' `restore`), exactly as for a backend's own error. Nothing
//! arms a fault in normal use; an engine without one pays an empty-vector check per forward.

use crate::engine::{Engine, Error, Result};
use crate::kvcells::SeqId;
use crate::model::BatchEntry;

/// What an armed fault does to a forward holding its sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InjectedFault {
    /// The forward fails and the error names the sequence's entry ([`Error::Entry`]), as a
    /// backend that can tell which row broke would.
    FailNamingEntry,
    /// The forward fails and the error names no entry (a device error for the whole batch).
    FailUnattributed,
    /// The forward succeeds, and every second logit of the sequence's rows is NaN: a row only
    /// partly NaN is the case a sampler that skips NaN would answer with a plausible token.
    NanLogits,
}

impl Engine {
    /// Arms `fault` on `seq` (replacing one armed before).
    pub fn inject_fault(&mut self, seq: SeqId, fault: InjectedFault) {
        self.faults.retain(|(s, _)| *s != seq);
        self.faults.push((seq, fault));
    }

    /// Disarms every fault.
    pub fn clear_faults(&mut self) {
        self.faults.clear();
    }

    /// Applies the armed faults to a forward of `entries` that the backend just ran: poisons
    /// logits in place, or returns the error the forward ends with (the caller rolls back).
    pub(crate) fn strike_faults(&mut self, entries: &[BatchEntry]) -> Result<()> {
        if self.faults.is_empty() {
            return Ok(());
        }
        for (i, e) in entries.iter().enumerate() {
            let Some(&(_, fault)) = self.faults.iter().find(|(s, _)| *s == e.seq) else {
                continue;
            };
            match fault {
                InjectedFault::FailNamingEntry => {
                    return Err(Error::Entry {
                        entry: i,
                        source: Box::new(Error::Injected(format!(
                            "the backend failed on the rows of sequence {}",
                            e.seq.0
                        ))),
                    })
                }
                InjectedFault::FailUnattributed => {
                    return Err(Error::Injected(
                        "the backend failed for the batch (no row named)".into(),
                    ))
                }
                InjectedFault::NanLogits => self.runner.out_mut().poison_entry(i),
            }
        }
        Ok(())
    }

    /// A released sequence's faults go with it (a later sequence is not struck by them).
    pub(crate) fn forget_faults(&mut self, seq: SeqId) {
        self.faults.retain(|(s, _)| *s != seq);
    }
}
