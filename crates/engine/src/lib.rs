//! The engine: loading a model onto backends, KV cells, the sampler chain and the
//! generation loop; fetching known models into the user cache.

pub mod fetch;
pub mod generate;
pub mod sampler;
pub mod stop;
