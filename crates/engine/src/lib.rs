//! The engine: fetching models, loading a model onto backends, KV cells, the sampler chain
//! and the generation loop.

pub mod fetch;
pub mod generate;
pub mod sampler;
pub mod stop;
