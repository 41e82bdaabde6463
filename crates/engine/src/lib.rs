//! The engine: loading a model onto backends, KV cells, batched forwards, KV operations on
//! sequences, session files and traces. Generation (samplers, constraints, stops, the loop,
//! chat) is `minfer-generate`'s, fetching models `minfer-hub`'s, converting checkpoints
//! `minfer-convert`'s, perplexity `minfer-eval`'s.
//!
//! [`Engine`] (in [`engine`]) is the model side: see its module docs for the API.

pub mod backends;
mod batch;
mod config;
pub mod engine;
mod error;
pub mod faults;
pub mod kv;
mod kvcache;
pub mod kvcells;
pub mod kvsize;
pub mod model;
pub mod offload;
mod runner;
pub mod session;
pub mod settings;
pub mod trace;
pub mod trace_diff;
mod trace_run;
mod weights;

pub use config::{parse_size, GpuLayers};
pub use engine::{auto_cache_type, parse_cache_type, Engine, EngineConfig, Error, Result};
pub use faults::InjectedFault;
pub use kvcache::KvBudget;
pub use kvcells::{CellError, KvCells, Placement as KvPlacement, Run, SeqId};
pub use kvsize::{KvPlan, KvSize};
pub use minfer_graph::{FusionConfig, RowClass, KV_MAP_RUNS};
pub use model::{bucket, BatchEntry, BatchLogits, LogitsModel, TokenBytes};
pub use settings::Settings;
