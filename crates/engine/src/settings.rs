//! Every knob of the engine and its backends (docs/SETTINGS.md), one field each, read once
//! per engine configuration by [`Settings::from_env`] (the CLI sets the flags' part, such as
//! `--numerics`, on top). The backends get their part by value when they are instantiated;
//! none of them reads the environment.

use std::path::PathBuf;

use minfer_graph::{FusionConfig, Refused};

pub use minfer_cpu::CpuSettings;

#[derive(Clone, Debug)]
pub struct Settings {
    /// The CPU backend's (`--numerics`, `MINFER_CPU_ISA`, `MINFER_DUMP_DIR`,
    /// `MINFER_TEST_PLANT_CPU`).
    pub cpu: CpuSettings,
    /// Which decode fusions a device backend gets (`MINFER_NO_FUSE_*`).
    pub fusion: FusionConfig,
    /// The CUDA backend's (`MINFER_CUDA_*`). A refused value is kept as the refusal: it
    /// fails the CUDA backend's instantiation, as it always has, and only when CUDA is used.
    #[cfg(feature = "cuda")]
    pub cuda: std::result::Result<minfer_cuda::CudaSettings, Refused>,
    /// The Metal executor's (`MINFER_WEIGHT_COPY`, `MINFER_OP_PROFILE`, `MINFER_TRACE` as a
    /// switch, `MINFER_NO_*_ATTN`), for `metal` and `metal-emu`.
    #[cfg(any(feature = "metal", feature = "metal-emu"))]
    pub metal: minfer_metal::MetalSettings,
    /// The MSL emulator's (`MINFER_EMU_THREADS`), for `metal-emu`.
    #[cfg(feature = "metal-emu")]
    pub emu: minfer_msl_emu::EmuSettings,
}

impl Settings {
    /// The knobs as this process's environment sets them (flags' fields at their defaults).
    /// A CPU knob's bad value is refused here (the CLI's usage error at start).
    pub fn from_env() -> std::result::Result<Settings, Refused> {
        Ok(Settings {
            cpu: CpuSettings::from_env()?,
            fusion: FusionConfig::from_env(),
            #[cfg(feature = "cuda")]
            cuda: minfer_cuda::CudaSettings::from_env(),
            #[cfg(any(feature = "metal", feature = "metal-emu"))]
            metal: minfer_metal::MetalSettings::from_env(),
            #[cfg(feature = "metal-emu")]
            emu: minfer_msl_emu::EmuSettings::from_env(),
        })
    }
}

/// `MINFER_TRACE` as a path (empty or unset: no trace), read once per process by
/// [`crate::trace::env_path`], which `run`, `chat` and `bench` fall back to without `--trace`.
pub(crate) fn trace_from_env() -> Option<PathBuf> {
    std::env::var_os("MINFER_TRACE")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// `MINFER_DISABLE_MPS` (set: the Metal device counts as unavailable), read where the
/// backend table is built, which `--backend` resolution needs before any settings exist.
#[cfg_attr(not(all(feature = "metal", target_os = "macos")), allow(dead_code))]
pub(crate) fn disable_mps() -> bool {
    std::env::var_os("MINFER_DISABLE_MPS").is_some()
}
