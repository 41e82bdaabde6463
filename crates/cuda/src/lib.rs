//! The CUDA backend (issue 15, first slice): the graph executor on an NVIDIA GPU through
//! `cudarc` with dynamic loading, kernels in CUDA C (`kernels/`) compiled at run time by
//! NVRTC for the device's compute capability. Built only with the cargo feature `cuda`;
//! without it this crate is empty apart from [`available`], so machines without CUDA build
//! and lint the workspace unchanged.

#[cfg(feature = "cuda")]
mod attn;
#[cfg(feature = "cuda")]
mod backend;
#[cfg(feature = "cuda")]
pub mod device;
mod error;
#[cfg(feature = "cuda")]
mod exec;
#[cfg(feature = "cuda")]
pub mod lt;
#[cfg(feature = "cuda")]
mod mmq;
#[cfg(feature = "cuda")]
mod prompt;
#[cfg(feature = "cuda")]
mod replay;
#[cfg(feature = "cuda")]
mod scratch;
#[cfg(feature = "cuda")]
mod settings;

#[cfg(feature = "cuda")]
pub use backend::CudaBackend;
#[cfg(feature = "cuda")]
pub use device::launches;
pub use error::CudaError;
#[cfg(feature = "cuda")]
pub use replay::{graph_captures, graph_replays};
#[cfg(feature = "cuda")]
pub use settings::CudaSettings;

/// Whether this machine can run the CUDA backend: the driver loads and a device exists.
pub fn available() -> Result<(), CudaError> {
    #[cfg(feature = "cuda")]
    {
        Ok(device::available()?)
    }
    #[cfg(not(feature = "cuda"))]
    {
        Err(CudaError::NotBuilt)
    }
}
