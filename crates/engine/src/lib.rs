//! minfer-engine.
