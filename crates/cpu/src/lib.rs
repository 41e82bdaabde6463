//! minfer-cpu.
