//! Loading the model under test for one thread count.

use super::report::{model_facts, ModelFacts};
use super::{Args, Target};
use anyhow::bail;
use std::path::Path;

pub struct Loaded {
    pub target: Box<dyn Target>,
    pub facts: ModelFacts,
    /// Backend names as the rows show them.
    pub backend: String,
    pub threads: usize,
}

/// `0` means every core the process may use.
pub fn resolve_threads(t: usize) -> usize {
    if t > 0 {
        t
    } else {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    }
}

pub fn load(path: &Path, args: &Args, threads: usize, n_ctx: usize) -> anyhow::Result<Loaded> {
    let model = minfer_gguf::GgufModel::open(path)?;
    let _facts = model_facts(&model, path);
    let _ = (args, threads, n_ctx);
    bail!("this build has no engine yet (minfer_engine::Engine is not merged)")
}
