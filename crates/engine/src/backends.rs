//! The backend table of this build: fixed ids (cpu 0, metal 1, cuda 2, metal-emu 3; written
//! into session files and graph dumps), whether each is compiled in, whether this machine can
//! run it, and whether it takes part unless named (the emulator does not).

use minfer_cpu::CpuBackend;
use minfer_graph::{Backend, BackendEntry, BackendId};

pub use minfer_cpu::CPU_ID;
pub const METAL_ID: BackendId = BackendId(1);
pub const CUDA_ID: BackendId = BackendId(2);
/// The Metal executor on the MSL emulator: the same code as `metal`, run on the CPU, for
/// proof and debugging on machines without a Mac (slow).
pub const METAL_EMU_ID: BackendId = BackendId(3);

/// Settings of the CPU backend (`--numerics`), handed to it at instantiation; the engine
/// itself never reads them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuSettings {
    pub numerics: minfer_cpu::Numerics,
}

pub fn table() -> Vec<BackendEntry> {
    vec![
        BackendEntry {
            id: CPU_ID,
            name: "cpu",
            compiled: Ok(()),
            available: Ok(()),
            by_default: true,
        },
        BackendEntry {
            id: METAL_ID,
            name: "metal",
            compiled: if cfg!(all(feature = "metal", target_os = "macos")) {
                Ok(())
            } else if cfg!(target_os = "macos") {
                Err("this build has no Metal backend (cargo feature `metal`)".into())
            } else {
                Err(
                    "Metal needs macOS (on Linux, `metal-emu` runs the same executor on the \
                     MSL emulator)"
                        .into(),
                )
            },
            available: metal_available(),
            by_default: true,
        },
        BackendEntry {
            id: CUDA_ID,
            name: "cuda",
            compiled: if cfg!(feature = "cuda") {
                Ok(())
            } else {
                Err("this build has no CUDA backend (cargo feature `cuda`)".into())
            },
            available: cuda_available(),
            by_default: true,
        },
        BackendEntry {
            id: METAL_EMU_ID,
            name: "metal-emu",
            compiled: if cfg!(feature = "metal-emu") {
                Ok(())
            } else {
                Err("this build has no Metal emulator (cargo feature `metal-emu`)".into())
            },
            available: Ok(()),
            by_default: false,
        },
    ]
}

/// The name of a backend id, for dumps and messages.
pub fn name_of(id: BackendId) -> String {
    table()
        .into_iter()
        .find(|e| e.id == id)
        .map(|e| e.name.to_string())
        .unwrap_or_else(|| format!("backend{}", id.0))
}

/// Resolves `--backend` names (see [`minfer_graph::resolve_backends`]); the CPU always takes part.
pub fn resolve(names: &[String]) -> minfer_graph::Result<Vec<BackendId>> {
    minfer_graph::resolve_backends(names, &table(), CPU_ID)
}

/// Instantiates resolved backends.
pub fn instantiate(
    ids: &[BackendId],
    threads: usize,
    cpu: CpuSettings,
) -> minfer_graph::Result<Vec<Box<dyn Backend>>> {
    ids.iter()
        .map(|&id| match id {
            CPU_ID => {
                Ok(Box::new(CpuBackend::with_numerics(threads, cpu.numerics)) as Box<dyn Backend>)
            }
            #[cfg(all(feature = "metal", target_os = "macos"))]
            METAL_ID => {
                let dev = minfer_metal_objc::SharedDevice::get().map_err(|e| {
                    minfer_graph::Error::Unavailable {
                        name: "metal".into(),
                        why: e.to_string(),
                    }
                })?;
                Ok(
                    Box::new(minfer_metal::MetalBackend::new(dev, METAL_ID, "metal"))
                        as Box<dyn Backend>,
                )
            }
            #[cfg(feature = "metal-emu")]
            METAL_EMU_ID => Ok(Box::new(minfer_metal::MetalBackend::new(
                // One forward is one submit; emulated, a big model's takes minutes.
                minfer_msl_emu::EmuDevice::new(minfer_msl_emu::Schedule::Forward)
                    .with_submit_timeout(std::time::Duration::from_secs(900)),
                METAL_EMU_ID,
                "metal-emu",
            )) as Box<dyn Backend>),
            #[cfg(feature = "cuda")]
            CUDA_ID => minfer_cuda::CudaBackend::new(CUDA_ID, "cuda")
                .map(|b| Box::new(b) as Box<dyn Backend>)
                .map_err(|why| minfer_graph::Error::Unavailable {
                    name: "cuda".into(),
                    why,
                }),
            other => Err(minfer_graph::Error::NotCompiled {
                name: name_of(other),
                why: "no backend implementation in this build".into(),
            }),
        })
        .collect()
}

/// Whether the CUDA driver loads and a device exists (builds with the `cuda` feature).
fn cuda_available() -> Result<(), String> {
    #[cfg(feature = "cuda")]
    {
        minfer_cuda::available()
    }
    #[cfg(not(feature = "cuda"))]
    {
        Err("not compiled".into())
    }
}

/// Whether this machine has a Metal device (macOS builds with the `metal` feature).
fn metal_available() -> Result<(), String> {
    #[cfg(all(feature = "metal", target_os = "macos"))]
    {
        if std::env::var_os("MINFER_DISABLE_MPS").is_some() {
            return Err("MINFER_DISABLE_MPS is set".into());
        }
        minfer_metal_objc::SharedDevice::get()
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
    #[cfg(not(all(feature = "metal", target_os = "macos")))]
    {
        Err("not compiled".into())
    }
}

/// Whether a backend is a device (not the CPU): the engine picks the KV element type for
/// device engines by model size (see `EngineConfig::cache_type_auto`).
pub fn is_device(id: BackendId) -> bool {
    id != CPU_ID
}
