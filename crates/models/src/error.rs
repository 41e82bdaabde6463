#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Unsupported architecture: '{0}' (minfer runs qwen2, qwen3 and llama)")]
    UnsupportedArch(String),
    #[error("missing GGUF key {0}")]
    MissingKey(String),
    #[error("GGUF key {0} {1}")]
    BadHParam(String, String),
    #[error(transparent)]
    Gguf(#[from] minfer_gguf::Error),
}

pub type Result<T> = std::result::Result<T, Error>;
