//! The engine: loading a model onto backends, KV cells, the sampler chain and the generation
//! loop. Fetching models is `minfer-hub`'s, converting checkpoints `minfer-convert`'s, perplexity
//! `minfer-eval`'s.
//!
//! [`Engine`] (in [`engine`]) is the model side: see its module docs for the API.

pub mod backends;
pub mod batch;
pub mod chat;
pub mod constrain;
pub mod engine;
pub mod generate;
pub mod kv;
pub mod kvcells;
pub mod sampler;
pub mod session;
pub mod stop;
pub mod trace;
mod weights;

pub use batch::{bucket, BatchEntry, BatchLogits};
pub use engine::{auto_cache_type, parse_cache_type, Engine, EngineConfig, Error, Result};
pub use kvcells::{CellError, KvCells, Run, SeqId};
pub use minfer_graph::{FusionConfig, RowClass, KV_MAP_RUNS};
