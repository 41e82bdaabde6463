//! Node-output capture for traces (`MINFER_TRACE`, facts §1.15; seed §4.1, §4.8).
//!
//! While a backend is armed ([`crate::Backend::capture`]), it keeps a copy of the output of
//! every node it executes whose output is f32 ([`captured`]): `n_elems` values, in the
//! node's row-major layout, taken when the node has run and before any later node may reuse
//! its buffer (intermediate buffers are recycled by liveness inside a plan). KV stores write
//! persistent regions and have no output (dtype `None`), so they are never captured; graph
//! inputs are host-filled i32 and never executed, so they are not captured either (the host
//! knows them). [`crate::Backend::take_captures`] hands the copies over, oldest first, once
//! the work that produced them has completed.

use crate::ir::{DType, Node, NodeId, Op};

/// Whether a node's output is captured: an f32 output of a node that is not a KV store.
pub fn captured(node: &Node) -> bool {
    node.dtype == DType::F32 && !matches!(node.op, Op::KvStore { .. } | Op::Input(_))
}

/// A host backend's capture state: an armed flag and the copies taken since the last take.
/// Disarmed it holds nothing and [`CaptureLog::armed`] is the only cost per node.
#[derive(Debug, Default)]
pub struct CaptureLog {
    armed: bool,
    got: Vec<(NodeId, Vec<f32>)>,
}

impl CaptureLog {
    /// Arms or disarms; disarming drops what was not taken.
    pub fn arm(&mut self, on: bool) {
        self.armed = on;
        if !on {
            self.got = Vec::new();
        }
    }

    pub fn armed(&self) -> bool {
        self.armed
    }

    /// Records `node`'s output (its first `n_elems` values) if it is [`captured`].
    pub fn record(&mut self, node: &Node, out: &[f32]) {
        if self.armed && captured(node) {
            let n = node.n_elems().min(out.len());
            self.got.push((node.id, out[..n].to_vec()));
        }
    }

    /// Records values already copied (a device's staging read back).
    pub fn push(&mut self, id: NodeId, values: Vec<f32>) {
        if self.armed {
            self.got.push((id, values));
        }
    }

    /// Everything recorded since the last take, oldest first.
    pub fn take(&mut self) -> Vec<(NodeId, Vec<f32>)> {
        std::mem::take(&mut self.got)
    }
}
