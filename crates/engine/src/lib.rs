//! minfer-engine.

pub mod fetch;
