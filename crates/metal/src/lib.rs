//! minfer's Metal layer: the [`Device`] trait the executor drives, the kernels
//! (`kernels/*.metal`, embedded by [`source`]) and one plain `launch_*` fn per kernel family
//! (buffers and a params struct in, no tensors), so each kernel can be tested alone.
//!
//! Implementations of [`Device`]: `minfer-metal-objc` (objc2-metal, macOS) and
//! `minfer-msl-emu` (the MSL emulator, Linux CI). The `conformance` feature exposes the kernel
//! gate suite both run.

pub mod backend;
pub mod device;
pub mod error;
pub mod launch;
pub mod params;
pub mod settings;
pub mod source;
pub mod weights;

#[cfg(feature = "conformance")]
pub mod conformance;

pub use backend::MetalBackend;
pub use device::{Arg, Device, Dispatch, Limits};
pub use error::{Error, Result};
pub use settings::MetalSettings;
pub use weights::WeightRegistry;
