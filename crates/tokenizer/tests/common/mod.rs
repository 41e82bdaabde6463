//! Shared test helpers: locating the real models and reading oracle fixtures.

#![allow(dead_code)]

use minfer_testkit::models;
use minfer_tokenizer::Tokenizer;
use std::path::Path;

/// The tokenizer of a cached model, or `None` (after printing SKIP) when the model is absent.
pub fn load(name: &str) -> Option<Tokenizer> {
    let path = models::find(name)?;
    let file = minfer_gguf::GgufFile::open(&path).expect("open model");
    Some(Tokenizer::from_metadata(&file.header().metadata).expect("build tokenizer"))
}

pub struct Row {
    pub i: u64,
    pub category: String,
    pub text: String,
    pub ids: Vec<u32>,
    pub ids_parse_special: Option<Vec<u32>>,
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("ids array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// Rows of `tests/fixtures/<name>`.
pub fn fixture(name: &str) -> Vec<Row> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    let text = std::fs::read_to_string(&path).expect("read fixture");
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("json line");
            Row {
                i: v["i"].as_u64().expect("i"),
                category: v["category"].as_str().unwrap_or("").to_string(),
                text: v["text"].as_str().expect("text").to_string(),
                ids: ids(&v["ids"]),
                ids_parse_special: v.get("ids_parse_special").map(ids),
            }
        })
        .collect()
}

/// A tiny byte-level vocabulary as GGUF metadata: the 256 byte tokens, a few merges, a
/// control token `<|s|>` (BOS and EOS), a user-defined `<u>` and an unused `[PAD]`.
pub fn synthetic_metadata(pre: &str) -> minfer_gguf::Metadata {
    use minfer_gguf::{Array, Metadata, Value};
    use minfer_tokenizer::unicode::BYTE_TO_CHAR;
    let mut tokens: Vec<String> = BYTE_TO_CHAR.iter().map(|c| c.to_string()).collect();
    let mut types = vec![1i32; 256];
    let merges: Vec<String> = [
        "h e", "l l", "he ll", "hell o", "Ġ w", "Ġw o", "o r", "Ġwo r", "1 2",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for m in &merges {
        tokens.push(m.replace(' ', ""));
        types.push(1);
    }
    for (t, ty) in [("<|s|>", 3), ("<u>", 4), ("[PAD]", 5)] {
        tokens.push(t.to_string());
        types.push(ty);
    }
    let mut md = Metadata::new();
    md.set("tokenizer.ggml.model", Value::String("gpt2".into()));
    md.set("tokenizer.ggml.pre", Value::String(pre.into()));
    md.set(
        "tokenizer.ggml.tokens",
        Value::Array(Array::String(tokens.into())),
    );
    md.set("tokenizer.ggml.token_type", Value::Array(Array::I32(types)));
    md.set(
        "tokenizer.ggml.merges",
        Value::Array(Array::String(merges.into())),
    );
    md.set("tokenizer.ggml.eos_token_id", Value::U32(256 + 9));
    md.set("tokenizer.ggml.bos_token_id", Value::U32(256 + 9));
    md
}

/// The kit's seeded xorshift64* generator, with the fuzzers' text draws.
pub struct Rng(minfer_testkit::rng::Rng);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(minfer_testkit::rng::Rng::xorshift64star(seed))
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.0.next_u64() % n
    }

    /// A random character drawn from pools that stress the splitters: ASCII letters, digits,
    /// punctuation, whitespace incl. CR/LF, apostrophes, Latin-1, combining marks, CJK,
    /// Hangul, emoji, special-token pieces, and any Unicode scalar value.
    pub fn char(&mut self) -> char {
        let pools: &[&str] = &[
            "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
            "0123456789",
            "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
            " \t\n\r\u{a0}\u{3000}\u{2028}\u{85}\u{b}\u{c}",
            "'sStTrReEvVlLmMdD",
            "éèêëçñöüßÅØæœÿ",
            "\u{301}\u{308}\u{30a}\u{323}\u{653}",
            "中文字符测试東京日本語",
            "한국어가나다\u{1100}\u{1161}\u{11a8}",
            "😀🙂👍🏽👨‍👩‍👧🇫🇷",
            "<|>/_imstartendtool_call",
        ];
        let k = self.below(pools.len() as u64 + 1) as usize;
        if k == pools.len() {
            loop {
                if let Some(c) = char::from_u32(self.below(0x11_0000) as u32) {
                    return c;
                }
            }
        }
        let chars: Vec<char> = pools[k].chars().collect();
        chars[self.below(chars.len() as u64) as usize]
    }

    pub fn string(&mut self, max_len: u64) -> String {
        let n = self.below(max_len + 1);
        let mut s: String = (0..n).map(|_| self.char()).collect();
        // Sometimes splice in whole special-token texts.
        if self.below(4) == 0 {
            let specials = [
                "<|im_start|>",
                "<tool_call>",
                "<|s|>",
                "<u>",
                "[PAD]",
                "<|endoftext|>",
            ];
            let at = s
                .char_indices()
                .map(|(i, _)| i)
                .nth(self.below(n + 1) as usize)
                .unwrap_or(s.len());
            s.insert_str(at, specials[self.below(specials.len() as u64) as usize]);
        }
        s
    }
}
