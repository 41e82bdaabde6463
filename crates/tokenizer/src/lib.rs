//! minfer-tokenizer.
