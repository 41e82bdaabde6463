//! `MINFER_TEST_PLANT_CPU=rmsnorm-eps@<layer>`: a deliberate one-line kernel bug, for the
//! test that shows `minfer trace-diff` names the node of a wrong kernel (cli/tests/plant.rs).
//!
//! Planted, the RMSNorm nodes of one layer (named `L<layer>.…` by the graph builders) run
//! with [`PLANTED_EPS`] added to their epsilon, which scales their output by about
//! `sqrt(ms / (ms + 0.5))` for a row mean square `ms`: a wrong-constant bug of the kind a
//! kernel port makes. Nothing else changes. Unset or empty: no plant, and the kernel pays one
//! `Option` test per RMSNorm node. A value that is not `rmsnorm-eps@<layer number>` is
//! refused by name (the CLI checks it at start, as `MINFER_CPU_ISA`).

use minfer_graph::{Node, Op, Refused};

/// What the planted bug adds to the RMSNorm epsilon.
pub const PLANTED_EPS: f32 = 0.5;

/// The planted bug: which layer's RMSNorm nodes get the wrong epsilon.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plant {
    /// `L<layer>.`, the name prefix of the layer's nodes.
    prefix: String,
}

impl Plant {
    /// Whether `node` runs with the planted bug.
    pub fn hits(&self, node: &Node) -> bool {
        matches!(node.op, Op::RmsNorm { .. }) && node.name.starts_with(&self.prefix)
    }
}

/// Parses a `MINFER_TEST_PLANT_CPU` value (empty: none).
pub fn parse(v: &str) -> Result<Option<Plant>, Refused> {
    if v.is_empty() {
        return Ok(None);
    }
    let layer = v
        .strip_prefix("rmsnorm-eps@")
        .and_then(|l| l.parse::<u32>().ok())
        .ok_or_else(|| {
            Refused::new(
                "MINFER_TEST_PLANT_CPU",
                v,
                "not a planted bug (want rmsnorm-eps@<layer>)",
            )
        })?;
    Ok(Some(Plant {
        prefix: format!("L{layer}."),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Control: a bad value is refused, not taken as "no plant".
    #[test]
    fn parses_the_layer_and_refuses_other_values() {
        assert_eq!(parse("").unwrap(), None);
        assert_eq!(
            parse("rmsnorm-eps@3").unwrap(),
            Some(Plant {
                prefix: "L3.".into()
            })
        );
        for bad in ["rmsnorm-eps@", "rmsnorm-eps@x", "silu@1", "1"] {
            assert!(parse(bad).unwrap_err().to_string().contains(bad), "{bad}");
        }
    }
}
