//! CPU kernels: plain functions over slices (no graph types), so each is testable alone.

pub mod attn;
pub mod elementwise;
pub mod kv_cells;
pub mod matmul;
pub mod norm;
pub mod rope;
pub mod rows;

/// A kernel failure, turned into a graph error naming the node by the backend.
#[derive(Debug)]
pub struct KernelError(pub String);

impl From<minfer_gguf::Error> for KernelError {
    fn from(e: minfer_gguf::Error) -> Self {
        KernelError(e.to_string())
    }
}

pub type KResult<T> = std::result::Result<T, KernelError>;

/// An i32 stored in an f32 buffer slot (graph integer inputs).
#[inline]
pub fn as_i32(v: f32) -> i32 {
    v.to_bits() as i32
}
