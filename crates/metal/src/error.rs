//! The one error type of the device layer: every variant carries the facts a reader needs.

/// Errors from a Metal device, a launch fn, or a kernel gate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("no kernel named `{name}` in the {device} library")]
    UnknownKernel { name: String, device: String },
    #[error("kernel `{kernel}` refused: {reason}")]
    Dispatch { kernel: String, reason: String },
    #[error("{what}: requested {requested}, device limit {limit}")]
    Limit {
        what: &'static str,
        requested: u64,
        limit: u64,
    },
    #[error("submit failed ({reason}); recent dispatches (oldest first): [{}]", labels.join(", "))]
    Submit { reason: String, labels: Vec<String> },
    #[error("buffer access out of range: offset {offset} + len {len} > buffer size {size}")]
    OutOfRange { offset: u64, len: u64, size: u64 },
    #[error(
        "host region at {addr:#x} is not aligned to the {page} byte page (zero-copy wrap needs it)"
    )]
    Unaligned { addr: usize, page: usize },
    #[error("shape error in {op}: {reason}")]
    Shape { op: &'static str, reason: String },
    #[error("{op}: no Metal kernel for weight type {ty}")]
    UnsupportedType { op: &'static str, ty: String },
    #[error("device unavailable: {0}")]
    Unavailable(String),
    #[error(
        "device memory budget exceeded by the {what}: {asked_mib:.2} MiB more asked, {room_mib:.2} MiB left of the budget"
    )]
    OverBudget {
        what: &'static str,
        asked_mib: f64,
        room_mib: f64,
    },
}

pub type Result<T> = std::result::Result<T, Error>;
