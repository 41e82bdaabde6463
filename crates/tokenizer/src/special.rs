//! Finding special and added tokens in text before BPE.
//!
//! Which tokens are looked for (llama.cpp's rules): user-defined tokens (type 4, e.g. Qwen's
//! `<tool_call>`) always; control and unknown tokens (types 3 and 2, e.g. `<|im_start|>`) only
//! with `parse_special`; unused tokens (type 5) never.
//!
//! How: scanning left to right, the earliest position where any of them starts wins, and of
//! the tokens starting there the longest (HF `tokenizers`' leftmost-longest rule). llama.cpp
//! instead takes tokens longest first over the whole text; the two differ only when two
//! special texts overlap (one's suffix is another's prefix), which no special text of the
//! Qwen2.5 or SmolLM2 vocabularies does (`special_texts_do_not_overlap` checks this).

use crate::vocab::{TokenType, Vocab};

/// One set of searchable tokens.
pub struct SpecialSet {
    /// `(text, id)`, longest text first.
    tokens: Vec<(Box<[u8]>, u32)>,
    /// Whether some token starts with this byte.
    first_byte: [bool; 256],
}

/// A piece of the input: plain text (a byte range) or a matched token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fragment {
    Text(usize, usize),
    Token(u32),
}

impl SpecialSet {
    pub fn new(vocab: &Vocab, parse_special: bool) -> SpecialSet {
        let mut tokens: Vec<(Box<[u8]>, u32)> = (0..vocab.len() as u32)
            .filter(|&id| match vocab.types[id as usize] {
                TokenType::UserDefined => true,
                TokenType::Control | TokenType::Unknown => parse_special,
                _ => false,
            })
            .filter(|&id| !vocab.text(id).is_empty())
            .map(|id| (Box::<[u8]>::from(vocab.text(id)), id))
            .collect();
        tokens.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        let mut first_byte = [false; 256];
        for (t, _) in &tokens {
            first_byte[t[0] as usize] = true;
        }
        SpecialSet { tokens, first_byte }
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    pub fn texts(&self) -> impl Iterator<Item = &[u8]> {
        self.tokens.iter().map(|(t, _)| &t[..])
    }

    /// Splits `text` into plain ranges and matched tokens, appending to `out`.
    pub fn partition(&self, text: &[u8], out: &mut Vec<Fragment>) {
        self.partition_where(text, out, |_, _, _| true);
    }

    /// [`SpecialSet::partition`] matching only tokens for which `allow(id, start, end)` holds,
    /// `start..end` being where the token's text would lie. A refused token's bytes stay
    /// plain text, and the scan goes on at the next byte, where a shorter token may still
    /// start (the same as if the refused token were not in the set at that position).
    pub fn partition_where(
        &self,
        text: &[u8],
        out: &mut Vec<Fragment>,
        allow: impl Fn(u32, usize, usize) -> bool,
    ) {
        let mut start = 0;
        let mut i = 0;
        if !self.tokens.is_empty() {
            while i < text.len() {
                if self.first_byte[text[i] as usize] {
                    let rest = &text[i..];
                    let found = self
                        .tokens
                        .iter()
                        .find(|(t, id)| rest.starts_with(t) && allow(*id, i, i + t.len()));
                    if let Some((t, id)) = found {
                        if start < i {
                            out.push(Fragment::Text(start, i));
                        }
                        out.push(Fragment::Token(*id));
                        i += t.len();
                        start = i;
                        continue;
                    }
                }
                i += 1;
            }
        }
        if start < text.len() {
            out.push(Fragment::Text(start, text.len()));
        }
    }
}
