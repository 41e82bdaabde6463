#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Unsupported architecture: '{0}' (minfer runs qwen2, qwen3 and llama)")]
    UnsupportedArch(String),
    #[error("missing GGUF key {0}")]
    MissingKey(String),
    #[error("GGUF key {0} {1}")]
    BadHParam(String, String),
    #[error("tensor {name} is missing from the model")]
    MissingTensor { name: String },
    #[error("tensor {name} has shape {got:?}, expected {expected:?}")]
    WrongShape {
        name: String,
        expected: Vec<u64>,
        got: Vec<u64>,
    },
    #[error("tensor {name}: {problem}")]
    Unsupported { name: String, problem: String },
    #[error("reference forward: {0}")]
    Reference(String),
    #[error(transparent)]
    Gguf(#[from] minfer_gguf::Error),
}

pub type Result<T> = std::result::Result<T, Error>;
