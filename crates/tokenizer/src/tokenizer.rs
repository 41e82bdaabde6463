//! The tokenizer: special-token partition, optional normalization, pre-tokenization, BPE with
//! a word cache; and decoding back to bytes.

use crate::bpe::FxMap;
use crate::error::{Error, Result};
use crate::pretokenize::{PreTokenizer, Scratch};
use crate::special::{Fragment, SpecialSet};
use crate::vocab::{SpecialIds, TokenType, Vocab, NO_TOKEN};
use minfer_gguf::Metadata;
use std::borrow::Cow;
use std::ops::Range;
use std::sync::Mutex;
use unicode_normalization::{is_nfc_quick, IsNormalized, UnicodeNormalization};

/// Text normalization applied to plain text (not to matched special tokens) before splitting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Normalization {
    /// llama.cpp's behaviour: code points are tokenized as given.
    #[default]
    None,
    /// HF `tokenizers`' Qwen2 behaviour: Unicode NFC first. Strings whose NFC form differs
    /// (NFD accents and Hangul, the Ångström/Ohm/Kelvin signs, ...) then tokenize like their
    /// NFC form, and decoding gives the NFC form back rather than the input.
    Nfc,
}

/// Words at most this long (bytes) are remembered by the word cache (HF's BPE cache takes
/// words under 256 characters).
const CACHE_MAX_WORD: usize = 256;
/// The cache is cleared when it reaches this many words (bounds memory on endless input).
const CACHE_MAX_ENTRIES: usize = 1 << 18;

type WordCache = FxMap<Box<[u8]>, Box<[u32]>>;

/// A byte-level BPE tokenizer built from GGUF metadata.
pub struct Tokenizer {
    vocab: Vocab,
    /// Tokens matched whatever `parse_special` says (user-defined).
    always: SpecialSet,
    /// Tokens matched with `parse_special` (user-defined, control, unknown).
    with_special: SpecialSet,
    normalization: Normalization,
    cache: Mutex<WordCache>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("n_vocab", &self.vocab.len())
            .field("pre", &self.vocab.pre)
            .field("special", &self.vocab.special)
            .field("normalization", &self.normalization)
            .finish()
    }
}

impl Tokenizer {
    /// Builds the tokenizer from `tokenizer.ggml.*` metadata, refusing anything unsupported
    /// by name (model type, pre-tokenizer rule, empty merges, missing byte tokens, ...).
    pub fn from_metadata(md: &Metadata) -> Result<Tokenizer> {
        let vocab = Vocab::from_metadata(md)?;
        let always = SpecialSet::new(&vocab, false);
        let with_special = SpecialSet::new(&vocab, true);
        Ok(Tokenizer {
            vocab,
            always,
            with_special,
            normalization: Normalization::None,
            cache: Mutex::new(WordCache::default()),
        })
    }

    /// The same tokenizer with another normalization.
    pub fn with_normalization(mut self, normalization: Normalization) -> Tokenizer {
        self.normalization = normalization;
        self
    }

    /// Empties the word cache (benchmarks use it to time encoding from cold).
    pub fn clear_cache(&self) {
        if let Ok(mut c) = self.cache.lock() {
            c.clear();
        }
    }

    pub fn normalization(&self) -> Normalization {
        self.normalization
    }
    pub fn n_vocab(&self) -> usize {
        self.vocab.len()
    }
    pub fn pre_tokenizer(&self) -> PreTokenizer {
        self.vocab.pre
    }
    pub fn special_ids(&self) -> &SpecialIds {
        &self.vocab.special
    }
    /// Whether prompts start with BOS (`tokenizer.ggml.add_bos_token`, else the rule's default).
    pub fn add_bos(&self) -> bool {
        self.vocab.add_bos
    }
    pub fn add_eos(&self) -> bool {
        self.vocab.add_eos
    }
    /// Whether `id` ends generation (EOS, EOT, EOM and the end-like tokens llama.cpp lists).
    pub fn is_eog(&self, id: u32) -> bool {
        self.vocab.eog.binary_search(&id).is_ok()
    }
    pub fn eog_ids(&self) -> &[u32] {
        &self.vocab.eog
    }
    /// The merge table (tests compare its two merge loops).
    pub fn bpe(&self) -> &crate::bpe::Bpe {
        &self.vocab.bpe
    }
    /// Merge pairs in the table, and how many merge results are outside the vocabulary.
    pub fn merge_stats(&self) -> (usize, usize) {
        (self.vocab.bpe.n_merges(), self.vocab.bpe.n_virtual())
    }

    fn check(&self, id: u32, index: usize) -> Result<usize> {
        let n = self.vocab.len();
        if (id as usize) < n {
            Ok(id as usize)
        } else {
            Err(Error::IdOutOfRange {
                id,
                n_vocab: n,
                index,
            })
        }
    }

    pub fn token_type(&self, id: u32) -> Result<TokenType> {
        Ok(self.vocab.types[self.check(id, 0)?])
    }
    /// The token's text as stored in the vocabulary (byte-level form for normal tokens).
    pub fn token_text(&self, id: u32) -> Result<&[u8]> {
        self.check(id, 0)?;
        Ok(self.vocab.text(id))
    }
    /// The bytes the token stands for (control tokens: their text; unused: nothing).
    pub fn piece(&self, id: u32) -> Result<&[u8]> {
        self.check(id, 0)?;
        Ok(self.vocab.piece(id))
    }

    /// Tokens of `text`, without BOS/EOS. With `parse_special`, control tokens written in the
    /// text (`<|im_start|>`) become their single id; without it they are ordinary text.
    /// User-defined tokens are always matched (llama.cpp's rule).
    pub fn encode(&self, text: &str, parse_special: bool) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 4);
        self.encode_into(text, parse_special, &mut out);
        out
    }

    /// [`Tokenizer::encode`] of raw bytes, refusing invalid UTF-8 and bytes the vocabulary
    /// has no token for (which `encode` drops, as llama.cpp does), each with its offset.
    pub fn encode_bytes(&self, bytes: &[u8], parse_special: bool) -> Result<Vec<u32>> {
        let text = std::str::from_utf8(bytes).map_err(|e| Error::InvalidUtf8 {
            offset: e.valid_up_to(),
        })?;
        if !self.vocab.missing_bytes.is_empty() {
            let byte_ids = &self.vocab.bpe.byte_ids;
            if let Some(offset) = bytes.iter().position(|&b| byte_ids[b as usize] == NO_TOKEN) {
                return Err(Error::UnrepresentableByte {
                    byte: bytes[offset],
                    offset,
                });
            }
        }
        Ok(self.encode(text, parse_special))
    }

    /// Bytes this vocabulary has no token for (empty for a complete byte-level vocabulary).
    pub fn missing_byte_tokens(&self) -> &[u8] {
        &self.vocab.missing_bytes
    }

    /// A prompt's tokens: BOS/EOS added when `add_special` and the vocabulary asks for them.
    pub fn encode_prompt(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        self.with_bos_eos(add_special, text.len(), |out| {
            self.encode_into(text, parse_special, out)
        })
    }

    /// [`Tokenizer::encode_prompt`] with `parse_special`, except that no control or unknown
    /// token is matched where its text overlaps a `protected` byte range: those bytes are
    /// tokenized as plain text together with the plain text around them, as
    /// `parse_special = false` would. This is for a rendered chat prompt whose message
    /// contents lie at the protected ranges, so a `<|im_start|>` typed by a user cannot
    /// become the control token the template itself writes.
    ///
    /// User-defined tokens (Qwen's `<tool_call>`) are matched even in protected ranges:
    /// llama.cpp and HF match them in plain text too, so a protected range is tokenized the
    /// way `encode(.., false)` tokenizes it. Ranges may be unsorted, overlap, or reach past
    /// the text; empty ones protect nothing. When no range overlaps the text of a token that
    /// `encode_prompt(text, add_special, true)` matches, the result equals that.
    pub fn encode_protected(
        &self,
        text: &str,
        add_special: bool,
        protected: &[Range<usize>],
    ) -> Vec<u32> {
        let spans = merged(protected);
        let types = &self.vocab.types;
        self.with_bos_eos(add_special, text.len(), |out| {
            let mut fragments = Vec::new();
            self.with_special
                .partition_where(text.as_bytes(), &mut fragments, |id, a, b| {
                    types[id as usize] == TokenType::UserDefined || !overlaps(&spans, a, b)
                });
            self.encode_fragments(text, &fragments, out);
        })
    }

    /// Runs `body` between the BOS and EOS that `add_special` and the vocabulary ask for.
    fn with_bos_eos(
        &self,
        add_special: bool,
        len: usize,
        body: impl FnOnce(&mut Vec<u32>),
    ) -> Vec<u32> {
        let mut out = Vec::with_capacity(len / 3 + 4);
        if add_special && self.vocab.add_bos {
            out.extend(self.vocab.special.bos);
        }
        body(&mut out);
        if add_special && self.vocab.add_eos {
            out.extend(self.vocab.special.eos);
        }
        out
    }

    fn encode_into(&self, text: &str, parse_special: bool, out: &mut Vec<u32>) {
        let set = if parse_special {
            &self.with_special
        } else {
            &self.always
        };
        let mut fragments = Vec::new();
        set.partition(text.as_bytes(), &mut fragments);
        self.encode_fragments(text, &fragments, out);
    }

    /// Appends the ids of partitioned `text`: matched tokens as they are, plain ranges through
    /// normalization, pre-tokenization and BPE.
    fn encode_fragments(&self, text: &str, fragments: &[Fragment], out: &mut Vec<u32>) {
        let mut scratch = Scratch::default();
        let mut words = Vec::new();
        // One lock per call; a contended or poisoned cache is simply not used.
        let mut cache = self.cache.try_lock().ok();
        for &fragment in fragments {
            let (a, b) = match fragment {
                Fragment::Token(id) => {
                    out.push(id);
                    continue;
                }
                Fragment::Text(a, b) => (a, b),
            };
            let piece = &text[a..b];
            let piece: Cow<str> = match self.normalization {
                Normalization::Nfc if is_nfc_quick(piece.chars()) != IsNormalized::Yes => {
                    Cow::Owned(piece.nfc().collect())
                }
                _ => Cow::Borrowed(piece),
            };
            words.clear();
            self.vocab.pre.split(&piece, &mut scratch, &mut words);
            let bytes = piece.as_bytes();
            for &(x, y) in &words {
                self.encode_word(&bytes[x..y], cache.as_deref_mut(), out);
            }
        }
        if let Some(c) = cache.as_deref_mut() {
            if c.len() > CACHE_MAX_ENTRIES {
                c.clear();
            }
        }
    }

    #[inline]
    fn encode_word(&self, word: &[u8], cache: Option<&mut WordCache>, out: &mut Vec<u32>) {
        let bpe = &self.vocab.bpe;
        if word.len() == 1 && bpe.byte_ids[word[0] as usize] != NO_TOKEN {
            out.push(bpe.byte_ids[word[0] as usize]);
            return;
        }
        if !self.vocab.whole_words.is_empty() {
            if let Some(&id) = self.vocab.whole_words.get(word) {
                out.push(id);
                return;
            }
        }
        match cache {
            Some(c) if word.len() <= CACHE_MAX_WORD => {
                if let Some(ids) = c.get(word) {
                    out.extend_from_slice(ids);
                    return;
                }
                let start = out.len();
                bpe.encode_word(word, out);
                c.insert(Box::from(word), Box::from(&out[start..]));
            }
            _ => bpe.encode_word(word, out),
        }
    }

    /// The bytes of `ids`, special tokens rendered as their text (so that
    /// `decode(encode(s, parse_special)) == s`). Out-of-range ids are refused with their position.
    pub fn decode(&self, ids: &[u32]) -> Result<Vec<u8>> {
        self.decode_impl(ids, false)
    }

    /// [`Tokenizer::decode`] rendering control and unknown tokens as nothing (llama.cpp's
    /// detokenize with `special = false`).
    pub fn decode_skip_special(&self, ids: &[u32]) -> Result<Vec<u8>> {
        self.decode_impl(ids, true)
    }

    fn decode_impl(&self, ids: &[u32], skip_special: bool) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(ids.len() * 4);
        for (index, &id) in ids.iter().enumerate() {
            let i = self.check(id, index)?;
            if skip_special
                && matches!(self.vocab.types[i], TokenType::Control | TokenType::Unknown)
            {
                continue;
            }
            out.extend_from_slice(self.vocab.piece(id));
        }
        Ok(out)
    }

    /// Special texts of each set, for checks: `(always matched, matched with parse_special)`.
    pub fn special_texts(&self) -> (Vec<&[u8]>, Vec<&[u8]>) {
        (
            self.always.texts().collect(),
            self.with_special.texts().collect(),
        )
    }
}

/// Non-empty `ranges` sorted by start with overlapping and touching ones joined, so that
/// [`overlaps`] can binary-search them.
fn merged(ranges: &[Range<usize>]) -> Vec<Range<usize>> {
    let mut v: Vec<Range<usize>> = ranges.iter().filter(|r| r.start < r.end).cloned().collect();
    v.sort_unstable_by_key(|r| r.start);
    let mut out: Vec<Range<usize>> = Vec::with_capacity(v.len());
    for r in v {
        match out.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => out.push(r),
        }
    }
    out
}

/// Whether `a..b` shares a byte with one of `spans` (sorted and disjoint, see [`merged`]).
fn overlaps(spans: &[Range<usize>], a: usize, b: usize) -> bool {
    // The first span ending after `a` is the only one that can reach into `a..b`.
    let k = spans.partition_point(|s| s.end <= a);
    spans.get(k).is_some_and(|s| s.start < b)
}

#[cfg(test)]
mod tests {
    use super::{merged, overlaps};

    #[test]
    #[allow(clippy::reversed_empty_ranges)] // a reversed range is one of the inputs tested
    fn merged_ranges_are_sorted_disjoint_and_non_empty() {
        assert_eq!(
            merged(&[5..9, 1..3, 3..4, 8..12, 7..7, 20..15]),
            vec![1..4, 5..12]
        );
        assert!(merged(&[]).is_empty());
    }

    #[test]
    fn overlap_needs_a_shared_byte() {
        let s = merged(&[4..6, 10..12]);
        assert!(!overlaps(&s, 0, 4));
        assert!(overlaps(&s, 0, 5));
        assert!(overlaps(&s, 5, 8));
        assert!(!overlaps(&s, 6, 10));
        assert!(overlaps(&s, 6, 11));
        assert!(overlaps(&s, 11, 30));
        assert!(!overlaps(&s, 12, 30));
        assert!(!overlaps(&[], 0, 100));
    }

    #[test]
    fn tokenizer_is_shareable_across_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<super::Tokenizer>();
    }
}
