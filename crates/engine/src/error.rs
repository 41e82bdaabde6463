//! The engine's errors: one [`Error`] for every call, with the KV operations' and session
//! files' own kinds ([`KvError`], [`SessionError`]) inside it. At the bottom of the crate, so
//! the owners (the model runner, the KV cache) and the engine that composes them name the
//! same type without importing each other.

use minfer_gguf::GgmlType;
use std::ops::Range;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Gguf(#[from] minfer_gguf::Error),
    #[error(transparent)]
    Model(#[from] minfer_models::Error),
    #[error(transparent)]
    Graph(#[from] minfer_graph::Error),
    #[error("context overflow: {n_tokens} tokens at position {pos0} exceed n_ctx {n_ctx}")]
    ContextOverflow {
        pos0: usize,
        n_tokens: usize,
        n_ctx: usize,
    },
    #[error("decode at position {pos0}, but the sequence holds only {n_past} tokens (positions must be contiguous)")]
    PositionGap { pos0: usize, n_past: usize },
    #[error("token id {id} at index {index} is outside the vocabulary of {vocab}")]
    TokenOutOfRange { id: u32, index: usize, vocab: usize },
    #[error("bad decode request: {0}")]
    BadRequest(String),
    /// A self-drafting engine that cannot be built as asked (`Engine::self_draft`).
    #[error("{0}")]
    SelfDraft(String),
    #[error("batch entry {entry}: {source}")]
    Entry {
        entry: usize,
        #[source]
        source: Box<Error>,
    },
    #[error("the batch needs {needed} new KV cells, the arena has {free} free of {n_cells}")]
    ArenaFull {
        needed: usize,
        free: usize,
        n_cells: usize,
    },
    #[error("cache type {0}: {1}")]
    CacheType(String, String),
    #[error(transparent)]
    Cells(#[from] crate::kvcells::CellError),
    #[error(transparent)]
    Kv(#[from] KvError),
    #[error(transparent)]
    Session(#[from] SessionError),
    /// A fault a test armed ([`crate::faults`]).
    #[error("injected fault: {0}")]
    Injected(String),
    /// `--gpu-layers auto` without `--gpu-mem` and a device that could not say how much
    /// memory is free: never read as a zero budget (issue 32).
    #[error(
        "offload: cannot size the plan: {backend}'s free-memory query failed: {why}; the \
         model's blocks would charge {weights_mib:.1} MiB of weights ({need_mib:.1} MiB with \
         KV and the reserve); give --gpu-mem SIZE or --gpu-layers N"
    )]
    MemoryQuery {
        backend: String,
        why: String,
        weights_mib: f64,
        need_mib: f64,
    },
    /// The KV budget (`--kv-mem`, or the device's free memory after the weights) holds less
    /// than the smallest context asked for ([`crate::kvsize`]).
    #[error("kv: {0}")]
    KvMemory(String),
}

impl Error {
    /// The error itself when it is wrapped in a batch entry's [`Error::Entry`].
    pub fn inner(&self) -> &Error {
        match self {
            Error::Entry { source, .. } => source.inner(),
            e => e,
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;

#[derive(Debug, thiserror::Error)]
pub enum KvError {
    #[error("a {ty} KV cache cannot shift positions (re-quantizing rotated K rows compounds rounding); only f32 and f16 can")]
    CannotShift { ty: GgmlType },
    #[error("{op}: positions {start}..{end} are not within the {n_past} positions held")]
    NotHeld {
        op: &'static str,
        start: usize,
        end: usize,
        n_past: usize,
    },
    #[error("kv_retain: ranges must be ascending and disjoint; {prev:?} is followed by {next:?}")]
    Unordered {
        prev: Range<usize>,
        next: Range<usize>,
    },
    #[error("layer {layer}: {problem}")]
    Region { layer: usize, problem: String },
}

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("session file {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("not a minfer session file (magic {found:02x?}, expected \"MINFSESS\")")]
    Magic { found: Vec<u8> },
    #[error("session format version {found}, this build reads version {reads}{hint}", hint = if *found == 1 { " (version 1 files hold one sequence in the old cell layout; save the session again)" } else { "" })]
    Version { found: u32, reads: u32 },
    #[error("session file truncated: {len} bytes, the header says {expected}")]
    Truncated { len: usize, expected: usize },
    #[error("session file has {extra} bytes after its checksum (the header says {expected} bytes in all)")]
    Trailing { extra: usize, expected: usize },
    #[error("session checksum mismatch: stored {stored:#018x}, computed {computed:#018x} (the file is corrupt)")]
    Checksum { stored: u64, computed: u64 },
    #[error("session field {field} is {found}, expected {expected}")]
    Field {
        field: &'static str,
        found: u64,
        expected: u64,
    },
    #[error("session is for another model (identity {saved:#018x}, this model is {this:#018x})")]
    OtherModel { saved: u64, this: u64 },
    #[error("session was saved with n_ctx {saved}, this engine has n_ctx {this}")]
    NCtx { saved: u32, this: usize },
    #[error("session KV type is {saved}, this engine's is {this}")]
    KvType { saved: String, this: GgmlType },
    #[error("session layer {layer} KV was saved on backend {saved} ({saved_name}), this engine keeps it on {this} ({this_name})")]
    Backend {
        layer: usize,
        saved: u16,
        saved_name: String,
        this: u16,
        this_name: String,
    },
    #[error("session holds {n_tokens} tokens, more than n_ctx {n_ctx}")]
    TooManyTokens { n_tokens: usize, n_ctx: usize },
    #[error("session token {index} is id {id}, outside the vocabulary of {vocab}")]
    TokenOutOfRange { index: usize, id: u32, vocab: usize },
    #[error("session sequence {seq} appears twice")]
    DuplicateSeq { seq: u32 },
    #[error("session has no sequence {seq}")]
    NoSuchSeq { seq: u32 },
    #[error("the session's sequences need {needed} KV cells, the arena has {free} free")]
    NoRoom { needed: usize, free: usize },
    #[error("cannot save a session: {0}")]
    Save(String),
}
