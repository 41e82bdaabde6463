//! The engine: fetching models, loading a model onto backends, KV cells, the sampler chain
//! and the generation loop.
//!
//! [`Engine`] (in [`engine`]) is the model side: see its module docs for the API.

pub mod backends;
pub mod engine;
pub mod fetch;
pub mod generate;
pub mod sampler;
pub mod stop;

pub use engine::{parse_cache_type, Engine, EngineConfig, Error, Result};
