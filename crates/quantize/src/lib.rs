//! `minfer quantize`: rewrite a GGUF model with its weights in other types, byte for byte as
//! `llama-quantize` writes it for the same input and options.
//!
//! - [`Ftype`] names the file types (mixtures) and their default weight type.
//! - [`recipe`] picks each tensor's type: llama-quantize's per-tensor rules, `--pure`,
//!   `--output-tensor-type`, `--token-embedding-type`, `--tensor-type PATTERN=TYPE` and the
//!   fallback for rows that are not whole blocks.
//! - [`quantize_model`] streams the output: tensors in llama-quantize's order, rows
//!   converted to f32 and quantized on several threads, one tensor in memory at a time.
//!
//! What makes the bytes match llama-quantize: the metadata is copied in order with
//! `general.quantization_version` and `general.file_type` moved to the end (llama.cpp's
//! gguf sets a key by removing and appending it), `split.*` keys dropped; the tensors are
//! sorted by layer number then name (llama.cpp's loader keeps its weights in that map
//! order); data is aligned to 32 bytes; and the quantizers in `minfer_gguf::quants` are
//! byte-identical to ggml's. With [`Options::keep_split`] the output is a split set with the
//! input's parts, as `llama-quantize --keep-split` writes it (see `split_output`).
//!
//! ```no_run
//! use minfer_quantize::{quantize_model, Ftype, Options};
//! let opts = Options::new(Ftype::MostlyQ4KM);
//! quantize_model("model-f16.gguf".as_ref(), "model-q4_k_m.gguf".as_ref(), &opts, &mut |_| {})?;
//! # Ok::<(), minfer_quantize::Error>(())
//! ```

#![forbid(unsafe_code)]

pub mod ftype;
pub mod imatrix;
pub mod recipe;
mod run;
mod split_output;

pub use ftype::Ftype;
pub use imatrix::{Imatrix, ImatrixFormat};
pub use recipe::{Fallback, ModelFacts};
pub use run::{quantize_model, tensor_order, Event, Options, Summary};

use minfer_gguf::GgmlType;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Gguf(#[from] minfer_gguf::Error),
    #[error("{0}")]
    Recipe(String),
    #[error("tensor {tensor} is {ty}: requantizing a quantized tensor needs --allow-requantize")]
    Requantize { tensor: String, ty: GgmlType },
    #[error("{what}: minfer cannot quantize to {ty}")]
    TargetType { what: String, ty: GgmlType },
    #[error("--tensor-type pattern {pattern:?}: {source}")]
    Pattern {
        pattern: String,
        source: regex::Error,
    },
    #[error("imatrix {path}: {problem}")]
    Imatrix { path: PathBuf, problem: String },
    #[error(
        "imatrix entry {tensor} has {got} values but the tensor has {want} columns \
         (an imatrix made for another model?)"
    )]
    ImatrixSize {
        tensor: String,
        got: usize,
        want: usize,
    },
    #[error("--keep-split output {path}: {problem}")]
    KeepSplitOutput { path: PathBuf, problem: String },
    #[error(
        "--keep-split: part {part} of the {count}-part input holds no tensors, so it has no \
         output part (llama-quantize cannot write this either)"
    )]
    KeepSplitEmptyPart { part: usize, count: usize },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

pub type Result<T> = std::result::Result<T, Error>;

/// The N of a `blk.N.` tensor name, as llama.cpp's `sscanf(name, "blk.%d.")` reads it.
pub fn layer_number(name: &str) -> Option<i64> {
    let rest = name.strip_prefix("blk.")?;
    let rest = rest.trim_start();
    let end = rest
        .char_indices()
        .find(|&(i, c)| !(c.is_ascii_digit() || (i == 0 && (c == '-' || c == '+'))))
        .map_or(rest.len(), |(i, _)| i);
    rest[..end].parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_numbers_read_like_sscanf() {
        assert_eq!(layer_number("blk.12.attn_q.weight"), Some(12));
        assert_eq!(layer_number("blk.x.attn_q.weight"), None);
        assert_eq!(layer_number("output.weight"), None);
    }
}
