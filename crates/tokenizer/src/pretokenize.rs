//! Pre-tokenizers: split text into words before BPE, as llama.cpp does for each
//! `tokenizer.ggml.pre` rule. The rules are regexes with lookahead (`\s+(?!\S)`), so they are
//! hand-written here as scanners over code points, one per regex, following llama.cpp's own
//! hand-written splitters position by position (that, not the regex, is the reference):
//!
//! - `qwen2`: `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
//! - `llama-bpe` (Llama 3): the same with `\p{N}{1,3}`; words that are whole vocabulary entries
//!   skip the merges (`ignore_merges`).
//! - `smollm`: first every `\p{N}` is isolated, then each piece between them is split with
//!   GPT-2's `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.
//!
//! A split never looks past the end of the piece it is given: the lookahead at a piece's end
//! sees "nothing", as in llama.cpp.

use crate::unicode::{flags, LETTER_FLAG as L, NUMBER_FLAG as N, WHITESPACE_FLAG as W};

/// The pre-tokenizer rule of a vocabulary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreTokenizer {
    /// `qwen2` and its aliases: single digits.
    Qwen2,
    /// `llama-bpe` (Llama 3): digits in groups of up to three, merges skipped for whole-token words.
    Llama3,
    /// `smollm`: isolated digits, then GPT-2's rule.
    SmolLm,
}

impl PreTokenizer {
    /// The rule for a `tokenizer.ggml.pre` value, `None` when unknown.
    pub fn from_name(name: &str) -> Option<PreTokenizer> {
        match name {
            "qwen2" | "deepseek-r1-qwen" => Some(PreTokenizer::Qwen2),
            "llama-bpe" | "llama3" | "llama-v3" => Some(PreTokenizer::Llama3),
            "smollm" => Some(PreTokenizer::SmolLm),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            PreTokenizer::Qwen2 => "qwen2",
            PreTokenizer::Llama3 => "llama-bpe",
            PreTokenizer::SmolLm => "smollm",
        }
    }

    /// Whether a word that is itself a vocabulary entry bypasses the merges (llama.cpp's
    /// `ignore_merges`, set for Llama 3).
    pub fn ignores_merges(self) -> bool {
        self == PreTokenizer::Llama3
    }

    /// Whether the model adds BOS when the GGUF has no `add_bos_token` key.
    pub fn default_add_bos(self) -> bool {
        self == PreTokenizer::Llama3
    }

    /// Splits `text` into words, appending their byte ranges `(start, end)` to `out`.
    /// `scratch` is reused between calls.
    pub fn split(self, text: &str, scratch: &mut Scratch, out: &mut Vec<(usize, usize)>) {
        scratch.cps.clear();
        scratch.offsets.clear();
        scratch.ends.clear();
        for (i, c) in text.char_indices() {
            scratch.offsets.push(i);
            scratch.cps.push(Cp {
                c: c as u32,
                f: flags(c),
            });
        }
        scratch.offsets.push(text.len());
        let cps = &scratch.cps;
        let ends = &mut scratch.ends;
        match self {
            PreTokenizer::Qwen2 => split_llama3(cps, 0, 1, ends),
            PreTokenizer::Llama3 => split_llama3(cps, 0, 3, ends),
            PreTokenizer::SmolLm => {
                let mut start = 0;
                for (i, cp) in cps.iter().enumerate() {
                    if cp.f & N != 0 {
                        split_gpt2(&cps[start..i], start, ends);
                        ends.push(i + 1);
                        start = i + 1;
                    }
                }
                split_gpt2(&cps[start..], start, ends);
            }
        }
        let mut prev = 0usize;
        for &e in ends.iter() {
            out.push((scratch.offsets[prev], scratch.offsets[e]));
            prev = e;
        }
    }
}

/// Buffers a split reuses.
#[derive(Default)]
pub struct Scratch {
    cps: Vec<Cp>,
    /// Byte offset of each code point, then the text length.
    offsets: Vec<usize>,
    /// Word ends as code point indexes.
    ends: Vec<usize>,
}

#[derive(Clone, Copy)]
struct Cp {
    c: u32,
    f: u8,
}

const CR: u32 = '\r' as u32;
const LF: u32 = '\n' as u32;
const SPACE: u32 = ' ' as u32;
const QUOTE: u32 = '\'' as u32;

#[inline]
fn lower_ascii(c: u32) -> u32 {
    if (b'A' as u32..=b'Z' as u32).contains(&c) {
        c + 32
    } else {
        c
    }
}

/// Length of a contraction (`'s 't 'm 'd` = 2, `'re 've 'll` = 3) at `pos`, or 0.
#[inline]
fn contraction(s: &[Cp], pos: usize, fold: fn(u32) -> u32) -> usize {
    let n = s.len();
    if s[pos].c != QUOTE || pos + 1 >= n {
        return 0;
    }
    let a = fold(s[pos + 1].c);
    if [b's', b't', b'm', b'd'].iter().any(|&x| a == x as u32) {
        return 2;
    }
    if pos + 2 < n {
        let b = fold(s[pos + 2].c);
        let pair = |x: u8, y: u8| a == x as u32 && b == y as u32;
        if pair(b'r', b'e') || pair(b'v', b'e') || pair(b'l', b'l') {
            return 3;
        }
    }
    0
}

/// The Qwen2 / Llama 3 scanner over one piece; `digits` is the longest number run (1 or 3).
/// Pushes word end positions (code point indexes, offset by `base`).
fn split_llama3(s: &[Cp], base: usize, digits: usize, ends: &mut Vec<usize>) {
    let n = s.len();
    let fl = |i: usize| if i < n { s[i].f } else { 0 };
    let cp = |i: usize| if i < n { s[i].c } else { u32::MAX };
    let mut pos = 0;
    let push = |end: usize, ends: &mut Vec<usize>| ends.push(base + end);
    while pos < n {
        let c = s[pos].c;
        let f = s[pos].f;
        // (?i:'s|'t|'re|'ve|'m|'ll|'d)
        let k = contraction(s, pos, lower_ascii);
        if k > 0 {
            pos += k;
            push(pos, ends);
            continue;
        }
        // [^\r\n\p{L}\p{N}]?\p{L}+
        if !(c == CR || c == LF || f & N != 0) && (f & L != 0 || fl(pos + 1) & L != 0) {
            pos += 1;
            while fl(pos) & L != 0 {
                pos += 1;
            }
            push(pos, ends);
            continue;
        }
        // \p{N}{1,digits}
        if f & N != 0 {
            let mut run = 0;
            while fl(pos) & N != 0 && run < digits {
                pos += 1;
                run += 1;
            }
            push(pos, ends);
            continue;
        }
        // ' '?[^\s\p{L}\p{N}]+[\r\n]*   (a space at the piece's end also lands here)
        let f2 = if c == SPACE { fl(pos + 1) } else { f };
        if f2 & (W | L | N) == 0 {
            if c == SPACE {
                pos += 1;
            }
            while pos < n && fl(pos) & (W | L | N) == 0 {
                pos += 1;
            }
            while cp(pos) == CR || cp(pos) == LF {
                pos += 1;
            }
            push(pos, ends);
            continue;
        }
        // \s*[\r\n]+ | \s+(?!\S) | \s+
        let mut nws = 0;
        let mut last_newline_end = 0;
        while fl(pos + nws) & W != 0 {
            let c2 = cp(pos + nws);
            if c2 == CR || c2 == LF {
                last_newline_end = pos + nws + 1;
            }
            nws += 1;
        }
        if last_newline_end > 0 {
            pos = last_newline_end;
        } else if nws > 1 && pos + nws < n {
            pos += nws - 1;
        } else if nws > 0 {
            pos += nws;
        } else {
            pos += 1;
        }
        push(pos, ends);
    }
}

/// GPT-2's scanner over one piece (case-sensitive contractions, ` ?` prefixes).
fn split_gpt2(s: &[Cp], base: usize, ends: &mut Vec<usize>) {
    let n = s.len();
    let fl = |i: usize| if i < n { s[i].f } else { 0 };
    let mut pos = 0;
    let push = |end: usize, ends: &mut Vec<usize>| ends.push(base + end);
    while pos < n {
        let c = s[pos].c;
        let k = contraction(s, pos, |c| c);
        if k > 0 {
            pos += k;
            push(pos, ends);
            continue;
        }
        let lead = usize::from(c == SPACE);
        let f2 = fl(pos + lead);
        let in_range = pos + lead < n;
        // ' '?\p{L}+  |  ' '?\p{N}+  |  ' '?[^\s\p{L}\p{N}]+
        let class = if f2 & L != 0 {
            Some(L)
        } else if f2 & N != 0 {
            Some(N)
        } else if f2 & (W | L | N) == 0 && in_range {
            Some(0)
        } else {
            None
        };
        if let Some(class) = class {
            pos += lead;
            if class == 0 {
                while pos < n && fl(pos) & (W | L | N) == 0 {
                    pos += 1;
                }
            } else {
                while fl(pos) & class != 0 {
                    pos += 1;
                }
            }
            push(pos, ends);
            continue;
        }
        // \s+(?!\S) | \s+
        let mut nws = 0;
        while fl(pos + nws) & W != 0 {
            nws += 1;
        }
        if nws > 1 && pos + nws < n {
            pos += nws - 1;
        } else if nws > 0 {
            pos += nws;
        } else {
            pos += 1;
        }
        push(pos, ends);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(pre: PreTokenizer, text: &str) -> Vec<&str> {
        let mut out = Vec::new();
        pre.split(text, &mut Scratch::default(), &mut out);
        out.iter().map(|&(a, b)| &text[a..b]).collect()
    }

    #[test]
    fn qwen2_words() {
        let q = PreTokenizer::Qwen2;
        assert_eq!(words(q, "Hello world"), ["Hello", " world"]);
        assert_eq!(words(q, "I'M here"), ["I", "'M", " here"]);
        assert_eq!(
            words(q, "x = 12345;"),
            ["x", " =", " ", "1", "2", "3", "4", "5", ";"]
        );
        assert_eq!(words(q, "a  b"), ["a", " ", " b"]);
        assert_eq!(words(q, "a   \n\n b"), ["a", "   \n\n", " b"]);
        assert_eq!(words(q, "end   "), ["end", "   "]);
        assert_eq!(words(q, "(x)\n\ny"), ["(x", ")\n\n", "y"]);
        assert_eq!(words(q, "\tfoo"), ["\tfoo"]);
        assert_eq!(words(q, ""), Vec::<&str>::new());
    }

    #[test]
    fn llama3_groups_digits_by_three() {
        let l = PreTokenizer::Llama3;
        assert_eq!(words(l, "1234567"), ["123", "456", "7"]);
        assert_eq!(words(l, "x 12"), ["x", " ", "12"]);
    }

    #[test]
    fn smollm_isolates_digits_then_gpt2() {
        let s = PreTokenizer::SmolLm;
        assert_eq!(
            words(s, "Hello world! 123"),
            ["Hello", " world", "!", " ", "1", "2", "3"]
        );
        // the lookahead stops at a digit, which is a piece boundary
        assert_eq!(words(s, "a  1"), ["a", "  ", "1"]);
        assert_eq!(words(s, "a  b"), ["a", " ", " b"]);
        assert_eq!(words(s, "I'M it's"), ["I", "'", "M", " it", "'s"]);
    }
}
