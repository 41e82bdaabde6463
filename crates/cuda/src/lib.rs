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
mod cells;
#[cfg(feature = "cuda")]
pub mod compile;
#[cfg(feature = "cuda")]
pub mod device;
mod error;
#[cfg(feature = "cuda")]
mod exec;
#[cfg(feature = "cuda")]
mod locked;
#[cfg(feature = "cuda")]
pub mod lt;
#[cfg(feature = "cuda")]
mod matvec;
#[cfg(feature = "cuda")]
mod mmq;
#[cfg(feature = "cuda")]
pub mod nccl;
#[cfg(feature = "cuda")]
mod prompt;
#[cfg(feature = "cuda")]
mod refusal;
#[cfg(feature = "cuda")]
mod replay;
#[cfg(feature = "cuda")]
mod scratch;
#[cfg(feature = "cuda")]
mod settings;
#[cfg(feature = "cuda")]
mod stream;
#[cfg(feature = "cuda")]
mod timing;

#[cfg(feature = "cuda")]
pub use backend::CudaBackend;
#[cfg(feature = "cuda")]
pub use device::launches;
pub use error::CudaError;
#[cfg(feature = "cuda")]
pub use prompt::streamed_matmuls;
#[cfg(feature = "cuda")]
pub use replay::{graph_captures, graph_replays};
#[cfg(feature = "cuda")]
pub use settings::CudaSettings;

#[cfg(feature = "cuda")]
use minfer_graph::{Backend, Error as GraphError};
use minfer_graph::{BackendEntry, BackendId};

/// CUDA's fixed backend id (written into session files and graph dumps).
pub const CUDA_ID: BackendId = BackendId(2);

/// Why a build without the cargo feature has no CUDA backend.
const NOT_COMPILED: &str = "this build has no CUDA backend (cargo feature `cuda`)";

/// CUDA's row of the backend table, whether or not this build includes it (the crate
/// without its feature is the shell that says so).
pub fn entry() -> BackendEntry {
    BackendEntry {
        id: CUDA_ID,
        name: "cuda",
        compiled: if cfg!(feature = "cuda") {
            Ok(())
        } else {
            Err(NOT_COMPILED.into())
        },
        available: available().map_err(|e| e.to_string()),
        by_default: true,
    }
}

/// A CUDA backend under `id` and `name` with its settings (`MINFER_CUDA_*`, read once by the
/// engine's settings): a refused value or an unavailable driver or device as the registry's
/// typed refusal naming it. Only in a build with the feature (the engine's table makes the
/// "not compiled" refusal itself otherwise).
#[cfg(feature = "cuda")]
pub fn instantiate(
    id: BackendId,
    name: &str,
    settings: &Result<CudaSettings, minfer_graph::Refused>,
) -> Result<Box<dyn Backend>, GraphError> {
    let unavailable = |why: String| GraphError::Unavailable {
        name: name.into(),
        why,
    };
    // A refused `MINFER_CUDA_*` value fails here, where the backend is made.
    let s = settings.as_ref().map_err(|e| unavailable(e.to_string()))?;
    CudaBackend::new(id, name, s)
        .map(|b| Box::new(b) as Box<dyn Backend>)
        .map_err(|e| unavailable(e.to_string()))
}

/// How many CUDA devices this machine has; a build without the feature says so.
pub fn device_count() -> Result<usize, CudaError> {
    #[cfg(feature = "cuda")]
    {
        Ok(device::device_count()?)
    }
    #[cfg(not(feature = "cuda"))]
    {
        Err(CudaError::NotBuilt)
    }
}

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
