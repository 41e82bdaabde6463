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
    #[error("synth spec: {0} {1}")]
    BadSpec(String, String),
    #[error("tensor {tensor}: row length {row_len} is not a whole number of {ty} blocks of {block}{}", match fallback {
        Some(f) => format!(", nor of the fallback type {f}"),
        None => "; give a fallback type (e.g. Q8_0) for such tensors".into(),
    })]
    RowNotWholeBlocks {
        tensor: String,
        row_len: u64,
        ty: String,
        block: u64,
        fallback: Option<String>,
    },
    #[error("tensor {tensor}: cannot synthesize weights of type {ty}")]
    UnsupportedWeightType { tensor: String, ty: String },
    #[error("tensor {tensor}: encoding as {ty}")]
    Encode {
        tensor: String,
        ty: String,
        #[source]
        source: Box<minfer_gguf::Error>,
    },
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Gguf(#[from] minfer_gguf::Error),
}

pub type Result<T> = std::result::Result<T, Error>;
