//! minfer-cpu.
pub mod simd;
