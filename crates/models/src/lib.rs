//! Model architectures: hyperparameters, tensor-name tables, graph builders, the plain
//! reference forward (a test oracle), and model synthesis.

pub mod arch;
pub mod error;
pub mod graph;
pub mod reference;
pub mod shard;
pub mod synth;
pub mod tensors;
pub mod tp;

pub use arch::{names, Arch, HParams};
pub use error::{Error, Result};
pub use graph::build_graph;
pub use tensors::{check_tensors, output_weight_name};
