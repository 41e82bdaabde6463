//! What the settings of every crate share: the refusal of a value a knob does not name.
//! Each crate that has knobs reads them once, in its own settings module, into a struct its
//! kernels and backends take by value; a bad value is this error there, never a default.
//! The graph's own knobs are the decode fusions ([`FusionConfig::from_env`]).

use std::sync::OnceLock;

use crate::fusion::FusionConfig;

/// A `MINFER_*` value that names nothing its knob accepts, refused by name (the text is what
/// the CLI prints as the usage error: `NAME=value: why`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{name}={value}: {why}")]
pub struct Refused {
    /// The variable, e.g. `MINFER_CPU_ISA`.
    pub name: &'static str,
    /// The value as given.
    pub value: String,
    /// What is wrong with it, with what would be accepted.
    pub why: String,
}

impl Refused {
    pub fn new(name: &'static str, value: impl Into<String>, why: impl Into<String>) -> Refused {
        Refused {
            name,
            value: value.into(),
            why: why.into(),
        }
    }
}

impl FusionConfig {
    /// `MINFER_NO_FUSE_QKV=1` / `MINFER_NO_FUSE_FFN=1` / `MINFER_NO_FUSE_NORM=1` /
    /// `MINFER_NO_FUSE_ADD=1` turn a rewrite off; read once per process.
    pub fn from_env() -> FusionConfig {
        static CFG: OnceLock<FusionConfig> = OnceLock::new();
        *CFG.get_or_init(|| {
            let off = |k: &str| std::env::var(k).is_ok_and(|v| v == "1");
            FusionConfig {
                qkv: !off("MINFER_NO_FUSE_QKV"),
                ffn: !off("MINFER_NO_FUSE_FFN"),
                norm: !off("MINFER_NO_FUSE_NORM"),
                add: !off("MINFER_NO_FUSE_ADD"),
            }
        })
    }
}
