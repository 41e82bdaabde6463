//! What the settings of every crate share: the refusal of a value a knob does not name.
//! Each crate that has knobs reads them once, in its own settings module, into a struct its
//! kernels and backends take by value; a bad value is this error there, never a default.

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
