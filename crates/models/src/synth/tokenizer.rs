//! The tokenizer metadata of a synthesized model: copied from a donor GGUF, or a small
//! byte-level GPT-2-style BPE (256 byte tokens, a few merges, ChatML control tokens).

use crate::arch::Arch;
use crate::error::{Error, Result};
use minfer_gguf::{Array, GgufModel, Metadata, Value};
use std::path::Path;

/// llama.cpp token types (`tokenizer.ggml.token_type`).
const TYPE_NORMAL: i32 = 1;
const TYPE_CONTROL: i32 = 3;
const TYPE_UNUSED: i32 = 5;

/// Merges of the built-in tokenizer, in rank order; each merged pair becomes a token.
/// Every piece is a byte token or the result of an earlier merge, and every merge is
/// reachable (" Hello" ends as one token, "Hello" as H + ello).
const MERGES: &[(&str, &str)] = &[
    ("Ġ", "Ġ"),
    ("ĠĠ", "ĠĠ"),
    ("i", "n"),
    ("Ġ", "t"),
    ("e", "r"),
    ("o", "n"),
    ("Ġ", "a"),
    ("r", "e"),
    ("a", "t"),
    ("s", "t"),
    ("e", "n"),
    ("o", "r"),
    ("Ġt", "h"),
    ("Ċ", "Ċ"),
    ("Ġ", "c"),
    ("l", "e"),
    ("Ġ", "s"),
    ("i", "t"),
    ("a", "n"),
    ("Ġth", "e"),
    ("Ġ", "p"),
    ("Ġ", "f"),
    ("o", "u"),
    ("Ġ", "="),
    ("i", "s"),
    ("Ġ", "w"),
    ("in", "g"),
    ("Ġ", "o"),
    ("Ġ", "i"),
    ("Ġa", "n"),
    ("Ġan", "d"),
    ("e", "l"),
    ("el", "l"),
    ("Ġ", "H"),
    ("ĠH", "ell"),
    ("ell", "o"),
    ("ĠHell", "o"),
];

/// Control tokens appended after the merges: (text, role).
const CONTROL: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

/// ChatML, as Qwen and SmolLM2 use it.
const CHAT_TEMPLATE: &str = "{%- for message in messages %}\
{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}\
{%- endfor %}\
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

/// GPT-2's reversible byte → printable character map: printable Latin-1 bytes map to
/// themselves, the other 68 bytes to U+0100.. in byte order.
pub fn byte_to_unicode() -> [char; 256] {
    let printable = |b: u32| (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || b >= 0xae;
    let mut map = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..256u32 {
        let c = if printable(b) {
            b
        } else {
            next += 1;
            next - 1
        };
        map[b as usize] = char::from_u32(c).expect("U+0021..U+0143 are chars");
    }
    map
}

/// Number of tokens of the built-in tokenizer before padding.
pub fn builtin_vocab_len() -> usize {
    256 + MERGES.len() + CONTROL.len()
}

/// The built-in tokenizer's `tokenizer.*` keys, padded with unused `[PAD{id}]` tokens to
/// `vocab` entries (as Qwen's own files pad theirs).
pub fn builtin(arch: Arch, vocab: usize) -> Result<Metadata> {
    let base = builtin_vocab_len();
    if vocab < base {
        return Err(Error::BadSpec(
            "vocab".into(),
            format!("{vocab} is smaller than the built-in tokenizer's {base} tokens"),
        ));
    }
    let mut tokens: Vec<String> = byte_to_unicode().iter().map(|c| c.to_string()).collect();
    let mut types = vec![TYPE_NORMAL; 256];
    let mut merges = Vec::with_capacity(MERGES.len());
    for (a, b) in MERGES {
        debug_assert!(tokens.iter().any(|t| t == a) && tokens.iter().any(|t| t == b));
        merges.push(format!("{a} {b}"));
        tokens.push(format!("{a}{b}"));
        types.push(TYPE_NORMAL);
    }
    let first_control = tokens.len();
    for c in CONTROL {
        tokens.push(c.to_string());
        types.push(TYPE_CONTROL);
    }
    for id in tokens.len()..vocab {
        tokens.push(format!("[PAD{id}]"));
        types.push(TYPE_UNUSED);
    }
    let (endoftext, im_end) = (first_control as u32, first_control as u32 + 2);
    let pre = match arch {
        Arch::Qwen2 | Arch::Qwen3 => "qwen2",
        Arch::Llama => "smollm",
    };
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
    md.set("tokenizer.ggml.bos_token_id", Value::U32(endoftext));
    md.set("tokenizer.ggml.eos_token_id", Value::U32(im_end));
    md.set("tokenizer.ggml.padding_token_id", Value::U32(endoftext));
    md.set("tokenizer.ggml.add_bos_token", Value::Bool(false));
    md.set(
        "tokenizer.chat_template",
        Value::String(CHAT_TEMPLATE.into()),
    );
    Ok(md)
}

/// Every `tokenizer.*` key of a donor GGUF, verbatim and in file order.
pub fn from_donor(path: &Path) -> Result<Metadata> {
    let donor = GgufModel::open(path)?;
    let mut md = Metadata::new();
    for (k, v) in donor.metadata().iter() {
        if k.starts_with("tokenizer.") {
            md.set(k, v.clone());
        }
    }
    if md.get_array("tokenizer.ggml.tokens").is_none() {
        return Err(Error::MissingKey(format!(
            "tokenizer.ggml.tokens in donor {}",
            path.display()
        )));
    }
    Ok(md)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_map_matches_gpt2_at_known_points() {
        // Facts of GPT-2's bytes_to_unicode: space → 'Ġ' (U+0120), '\n' → 'Ċ' (U+010A),
        // byte 0 → U+0100, 'A' → 'A', 0xAD (soft hyphen) → U+0143 (the last remapped byte).
        let m = byte_to_unicode();
        assert_eq!(m[b' ' as usize], 'Ġ');
        assert_eq!(m[b'\n' as usize], 'Ċ');
        assert_eq!(m[0], '\u{100}');
        assert_eq!(m[b'A' as usize], 'A');
        assert_eq!(m[0xad], '\u{143}');
        let mut seen: Vec<char> = m.to_vec();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), 256, "the map is a bijection");
    }

    #[test]
    fn builtin_tokens_are_unique_and_merges_resolve() {
        let md = builtin(Arch::Qwen2, 400).unwrap();
        let Some(Array::String(tokens)) = md.get_array("tokenizer.ggml.tokens") else {
            panic!("tokens missing")
        };
        let tokens = tokens.to_vec();
        assert_eq!(tokens.len(), 400);
        let mut sorted = tokens.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), 400, "duplicate token text");
        for (a, b) in MERGES {
            assert!(tokens.contains(&a.to_string()) && tokens.contains(&b.to_string()));
        }
        assert_eq!(md.get_str("tokenizer.ggml.pre"), Some("qwen2"));
        assert!(builtin(Arch::Llama, builtin_vocab_len() - 1).is_err());
    }
}
