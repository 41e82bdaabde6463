//! Model architectures: hyperparameters, tensor-name tables, graph builders, the plain
//! reference forward (a test oracle), and model synthesis.

pub mod arch;
pub mod error;
pub mod synth;

pub use arch::{names, Arch, HParams, RopeStyle};
pub use error::{Error, Result};
