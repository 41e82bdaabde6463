//! The Metal executor's knobs (docs/SETTINGS.md), read once into [`MetalSettings`], which
//! the engine's settings hold and hand to [`crate::MetalBackend::with_settings`] by value.
//! The attention families' switches ([`attn_from_env`]) stay process-wide: the launch code
//! picks a kernel from free functions, through [`crate::launch::AttnEnv::get`].

use crate::launch::AttnEnv;

/// A switch: set, non-empty and not `0`.
fn on(name: &str) -> bool {
    switch(std::env::var(name).ok().as_deref())
}

fn switch(v: Option<&str>) -> bool {
    v.is_some_and(|v| !v.is_empty() && v != "0")
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
    /// The gates' control (`MINFER_METAL_TIER_CONTROL=by-rows`): the matmul tier and the
    /// attention family chosen by the forward's row count, as before row classes, instead of
    /// by the rows' class; the backend then says it is not batch invariant.
    pub tier_by_rows: bool,
    /// `MINFER_METAL_TIER_CONTROL` held a value other than `by-rows`: refused where the
    /// backend is made ([`MetalSettings::check`]).
    pub tier_refused: bool,
}

impl MetalSettings {
    /// The knobs as this process's environment sets them.
    pub fn from_env() -> MetalSettings {
        MetalSettings::from_lookup(|k| std::env::var(k).ok())
    }

    /// The knobs as `var` gives them (the environment, or a test's table).
    pub fn from_lookup(var: impl Fn(&str) -> Option<String>) -> MetalSettings {
        MetalSettings {
            weight_copy: var("MINFER_WEIGHT_COPY").as_deref() == Some("1"),
            op_profile: switch(var("MINFER_OP_PROFILE").as_deref()),
            trace_ring: switch(var("MINFER_TRACE").as_deref()),
            tier_by_rows: var("MINFER_METAL_TIER_CONTROL").as_deref() == Some("by-rows"),
            tier_refused: !matches!(
                var("MINFER_METAL_TIER_CONTROL").as_deref(),
                None | Some("" | "by-rows")
            ),
        }
    }

    /// The refusal of a bad knob, given where the backend is made (never a silent default).
    pub fn check(&self) -> Result<(), String> {
        if self.tier_refused {
            return Err(
                "MINFER_METAL_TIER_CONTROL: want by-rows (a gate's control) or unset".into(),
            );
        }
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    fn with(pairs: &[(&str, &str)]) -> MetalSettings {
        MetalSettings::from_lookup(|k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        })
    }

    /// Each switch is on exactly for the values it always took; the control: unset, empty
    /// and `0` leave everything off, and the weight copy takes only `1`.
    #[test]
    fn switches_take_their_documented_values() {
        assert_eq!(with(&[]), MetalSettings::default());
        for off in ["", "0"] {
            assert_eq!(
                with(&[("MINFER_OP_PROFILE", off), ("MINFER_TRACE", off)]),
                MetalSettings::default()
            );
        }
        let s = with(&[
            ("MINFER_WEIGHT_COPY", "1"),
            ("MINFER_OP_PROFILE", "yes"),
            ("MINFER_TRACE", "/tmp/t.json"),
        ]);
        assert!(s.weight_copy && s.op_profile && s.trace_ring);
        assert!(!with(&[("MINFER_WEIGHT_COPY", "yes")]).weight_copy);
        // The tier control: `by-rows` only; anything else is refused, never ignored.
        let c = with(&[("MINFER_METAL_TIER_CONTROL", "by-rows")]);
        assert!(c.tier_by_rows && c.check().is_ok());
        let bad = with(&[("MINFER_METAL_TIER_CONTROL", "rows")]);
        assert!(!bad.tier_by_rows && bad.check().is_err());
        assert!(with(&[("MINFER_METAL_TIER_CONTROL", "")]).check().is_ok());
    }
}
