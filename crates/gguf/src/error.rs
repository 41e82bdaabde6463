//! The one error type of the GGUF layer. Every variant carries what a user needs to act:
//! the byte offset in the file, the tensor or key name, expected vs found.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("not a GGUF file: magic {found:?} at offset 0 (expected \"GGUF\")")]
    BadMagic { found: [u8; 4] },
    #[error(
        "unsupported GGUF version {version} at offset 4 (minfer reads versions 2 and 3{})",
        big_endian_hint(*version)
    )]
    UnsupportedVersion { version: u32 },
    #[error("file truncated at offset {offset}: needed {needed} more bytes for {what}, file has {len} bytes")]
    Truncated {
        offset: u64,
        needed: u64,
        len: u64,
        what: &'static str,
    },
    #[error(
        "{what} {count} at offset {offset} cannot fit in the {remaining} bytes left in the file"
    )]
    CountTooLarge {
        what: &'static str,
        count: u64,
        offset: u64,
        remaining: u64,
    },
    #[error("string at offset {offset} is not valid UTF-8")]
    BadUtf8 { offset: u64 },
    #[error("bool value {value} at offset {offset} is neither 0 nor 1")]
    BadBool { value: u8, offset: u64 },
    #[error("unknown metadata value type {type_id} at offset {offset}")]
    BadValueType { type_id: u32, offset: u64 },
    #[error("metadata arrays nested deeper than {max} levels at offset {offset}")]
    NestingTooDeep { offset: u64, max: usize },
    #[error("duplicate metadata key {key:?} at offset {offset}")]
    DuplicateKey { key: String, offset: u64 },
    #[error("metadata key {key:?} at offset {offset}: {problem}")]
    BadKey {
        key: String,
        offset: u64,
        problem: String,
    },
    #[error("duplicate tensor name {name:?} at offset {offset}")]
    DuplicateTensor { name: String, offset: u64 },
    #[error("tensor {name:?} (info at offset {offset}): {problem}")]
    BadTensor {
        name: String,
        offset: u64,
        problem: String,
    },
    #[error("tensors {a:?} and {b:?} overlap in the data section (bytes {a_start}..{a_end} and {b_start}..{b_end})")]
    OverlappingTensors {
        a: String,
        b: String,
        a_start: u64,
        a_end: u64,
        b_start: u64,
        b_end: u64,
    },
    #[error("tensor {name} has type {ty}, which minfer does not support")]
    UnsupportedType { name: String, ty: String },
    #[error("split model {path}: {problem}")]
    Split { path: PathBuf, problem: String },
    #[error("tensor {name:?} not found in the model")]
    MissingTensor { name: String },
    #[error("{ty} is not supported by minfer ({op})")]
    UnsupportedQuantType {
        ty: crate::GgmlType,
        op: &'static str,
    },
    #[error("cannot quantize to {ty}: minfer has no quantizer for it")]
    NotQuantizable { ty: crate::GgmlType },
    #[error("{op}: a {ty} row of {n} elements is not a whole number of {block}-element blocks")]
    PartialBlock {
        op: &'static str,
        ty: crate::GgmlType,
        n: usize,
        block: usize,
    },
    #[error("{op}: a {ty} row of {n} elements takes {expected} bytes of {what}, got {got}")]
    RowBytes {
        op: &'static str,
        ty: crate::GgmlType,
        what: &'static str,
        n: usize,
        expected: usize,
        got: usize,
    },
    #[error("{0}")]
    Invalid(String),
}

/// A version that reads as 2 or 3 byte-swapped is a big-endian file: say so.
fn big_endian_hint(version: u32) -> &'static str {
    match version.swap_bytes() {
        2 | 3 => "; this is a big-endian GGUF file, which minfer does not read",
        _ => "",
    }
}

pub type Result<T> = std::result::Result<T, Error>;
