//! Test support shared by the workspace's tests, benches and examples. A dev-dependency only:
//! no product crate depends on it normally.
//!
//! - [`exact`]: bit-for-bit comparisons of f32 outputs, naming the first difference.
//! - [`models`]: where the real demo models are cached, one function per model (`None`, after
//!   the test's SKIP line, when it is absent).
//! - [`rng`]: one seeded generator, [`rng::Rng`], with the algorithms the tests' expected
//!   numbers were drawn from (splitmix64, xorshift64, xorshift64*, xorshift32).
//! - `reference` (feature `quants`): the quantized reference's matmul outputs, for the CPU
//!   backend's exact gates.
//! - [`script`]: the repository's Python checkers fed on stdin.
//! - `synth` (feature `synth`): synthetic models on disk and engines on them, for the engine
//!   tests; `logits` (same feature): the f64 reference's logits, distances, greedy decoding.

pub mod exact;
#[cfg(feature = "synth")]
pub mod logits;
pub mod models;
#[cfg(feature = "quants")]
pub mod reference;
pub mod rng;
pub mod script;
#[cfg(feature = "synth")]
pub mod synth;
