//! Tokenizer errors: every refusal names the key, token or position at fault.

pub type Result<T> = std::result::Result<T, Error>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("tokenizer metadata key {key} is missing")]
    MissingKey { key: &'static str },

    #[error("tokenizer metadata key {key} has the wrong type: expected {expected}, got {got}")]
    KeyType {
        key: &'static str,
        expected: &'static str,
        got: String,
    },

    #[error("tokenizer model {model:?} is not supported (only byte-level BPE, \"gpt2\")")]
    UnsupportedModel { model: String },

    #[error(
        "pre-tokenizer {pre:?} (tokenizer.ggml.pre) is not supported; known: qwen2, deepseek-r1-qwen, llama-bpe (llama3, llama-v3), smollm"
    )]
    UnsupportedPreTokenizer { pre: String },

    #[error("tokenizer.ggml.pre is missing: the pre-tokenizer rule cannot be chosen")]
    MissingPreTokenizer,

    #[error("tokenizer.ggml.merges is empty: a BPE vocabulary needs a merge table")]
    EmptyMerges,

    #[error("the token texts take {bytes} bytes, more than the 4 GiB this tokenizer indexes")]
    VocabTooLarge { bytes: usize },

    #[error("the vocabulary is empty (tokenizer.ggml.tokens has no entries)")]
    EmptyVocab,

    #[error("the vocabulary has no token for byte 0x{byte:02X} (byte-level piece {piece:?}); every byte of an assigned character's UTF-8 needs one")]
    MissingByteToken { byte: u8, piece: String },

    #[error("{key} has {got} entries but tokenizer.ggml.tokens has {expected}")]
    LengthMismatch {
        key: &'static str,
        expected: usize,
        got: usize,
    },

    #[error("{key} = {id} is out of range for a vocabulary of {n_vocab} tokens")]
    SpecialIdOutOfRange {
        key: &'static str,
        id: u64,
        n_vocab: usize,
    },

    #[error("merge {index} ({merge:?}) has no space separating its two parts")]
    BadMerge { index: usize, merge: String },

    #[error("input byte 0x{byte:02X} at offset {offset} has no token in this vocabulary")]
    UnrepresentableByte { byte: u8, offset: usize },

    #[error("input is not valid UTF-8: invalid byte sequence at byte offset {offset}")]
    InvalidUtf8 { offset: usize },

    #[error(
        "token id {id} is out of range for a vocabulary of {n_vocab} tokens (at position {index})"
    )]
    IdOutOfRange {
        id: u32,
        n_vocab: usize,
        index: usize,
    },
}
