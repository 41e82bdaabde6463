//! The compute graph: IR, backend assignment, fusion, allocation, scheduling and the graph
//! cache. Device-neutral: backends plug in through [`Backend`]; this crate names none.
//!
//! At load, [`place_weights`] asks every backend which of the model's weights it can hold
//! (all or nothing per backend, so a model is never split by accident) and hands each backend
//! the weights placed on it, once.
//!
//! Pipeline, per [`GraphParams`] (a miss in the [`GraphCache`]):
//! 1. a model builds a [`Graph`] (pure function of its params: positions, KV cells and
//!    attention spans are input data, never topology);
//! 2. [`assign_backends`] gives every node the highest-priority participating backend that
//!    holds the node's weights and whose `supports_op` accepts it, or refuses the graph
//!    naming the node;
//! 3. [`fuse`] rewrites `Mul(Silu(a), b)` into `SwiGLU(a, b)` where the backend supports it;
//! 4. [`Allocator::plan`] assigns buffers (liveness in build order, sole-consumer in-place
//!    aliasing, size classes, per-backend budgets);
//! 5. [`execute`] runs contiguous same-backend splits whole (`execute_split`), moving
//!    values across backends in two phases: reads begun when the producing split has been
//!    submitted, finished just before the consuming split.
//!
//! A hit in the cache skips 1–4: decode steps refill the inputs and run.

pub mod alloc;
pub mod assign;
pub mod backend;
pub mod cache;
pub mod capture;
pub mod cells;
pub mod comm;
pub mod dump;
pub mod error;
pub mod fusion;
pub mod ir;
pub mod placement;
pub mod registry;
pub mod sched;
pub mod settings;
pub mod viz;

pub use alloc::{size_class, Allocator, KvRegion, Plan};
pub use assign::assign_backends;
pub use backend::{
    copy_cells_through_host, move_plan, support, Backend, BackendId, BufId, Capabilities, ExecArgs,
    Executor, FusedOp, Identity, KvLayout, KvPair, Memory, PlanId, ReadTicket, Refusal, RopeSpec,
    SplitKey, Support, WeightId, WeightRef, WeightSource,
};
/// The backend contract's traits in one import, for code that calls a concrete backend's
/// methods (a `dyn Backend` needs none: its layers' methods are its own).
pub mod contract {
    pub use crate::backend::{Backend, Capabilities, Executor, Identity, Memory};
}
pub use cache::GraphCache;
pub use capture::CaptureLog;
pub use cells::{cell_ops_graph, CellWork};
pub use comm::{CommError, CommResult, Communicator, LoopbackComm, LoopbackGroup};
pub use error::{Error, Result};
pub use fusion::{fuse, prepare_concats, FusionConfig, MAX_FUSED_FFN};
pub use ir::{
    DType, Graph, GraphBuilder, GraphParams, InputKind, InputNorm, KvKind, Node, NodeId, Op,
    QkNormSpec, QkvFused, RopeStyle, RowClass, RowClasses, WindowLayout, Windows, KV_MAP_RUNS,
};
pub use placement::{first_refusal, place_by_layer, place_weights, LayerPlan, Placement};
pub use registry::{resolve_backends, BackendEntry};
pub use sched::{execute, fill_input, read_output};
pub use settings::Refused;
