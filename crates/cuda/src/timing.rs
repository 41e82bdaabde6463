//! Device time per node from CUDA events: a pair recorded on the stream around a node's
//! launches, read once the forward's synchronize has waited for the stream. Two users share
//! it: `MINFER_CUDA_PROFILE=1` (totals per op, printed at drop) and a trace while armed
//! ([`minfer_graph::Executor::take_node_times`]: per node, `minfer viz`'s timeline). With
//! neither, no event is made: [`CudaBackend`](crate::CudaBackend) checks one flag per node.
//!
//! What a pair measures: the device clock from the moment the stream reaches the first
//! event to the moment it reaches the second, so the node's kernels plus any time the stream
//! sat idle between them waiting for the host to issue the next one. A traced forward runs
//! eagerly and reads each captured output back after its node, so the stream is idle when a
//! node starts and the time includes the host's launch latency of its kernels: a bound
//! above the kernels' own time, not a replayed step's.

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::CudaEvent;
use minfer_graph::NodeId;

use crate::device::{DResult, Gpu};

/// What a node time from this backend measures (a trace's `timing`, docs/TRACE.md).
pub(crate) const MEASURES: &str = "device time between CUDA events recorded on the stream \
     before and after the node's launches (a traced forward runs eagerly: it includes the \
     stream waiting for the host to issue each kernel)";

/// One node's event pair and who wants its time.
pub(crate) struct Span {
    /// The profile's key (op and row class), when profiling.
    pub key: Option<String>,
    /// The node, when a trace is armed and the node issued work on the stream.
    pub node: Option<NodeId>,
    start: CudaEvent,
    end: CudaEvent,
}

impl Span {
    /// Milliseconds between the pair (waits for the end event; call after a synchronize).
    pub fn elapsed_ms(&self) -> DResult<f32> {
        self.start
            .elapsed_ms(&self.end)
            .map_err(|e| format!("node time (cuEventElapsedTime): {e:?}"))
    }
}

/// Pairs recorded since the last synchronize.
#[derive(Default)]
pub(crate) struct NodeTimer {
    pending: Vec<Span>,
}

impl NodeTimer {
    /// A timing event recorded on `g`'s stream now.
    pub fn event(g: &Gpu) -> DResult<CudaEvent> {
        g.ctx
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .and_then(|e| e.record(&g.stream).map(|_| e))
            .map_err(|e| format!("timing event: {e:?}"))
    }

    pub fn push(
        &mut self,
        key: Option<String>,
        node: Option<NodeId>,
        start: CudaEvent,
        end: CudaEvent,
    ) {
        if key.is_some() || node.is_some() {
            self.pending.push(Span {
                key,
                node,
                start,
                end,
            });
        }
    }

    /// The pairs recorded since the last take, in execution order.
    pub fn take(&mut self) -> Vec<Span> {
        std::mem::take(&mut self.pending)
    }

    /// Forgets the nodes of pairs not yet read (a forward that never reached its
    /// synchronize: its times belong to no trace step); the profile keeps its share.
    pub fn forget_nodes(&mut self) {
        self.pending.retain_mut(|s| {
            s.node = None;
            s.key.is_some()
        });
    }
}

/// Nanoseconds of `ms` milliseconds (an event pair's f32 reading).
pub(crate) fn ns_of(ms: f32) -> u64 {
    (ms as f64 * 1e6).round().max(0.0) as u64
}
