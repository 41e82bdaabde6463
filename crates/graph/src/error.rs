use crate::backend::BackendId;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("no participating backend supports node {node} ({op}); participating: {backends}")]
    Unsupported {
        node: String,
        op: String,
        backends: String,
    },
    #[error("memory budget of backend {backend} exceeded: request {request_mib:.2} MiB (size class) + in use {in_use_mib:.2} MiB (weights included) > budget {budget_mib:.2} MiB")]
    OverBudget {
        backend: BackendId,
        request_mib: f64,
        in_use_mib: f64,
        budget_mib: f64,
    },
    #[error("KV region of layer {layer}: {problem}")]
    Kv { layer: usize, problem: String },
    #[error("node {node}: {problem}")]
    Exec { node: String, problem: String },
    #[error("backend {backend}: {problem}")]
    Backend { backend: String, problem: String },
    #[error("input {input}: {problem}")]
    Input { input: String, problem: String },
    #[error("unknown backend name {name:?} (known: {known})")]
    UnknownBackend { name: String, known: String },
    #[error("backend {name} is not compiled into this build ({why})")]
    NotCompiled { name: String, why: String },
    #[error("backend {name} is compiled in but unavailable on this machine: {why}")]
    Unavailable { name: String, why: String },
    #[error("graph: {0}")]
    Graph(String),
}

pub type Result<T> = std::result::Result<T, Error>;
