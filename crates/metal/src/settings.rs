//! The Metal executor's knobs (docs/SETTINGS.md), read once into [`MetalSettings`], which
//! the engine's settings hold and hand to [`crate::MetalBackend::with_settings`] by value.
//! The attention families' switches ([`attn_from_env`]) stay process-wide: the launch code
//! picks a kernel from free functions, through [`crate::launch::AttnEnv::get`].

use crate::launch::AttnEnv;

/// A switch: set, non-empty and not `0`.
fn on(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| !v.is_empty() && v != "0")
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MetalSettings {
    /// Copy the weights into device buffers instead of wrapping the file's mapping
    /// (`MINFER_WEIGHT_COPY=1`).
    pub weight_copy: bool,
    /// Encode time per op and GPU wait per submit, printed as a table
    /// (`MINFER_OP_PROFILE`).
    pub op_profile: bool,
    /// A ring of the last node labels attached to a failed submit (`MINFER_TRACE`, read as a
    /// switch here; the engine reads the same name as a path).
    pub trace_ring: bool,
}

impl MetalSettings {
    /// The knobs as this process's environment sets them.
    pub fn from_env() -> MetalSettings {
        MetalSettings {
            weight_copy: std::env::var("MINFER_WEIGHT_COPY").is_ok_and(|v| v == "1"),
            op_profile: on("MINFER_OP_PROFILE"),
            trace_ring: on("MINFER_TRACE"),
        }
    }
}

/// `MINFER_NO_FLASH_ATTN`, `MINFER_NO_SPLIT_ATTN`, `MINFER_NO_PREFILL_FLASH`,
/// `MINFER_NO_MATMUL_ATTN` as the environment sets them now.
pub(crate) fn attn_from_env() -> AttnEnv {
    AttnEnv {
        no_flash: on("MINFER_NO_FLASH_ATTN"),
        no_split: on("MINFER_NO_SPLIT_ATTN"),
        no_prefill_flash: on("MINFER_NO_PREFILL_FLASH"),
        no_matmul: on("MINFER_NO_MATMUL_ATTN"),
    }
}
