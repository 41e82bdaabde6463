//! minfer-tokenizer.

pub mod template;
