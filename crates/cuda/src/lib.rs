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
pub use backend::CudaBackend;
#[cfg(feature = "cuda")]
pub use device::launches;
#[cfg(feature = "cuda")]
pub use replay::{graph_captures, graph_replays};

use minfer_graph::{Backend, BackendEntry, BackendId, Error as GraphError};

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
        available: available(),
        by_default: true,
    }
}

/// A CUDA backend under `id` and `name`: unavailable (the driver or device missing, named)
/// or not compiled in (this build without the feature) as the registry's typed refusals.
pub fn instantiate(id: BackendId, name: &str) -> Result<Box<dyn Backend>, GraphError> {
    #[cfg(feature = "cuda")]
    {
        CudaBackend::new(id, name)
            .map(|b| Box::new(b) as Box<dyn Backend>)
            .map_err(|why| GraphError::Unavailable {
                name: name.into(),
                why,
            })
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = id;
        Err(GraphError::NotCompiled {
            name: name.into(),
            why: NOT_COMPILED.into(),
        })
    }
}

/// Whether this machine can run the CUDA backend: the driver loads and a device exists.
pub fn available() -> Result<(), String> {
    #[cfg(feature = "cuda")]
    {
        device::available()
    }
    #[cfg(not(feature = "cuda"))]
    {
        Err(NOT_COMPILED.into())
    }
}
