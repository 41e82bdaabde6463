//! minfer-tokenizer: byte-level BPE tokenizers built from GGUF metadata, matching llama.cpp's
//! token ids (see `tokenizer.rs` for the pipeline and `pretokenize.rs` for the split rules).
//!
//! ```no_run
//! let file = minfer_gguf::GgufFile::open("model.gguf")?;
//! let tok = minfer_tokenizer::Tokenizer::from_metadata(&file.header().metadata)?;
//! let ids = tok.encode("Hello world", false);
//! let text = tok.decode(&ids)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod bpe;
pub mod decode;
pub mod error;
pub mod pretokenize;
pub mod special;
pub mod template;
mod text_index;
pub mod tokenizer;
pub mod unicode;
mod unicode_tables;
pub mod vocab;

pub use decode::StreamDecoder;
pub use error::{Error, Result};
pub use pretokenize::PreTokenizer;
pub use tokenizer::{Normalization, Tokenizer};
pub use vocab::{SpecialIds, TokenType};
