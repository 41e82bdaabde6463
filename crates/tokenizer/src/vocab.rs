//! The vocabulary read from GGUF metadata (`tokenizer.ggml.*`): token texts and types, the
//! merge table, special ids and flags. Everything the file gets wrong is refused by name.

use crate::bpe::{Bpe, FxMap};
use crate::error::{Error, Result};
use crate::pretokenize::PreTokenizer;
use crate::text_index::TextIndex;
use crate::unicode::{char_to_byte, BYTE_TO_CHAR};
use minfer_gguf::{Array, Metadata, Value};

pub const KEY_MODEL: &str = "tokenizer.ggml.model";
pub const KEY_PRE: &str = "tokenizer.ggml.pre";
pub const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
pub const KEY_TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
pub const KEY_MERGES: &str = "tokenizer.ggml.merges";
pub const KEY_BOS: &str = "tokenizer.ggml.bos_token_id";
pub const KEY_EOS: &str = "tokenizer.ggml.eos_token_id";
pub const KEY_EOT: &str = "tokenizer.ggml.eot_token_id";
pub const KEY_EOM: &str = "tokenizer.ggml.eom_token_id";
pub const KEY_UNK: &str = "tokenizer.ggml.unknown_token_id";
pub const KEY_PAD: &str = "tokenizer.ggml.padding_token_id";
pub const KEY_ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
pub const KEY_ADD_EOS: &str = "tokenizer.ggml.add_eos_token";

/// GGUF token types (llama.cpp's `llama_token_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenType {
    Undefined,
    Normal,
    Unknown,
    /// Special tokens (`<|im_start|>`): matched in text only with `parse_special`.
    Control,
    /// Added tokens (`<tool_call>`): always matched in text, never split.
    UserDefined,
    /// Padding entries: never matched, decoded as nothing.
    Unused,
    Byte,
}

impl TokenType {
    pub fn from_i64(v: i64) -> TokenType {
        match v {
            1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => TokenType::Undefined,
        }
    }
}

/// Special token ids of a vocabulary.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpecialIds {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    /// End of turn: `tokenizer.ggml.eot_token_id`, else found by text (`<|eot_id|>`,
    /// `<|im_end|>`, ...) as llama.cpp does.
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub pad: Option<u32>,
}

/// Texts llama.cpp recognises as end of turn, in the order they are tried here.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];

/// Texts of tokens that end generation besides EOS/EOT/EOM (llama.cpp's list, including its
/// fill-in-the-middle pad/repo/file-separator tokens).
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
];

/// Everything loaded from metadata.
pub struct Vocab {
    pub pre: PreTokenizer,
    /// Token texts as stored (byte-level form for normal tokens), concatenated.
    pub text_bytes: Vec<u8>,
    pub text_offsets: Vec<u32>,
    /// Decoded bytes of each token (what it contributes to output text), concatenated.
    pub piece_bytes: Vec<u8>,
    pub piece_offsets: Vec<u32>,
    pub types: Vec<TokenType>,
    pub bpe: Bpe,
    pub special: SpecialIds,
    pub eog: Vec<u32>,
    pub add_bos: bool,
    pub add_eos: bool,
    /// Byte-string to id, for `ignore_merges` rules only (empty otherwise).
    pub whole_words: FxMap<Box<[u8]>, u32>,
    /// Bytes without a token (allowed ones only, see [`byte_required`]), ascending.
    pub missing_bytes: Vec<u8>,
}

/// Marks a byte without a token in [`crate::bpe::Bpe`]'s byte table.
pub const NO_TOKEN: u32 = u32::MAX;

/// Whether a vocabulary must have a token for byte `b`. Every byte that occurs in the UTF-8
/// of an assigned code point is required, except the C0 control characters other than tab,
/// LF and CR, and DEL. Not required, so: those controls, 0xC0/0xC1/0xF5..=0xFF (never in
/// UTF-8) and 0xF1/0xF2 (lead bytes of planes 4..=11, which have no assigned code points).
/// SmolLM2's vocabulary lacks exactly 21 such bytes (0x04 0x06 0x13 0x14 0x16 0x1D 0xC0 0xC1
/// 0xF1 0xF2 0xF5..=0xFF); llama.cpp drops such bytes from the input silently, and
/// [`crate::Tokenizer::encode`] does the same for identity, while
/// [`crate::Tokenizer::encode_bytes`] refuses them.
pub fn byte_required(b: u8) -> bool {
    matches!(b, b'\t' | b'\n' | b'\r' | 0x20..=0x7E | 0x80..=0xBF | 0xC2..=0xF0 | 0xF3 | 0xF4)
}

fn get_str<'a>(md: &'a Metadata, key: &'static str) -> Result<Option<&'a str>> {
    match md.get(key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(v) => Err(Error::KeyType {
            key,
            expected: "string",
            got: v.value_type().name().into(),
        }),
    }
}

fn get_str_array<'a>(md: &'a Metadata, key: &'static str) -> Result<&'a minfer_gguf::StringArray> {
    match md.get(key) {
        None => Err(Error::MissingKey { key }),
        Some(Value::Array(Array::String(v))) => Ok(v),
        Some(v) => Err(Error::KeyType {
            key,
            expected: "array of string",
            got: type_name(v),
        }),
    }
}

fn type_name(v: &Value) -> String {
    match v {
        Value::Array(a) => format!("array of {}", a.elem_type().name()),
        v => v.value_type().name().into(),
    }
}

fn get_int_array(md: &Metadata, key: &'static str) -> Result<Option<Vec<i64>>> {
    let Some(v) = md.get(key) else {
        return Ok(None);
    };
    let bad = || Error::KeyType {
        key,
        expected: "array of integers",
        got: type_name(v),
    };
    let Value::Array(a) = v else {
        return Err(bad());
    };
    Ok(Some(match a {
        Array::I32(x) => x.iter().map(|&y| y as i64).collect(),
        Array::U32(x) => x.iter().map(|&y| y as i64).collect(),
        Array::I8(x) => x.iter().map(|&y| y as i64).collect(),
        Array::U8(x) => x.iter().map(|&y| y as i64).collect(),
        Array::I16(x) => x.iter().map(|&y| y as i64).collect(),
        Array::U16(x) => x.iter().map(|&y| y as i64).collect(),
        Array::I64(x) => x.clone(),
        _ => return Err(bad()),
    }))
}

fn get_id(md: &Metadata, key: &'static str, n_vocab: usize) -> Result<Option<u32>> {
    let Some(v) = md.get(key) else {
        return Ok(None);
    };
    let id = v.as_u64().ok_or_else(|| Error::KeyType {
        key,
        expected: "unsigned integer",
        got: type_name(v),
    })?;
    if id >= n_vocab as u64 {
        return Err(Error::SpecialIdOutOfRange { key, id, n_vocab });
    }
    Ok(Some(id as u32))
}

fn get_bool(md: &Metadata, key: &'static str) -> Result<Option<bool>> {
    match md.get(key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(Error::KeyType {
            key,
            expected: "bool",
            got: type_name(v),
        }),
    }
}

/// Decodes a byte-level token text to bytes; characters outside the byte map (none in a
/// well-formed byte-level vocabulary) are kept as their UTF-8.
fn byte_level_decode(text: &str, out: &mut Vec<u8>) {
    for c in text.chars() {
        match char_to_byte(c) {
            Some(b) => out.push(b),
            None => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
}

/// Whether a text is entirely byte-level characters (then it is the image of some bytes).
fn byte_level_to_bytes(text: &str) -> Option<Vec<u8>> {
    text.chars().map(char_to_byte).collect()
}

impl Vocab {
    pub fn from_metadata(md: &Metadata) -> Result<Vocab> {
        let model = get_str(md, KEY_MODEL)?.ok_or(Error::MissingKey { key: KEY_MODEL })?;
        if model != "gpt2" {
            return Err(Error::UnsupportedModel {
                model: model.into(),
            });
        }
        let pre_name = get_str(md, KEY_PRE)?.ok_or(Error::MissingPreTokenizer)?;
        let pre =
            PreTokenizer::from_name(pre_name).ok_or_else(|| Error::UnsupportedPreTokenizer {
                pre: pre_name.into(),
            })?;
        let tokens = get_str_array(md, KEY_TOKENS)?;
        let n = tokens.len();
        if n == 0 {
            return Err(Error::EmptyVocab);
        }
        let merges: Vec<&str> = get_str_array(md, KEY_MERGES)?.iter().collect();
        if merges.is_empty() {
            return Err(Error::EmptyMerges);
        }
        let types: Vec<TokenType> = match get_int_array(md, KEY_TOKEN_TYPE)? {
            None => vec![TokenType::Normal; n],
            Some(t) if t.len() != n => {
                return Err(Error::LengthMismatch {
                    key: KEY_TOKEN_TYPE,
                    expected: n,
                    got: t.len(),
                })
            }
            Some(t) => t.into_iter().map(TokenType::from_i64).collect(),
        };

        // Texts and pieces, each in one buffer.
        let total: usize = tokens.iter().map(|t| t.len()).sum();
        // Offsets are u32; pieces are never longer than texts.
        if total > u32::MAX as usize {
            return Err(Error::VocabTooLarge { bytes: total });
        }
        let mut text_bytes = Vec::with_capacity(total);
        let mut text_offsets = Vec::with_capacity(n + 1);
        let mut piece_bytes = Vec::with_capacity(total);
        let mut piece_offsets = Vec::with_capacity(n + 1);
        text_offsets.push(0u32);
        piece_offsets.push(0u32);
        for (t, ty) in tokens.iter().zip(&types) {
            text_bytes.extend_from_slice(t.as_bytes());
            text_offsets.push(text_bytes.len() as u32);
            match ty {
                TokenType::Normal | TokenType::Byte | TokenType::Undefined => {
                    byte_level_decode(t, &mut piece_bytes)
                }
                TokenType::Control | TokenType::UserDefined | TokenType::Unknown => {
                    piece_bytes.extend_from_slice(t.as_bytes())
                }
                TokenType::Unused => {}
            }
            piece_offsets.push(piece_bytes.len() as u32);
        }

        // Text -> id; a later duplicate wins, as in llama.cpp's map.
        let by_text = TextIndex::new(&text_bytes, &text_offsets);

        let mut byte_ids = [NO_TOKEN; 256];
        let mut missing_bytes = Vec::new();
        for (b, id) in byte_ids.iter_mut().enumerate() {
            let c = BYTE_TO_CHAR[b];
            let mut buf = [0u8; 4];
            let s: &str = c.encode_utf8(&mut buf);
            match by_text.get(s.as_bytes()) {
                Some(t) => *id = t,
                None if byte_required(b as u8) => {
                    return Err(Error::MissingByteToken {
                        byte: b as u8,
                        piece: s.into(),
                    })
                }
                None => missing_bytes.push(b as u8),
            }
        }

        let bpe = build_merges(&merges, &by_text, byte_ids, n)?;

        let whole_words = if pre.ignores_merges() {
            let mut m = FxMap::default();
            for (i, t) in tokens.iter().enumerate() {
                if let Some(bytes) = byte_level_to_bytes(t) {
                    m.insert(bytes.into_boxed_slice(), i as u32);
                }
            }
            m
        } else {
            FxMap::default()
        };

        let mut special = SpecialIds {
            bos: get_id(md, KEY_BOS, n)?,
            eos: get_id(md, KEY_EOS, n)?,
            eot: get_id(md, KEY_EOT, n)?,
            eom: get_id(md, KEY_EOM, n)?,
            unk: get_id(md, KEY_UNK, n)?,
            pad: get_id(md, KEY_PAD, n)?,
        };
        if special.eot.is_none() {
            special.eot = EOT_TEXTS.iter().find_map(|t| by_text.get(t.as_bytes()));
        }
        if special.eom.is_none() {
            special.eom = by_text.get(b"<|eom_id|>");
        }
        let mut eog: Vec<u32> = [special.eos, special.eot, special.eom]
            .into_iter()
            .flatten()
            .chain(EOG_TEXTS.iter().filter_map(|t| by_text.get(t.as_bytes())))
            .collect();
        eog.sort_unstable();
        eog.dedup();

        let add_bos = get_bool(md, KEY_ADD_BOS)?.unwrap_or(pre.default_add_bos());
        let add_eos = get_bool(md, KEY_ADD_EOS)?.unwrap_or(false);
        if add_bos && special.bos.is_none() {
            return Err(Error::MissingKey { key: KEY_BOS });
        }
        if add_eos && special.eos.is_none() {
            return Err(Error::MissingKey { key: KEY_EOS });
        }
        drop(by_text);

        Ok(Vocab {
            pre,
            text_bytes,
            text_offsets,
            piece_bytes,
            piece_offsets,
            types,
            bpe,
            special,
            eog,
            add_bos,
            add_eos,
            whole_words,
            missing_bytes,
        })
    }

    pub fn len(&self) -> usize {
        self.types.len()
    }

    pub fn is_empty(&self) -> bool {
        self.types.is_empty()
    }

    pub fn text(&self, id: u32) -> &[u8] {
        let i = id as usize;
        &self.text_bytes[self.text_offsets[i] as usize..self.text_offsets[i + 1] as usize]
    }

    pub fn piece(&self, id: u32) -> &[u8] {
        let i = id as usize;
        &self.piece_bytes[self.piece_offsets[i] as usize..self.piece_offsets[i + 1] as usize]
    }
}

/// Parses `"left right"` merges into id pairs. The first occurrence of a pair sets its rank
/// (llama.cpp's `emplace`). In the common case both parts and the result are vocabulary
/// entries (one pass, three lookups). The rest go to a second pass: results outside the
/// vocabulary get virtual ids, and merges whose parts can never be formed are dropped.
/// Splits a merge at its separator: the first space after the first character (llama.cpp:
/// `find(' ', 1)`).
fn split_merge(index: usize, m: &str) -> Result<(&str, &str)> {
    let first_len = m.chars().next().map_or(0, char::len_utf8);
    match m[first_len..].find(' ') {
        Some(p) => Ok((&m[..first_len + p], &m[first_len + p + 1..])),
        None => Err(Error::BadMerge {
            index,
            merge: m.to_string(),
        }),
    }
}

/// `(left, right, result)` ids of merges `first..first + merges.len()`, `NO_TOKEN` where a
/// text is not a vocabulary entry.
fn resolve_merges(first: usize, merges: &[&str], by_text: &TextIndex) -> Result<Vec<[u32; 3]>> {
    let mut out = Vec::with_capacity(merges.len());
    let mut concat = String::with_capacity(64);
    let mut result_delta = 0u32;
    for (i, m) in merges.iter().enumerate() {
        let rank = first + i;
        let (a, b) = split_merge(rank, m)?;
        concat.clear();
        concat.push_str(a);
        concat.push_str(b);
        // Vocabularies list merge results in rank order (Qwen2.5: id = 256 + rank, SmolLM2:
        // 252 + rank), so the result's id is first guessed from the previous one and checked;
        // that saves a third of the random-access lookups.
        let guess = (rank as u32).wrapping_add(result_delta);
        let merged = if by_text.is(guess, concat.as_bytes()) {
            guess
        } else {
            match by_text.get(concat.as_bytes()) {
                Some(id) => {
                    result_delta = id.wrapping_sub(rank as u32);
                    id
                }
                None => NO_TOKEN,
            }
        };
        let get = |t: &str| by_text.get(t.as_bytes()).unwrap_or(NO_TOKEN);
        out.push([get(a), get(b), merged]);
    }
    Ok(out)
}

/// Merge tables at least this long are resolved on several threads.
const PARALLEL_MERGES: usize = 1 << 14;

fn build_merges(
    merges: &[&str],
    by_text: &TextIndex,
    byte_ids: [u32; 256],
    n_vocab: usize,
) -> Result<Bpe> {
    // The lookups are independent: resolve chunks in parallel, then insert in rank order.
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(8));
    let resolved: Vec<[u32; 3]> = if threads > 1 && merges.len() >= PARALLEL_MERGES {
        let chunk = merges.len().div_ceil(threads);
        let parts: Vec<Result<Vec<[u32; 3]>>> = std::thread::scope(|scope| {
            let handles: Vec<_> = merges
                .chunks(chunk)
                .enumerate()
                .map(|(k, c)| scope.spawn(move || resolve_merges(k * chunk, c, by_text)))
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(Error::BadMerge {
                            index: 0,
                            merge: "a merge-resolving thread panicked".into(),
                        })
                    })
                })
                .collect()
        });
        let mut all = Vec::with_capacity(merges.len());
        for p in parts {
            all.extend(p?);
        }
        all
    } else {
        resolve_merges(0, merges, by_text)?
    };
    let mut table: FxMap<u64, (u32, u32)> = FxMap::default();
    table.reserve(merges.len());
    let mut pending: Vec<(usize, &str, &str)> = Vec::new();
    for (rank, &[ia, ib, im]) in resolved.iter().enumerate() {
        if ia != NO_TOKEN && ib != NO_TOKEN && im != NO_TOKEN {
            table
                .entry(((ia as u64) << 32) | ib as u64)
                .or_insert((rank as u32, im));
        } else {
            let (a, b) = split_merge(rank, merges[rank])?;
            pending.push((rank, a, b));
        }
    }
    let mut virtual_bytes: Vec<Vec<u8>> = Vec::new();
    if !pending.is_empty() {
        let mut virtual_ids: FxMap<String, u32> = FxMap::default();
        for &(_, a, b) in &pending {
            let c = format!("{a}{b}");
            if by_text.get(c.as_bytes()).is_some() || virtual_ids.contains_key(&c) {
                continue;
            }
            let Some(bytes) = byte_level_to_bytes(&c) else {
                continue; // not made of bytes: no word can ever form it
            };
            virtual_ids.insert(c, (n_vocab + virtual_bytes.len()) as u32);
            virtual_bytes.push(bytes);
        }
        let lookup = |s: &str| {
            by_text
                .get(s.as_bytes())
                .or_else(|| virtual_ids.get(s).copied())
        };
        for &(rank, a, b) in &pending {
            let (Some(ia), Some(ib), Some(im)) = (lookup(a), lookup(b), lookup(&format!("{a}{b}")))
            else {
                continue;
            };
            let e = table
                .entry(((ia as u64) << 32) | ib as u64)
                .or_insert((rank as u32, im));
            // An earlier rank always wins, whichever pass saw it first.
            if e.0 > rank as u32 {
                *e = (rank as u32, im);
            }
        }
    }
    Ok(Bpe::new(byte_ids, table, n_vocab as u32, virtual_bytes))
}
