//! What the real-model gates share.

pub mod code_edits;
