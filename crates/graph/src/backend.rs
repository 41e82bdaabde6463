//! The backend contract. CPU, CUDA and Metal implement it unchanged; the graph crate only
//! sees ids, buffers and nodes.

use crate::error::Result;
use crate::ir::{DType, Node, Op};
use minfer_gguf::GgmlType;
use std::fmt;

/// A fixed, append-only backend id (written into session files and graph dumps).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BackendId(pub u16);

impl fmt::Display for BackendId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// A buffer in one backend's pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BufId(pub u32);

/// Persistent K and V regions of one layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvPair {
    pub k: BufId,
    pub v: BufId,
}

/// Rewrites a backend may run as one kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FusedOp {
    SwiGLU,
}

/// A weight's bytes as stored in the model file (zero-copy from the mmap).
#[derive(Clone, Copy, Debug)]
pub struct WeightRef<'a> {
    pub ty: GgmlType,
    /// GGUF dims, innermost first.
    pub ne0: usize,
    pub ne1: usize,
    pub bytes: &'a [u8],
}

/// Where backends find weights by name.
pub trait WeightSource: Sync {
    fn weight(&self, name: &str) -> Option<WeightRef<'_>>;
}

/// The buffers one node execution reads and writes.
pub struct ExecArgs<'a> {
    /// One buffer per `node.src`, on this backend (staged if produced elsewhere); `None` for
    /// srcs that only order execution (KV stores).
    pub srcs: &'a [Option<BufId>],
    /// The output buffer (`None` for nodes that write a persistent region).
    pub out: Option<BufId>,
    /// The layer's K/V regions for KV store and attention nodes.
    pub kv: Option<KvPair>,
    pub weights: &'a dyn WeightSource,
}

pub trait Backend: Send {
    fn id(&self) -> BackendId;
    fn name(&self) -> &str;
    /// Assignment priority: higher wins.
    fn priority(&self) -> u32;
    /// Whether this backend can run `op` producing `dtype` (weights resolved through `weights`,
    /// so a backend may refuse a weight type).
    fn supports_op(&self, op: &Op, dtype: DType, weights: &dyn WeightSource) -> bool;
    /// Why `supports_op` refuses `op`, when the backend can say more than its name (shown in
    /// the assignment error).
    fn refusal(&self, _op: &Op, _weights: &dyn WeightSource) -> Option<String> {
        None
    }
    fn supports_fused(&self, op: FusedOp) -> bool;
    /// A zeroed buffer of `bytes` bytes.
    fn alloc(&mut self, bytes: usize) -> Result<BufId>;
    fn free(&mut self, buf: BufId);
    fn write(&mut self, buf: BufId, offset: usize, data: &[u8]) -> Result<()>;
    fn read(&mut self, buf: BufId, offset: usize, out: &mut [u8]) -> Result<()>;
    fn execute_node(&mut self, node: &Node, args: &ExecArgs) -> Result<()>;
    /// Completes all work submitted so far; called at every split boundary and at the end.
    fn synchronize(&mut self) -> Result<()>;
}
