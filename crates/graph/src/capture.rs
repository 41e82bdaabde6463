//! Node-output capture for traces (`MINFER_TRACE`, facts §1.15; seed §4.1, §4.8).
//!
//! While a backend is armed ([`crate::Executor::capture`]), it keeps a copy of the output of
//! every node it executes whose output is f32 ([`captured`]): `n_elems` values, in the
//! node's row-major layout, taken when the node has run and before any later node may reuse
//! its buffer (intermediate buffers are recycled by liveness inside a plan). KV stores write
//! persistent regions and have no output (dtype `None`), so they are never captured; graph
//! inputs are host-filled i32 and never executed, so they are not captured either (the host
//! knows them). [`crate::Executor::take_captures`] hands the copies over, oldest first, once
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
    /// Per executed node, its time in nanoseconds (a host backend's kernel call).
    times: Vec<(NodeId, u64)>,
}

impl CaptureLog {
    /// Arms or disarms; disarming drops what was not taken.
    pub fn arm(&mut self, on: bool) {
        self.armed = on;
        if !on {
            self.got = Vec::new();
            self.times = Vec::new();
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

    /// Records how long `id` took (armed only).
    pub fn record_time(&mut self, id: NodeId, ns: u64) {
        if self.armed {
            self.times.push((id, ns));
        }
    }

    /// The times recorded since the last take, oldest first.
    pub fn take_times(&mut self) -> Vec<(NodeId, u64)> {
        std::mem::take(&mut self.times)
    }

    /// Everything recorded since the last take, oldest first.
    pub fn take(&mut self) -> Vec<(NodeId, Vec<f32>)> {
        std::mem::take(&mut self.got)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{GraphBuilder, InputKind, KvKind};
    use minfer_gguf::GgmlType;

    #[test]
    fn only_executed_f32_outputs_are_kept_and_only_while_armed() {
        let mut b = GraphBuilder::new();
        let ids = b.input(InputKind::TokenIds, [2, 1]);
        let cells = b.input(InputKind::KvCells, [2, 1]);
        let x = b.op("x", Op::Add, &[ids, ids], [3, 2]);
        let kind = KvKind::K;
        let store = Op::KvStore {
            layer: 0,
            kind,
            cache_type: GgmlType::F32,
        };
        let s = b.op("store", store, &[x, cells], [3, 2]);
        let g = b.finish(x);
        assert!(captured(g.node(x)));
        assert!(!captured(g.node(s)), "a KV store has no output");
        assert!(!captured(g.node(ids)), "inputs are host data");
        let mut log = CaptureLog::default();
        let vals = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0];
        log.record(g.node(x), &vals);
        assert!(log.take().is_empty(), "disarmed: nothing");
        log.arm(true);
        for n in &g.nodes {
            log.record(n, &vals);
        }
        // The node's n_elems values, not the whole (size-class) buffer.
        assert_eq!(log.take(), vec![(x, vals[..6].to_vec())]);
        assert!(log.take().is_empty(), "a take empties");
        log.record_time(x, 5);
        assert_eq!(log.take_times(), vec![(x, 5)]);
        log.record(g.node(x), &vals);
        log.record_time(x, 7);
        log.arm(false);
        assert!(log.take().is_empty(), "disarming drops what was not taken");
        assert!(log.take_times().is_empty(), "and the times");
        log.record_time(x, 9);
        assert!(log.take_times().is_empty(), "disarmed: no time kept");
    }

    /// A backend that implements nothing of the capture contract.
    struct Plain;
    impl crate::Identity for Plain {
        fn id(&self) -> crate::BackendId {
            crate::BackendId(9)
        }

        fn name(&self) -> &str {
            "plain"
        }
    }

    impl crate::Memory for Plain {
        fn alloc(&mut self, _: usize) -> crate::Result<crate::BufId> {
            Ok(crate::BufId(0))
        }

        fn free(&mut self, _: crate::BufId) {}

        fn write(&mut self, _: crate::BufId, _: usize, _: &[u8]) -> crate::Result<()> {
            Ok(())
        }

        fn read(&mut self, _: crate::BufId, _: usize, _: &mut [u8]) -> crate::Result<()> {
            Ok(())
        }
    }

    impl crate::Capabilities for Plain {
        fn supports_op(&self, _: &Op, _: DType, _: &dyn crate::WeightSource) -> crate::Support {
            Ok(())
        }

        fn supports_fused(&self, _: crate::FusedOp) -> crate::Support {
            Err("no fusions".into())
        }
    }

    impl crate::Executor for Plain {
        fn execute_node(&mut self, _: &Node, _: &crate::ExecArgs) -> crate::Result<()> {
            Ok(())
        }

        fn synchronize(&mut self) -> crate::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_backend_without_capture_refuses_to_arm() {
        use crate::Executor;
        let mut p = Plain;
        let e = p.capture(true).unwrap_err().to_string();
        assert!(e.contains("plain") && e.contains("cannot capture"), "{e}");
        p.capture(false).unwrap();
        assert!(p.take_captures().unwrap().is_empty());
    }
}
