//! What the CUDA backend's public functions refuse with, named by what failed. Inside the
//! crate the driver, NVRTC and cuBLASLt messages travel as text (`device::DResult`); they
//! become [`CudaError::Device`] where they leave it.

use minfer_graph::Refused;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CudaError {
    /// This build has no CUDA backend (the cargo feature `cuda` is off).
    #[error("this build has no CUDA backend (cargo feature `cuda`)")]
    NotBuilt,
    /// The driver, a device, NVRTC or cuBLASLt failed, in their words.
    #[error("{0}")]
    Device(String),
    /// A `MINFER_CUDA_*` value that names no choice of its knob.
    #[error(transparent)]
    Refused(#[from] Refused),
}

impl From<String> for CudaError {
    fn from(why: String) -> CudaError {
        CudaError::Device(why)
    }
}
