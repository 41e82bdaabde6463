//! The tokenizer of a checkpoint as GGUF metadata, by llama.cpp's rules for GPT-2-style
//! BPE vocabularies (convert_hf_to_gguf.py's `_set_vocab_gpt2` and gguf-py's
//! `SpecialVocab`):
//! - tokens by id up to the config's `vocab_size`, holes filled with `[PAD{id}]` (UNUSED);
//!   added tokens are CONTROL when marked special or shaped like `<|…|>`, else USER_DEFINED;
//! - `tokenizer.ggml.pre` names the pre-tokenizer whose hash matches: llama.cpp encodes a
//!   fixed check text and looks the SHA-256 of the id list up in a table; we encode the same
//!   text with minfer's tokenizer under each pre-tokenizer it implements and take the one
//!   whose table hash comes out (so a name is only written when our encoding is the
//!   reference's, id for id);
//! - merges from tokenizer.json (pairs joined by a space, spaces inside a part as U+0120);
//! - special ids from tokenizer_config.json's `{bos,eos,…}_token` (looked up among the added
//!   tokens), then config.json's `{…}_token_id`; `add_{…}_token` booleans; the chat template.

use super::ConvertError;
use minfer_gguf::{Array, Metadata, Value};
use minfer_tokenizer::{Normalization, Tokenizer};
use serde_json::Value as Json;
use sha2::{Digest, Sha256};
use std::path::Path;

/// llama.cpp's check text for the pre-tokenizer hash (convert_hf_to_gguf.py, `chktxt`).
const CHECK_TEXT: &str =
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u{200d}🌫️ (multiple emojis concatenated) ✅ 🦙🦙 3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ ------======= нещо на Български ''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, 'RE you sure? 'M not sure I'll make it, 'D you like some tea? We'Ve a'lL";

/// Hashes of llama.cpp's table (conversion/base.py, get_vocab_base_pre) for the
/// pre-tokenizers minfer's tokenizer implements.
const PRE_HASHES: &[(&str, &str)] = &[
    (
        "qwen2",
        "e636dc30a262dcc0d8c323492e32ae2b70728f4df7dfe9737d9f920a282b8aea",
    ),
    (
        "qwen2",
        "d4540891389ea895b53b399da6ac824becc30f2fba0e9ddbb98f92e55ca0e97c",
    ),
    (
        "llama-bpe",
        "0ef9807a4087ebef797fc749390439009c3b9eda9ad1a097abbe738f486c01e5",
    ),
    (
        "smollm",
        "855059429035d75a914d1eda9f10a876752e281a054a7a3d421ef0533e5b6249",
    ),
];

/// gguf-py's special token types, in its order, with their GGUF keys.
const SPECIAL: &[(&str, &str)] = &[
    ("bos", "tokenizer.ggml.bos_token_id"),
    ("eos", "tokenizer.ggml.eos_token_id"),
    ("unk", "tokenizer.ggml.unknown_token_id"),
    ("sep", "tokenizer.ggml.seperator_token_id"),
    ("pad", "tokenizer.ggml.padding_token_id"),
    ("cls", "tokenizer.ggml.cls_token_id"),
    ("mask", "tokenizer.ggml.mask_token_id"),
];

const NORMAL: i32 = 1;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const UNUSED: i32 = 5;

fn bad(why: impl Into<String>) -> ConvertError {
    ConvertError::Tokenizer { why: why.into() }
}

fn looks_special(t: &str) -> bool {
    matches!(t, "<pad>" | "<mask>" | "<2mass>" | "[@BOS@]")
        || (t.starts_with("<|") && t.ends_with("|>"))
        || (t.starts_with("<｜") && t.ends_with("｜>"))
        || (t.starts_with("<unused") && t.ends_with('>'))
}

/// Reads a JSON file, refusing a missing one by name.
pub fn read_json(path: &Path, what: &'static str) -> Result<Json, ConvertError> {
    let text = std::fs::read_to_string(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => ConvertError::MissingFile {
            path: path.into(),
            what,
        },
        _ => ConvertError::Io {
            path: path.into(),
            source: e,
        },
    })?;
    serde_json::from_str(&text).map_err(|e| ConvertError::Config {
        path: path.into(),
        why: format!("not JSON: {e}"),
    })
}

/// Appends the `tokenizer.*` keys for the checkpoint in `dir` to `md`.
/// Returns notes for the user (what was not found and so not written).
pub fn add_vocab(
    md: &mut Metadata,
    dir: &Path,
    config: &Json,
) -> Result<Vec<String>, ConvertError> {
    let tj = read_json(
        &dir.join("tokenizer.json"),
        "the tokenizer (tokenizer.json)",
    )?;
    let tc = read_json(
        &dir.join("tokenizer_config.json"),
        "the tokenizer settings and chat template (tokenizer_config.json)",
    )?;
    let model = &tj["model"];
    if model["type"].as_str() != Some("BPE") {
        return Err(bad(format!(
            "tokenizer.json model type {} is not supported (BPE only; SentencePiece tokenizers are not converted yet)",
            model["type"]
        )));
    }
    if tj["post_processor"]["type"].as_str() == Some("TemplateProcessing") {
        return Err(bad(
            "tokenizer.json's TemplateProcessing post-processor (BOS/EOS insertion) is not converted yet",
        ));
    }
    let normalization = match tj["normalizer"]["type"].as_str() {
        None => Normalization::None,
        Some("NFC") => Normalization::Nfc,
        Some(other) => {
            return Err(bad(format!(
                "normalizer {other} is not supported (NFC or none)"
            )))
        }
    };
    let vocab = model["vocab"]
        .as_object()
        .ok_or_else(|| bad("tokenizer.json has no model.vocab"))?;
    let mut by_id: std::collections::BTreeMap<u64, (String, i32)> = Default::default();
    for (t, id) in vocab {
        let id = id
            .as_u64()
            .ok_or_else(|| bad(format!("token {t:?}: id is not a number")))?;
        by_id.insert(id, (t.clone(), NORMAL));
    }
    let added = tj["added_tokens"].as_array().cloned().unwrap_or_default();
    for a in &added {
        let (Some(t), Some(id)) = (a["content"].as_str(), a["id"].as_u64()) else {
            return Err(bad(format!("added token without content or id: {a}")));
        };
        let special = a["special"].as_bool().unwrap_or(false) || looks_special(t);
        by_id.insert(id, (t.into(), if special { CONTROL } else { USER_DEFINED }));
    }
    let max_id = by_id.keys().next_back().copied().unwrap_or(0);
    let n_vocab = match config.get("vocab_size").and_then(|v| v.as_u64()) {
        Some(n) => n,
        None => by_id.len() as u64,
    };
    if max_id >= n_vocab {
        return Err(bad(format!(
            "token id {max_id} is not below config.json's vocab_size {n_vocab}"
        )));
    }
    let mut tokens = Vec::with_capacity(n_vocab as usize);
    let mut types = Vec::with_capacity(n_vocab as usize);
    for i in 0..n_vocab {
        match by_id.remove(&i) {
            Some((t, ty)) => {
                tokens.push(t);
                types.push(ty);
            }
            None => {
                tokens.push(format!("[PAD{i}]"));
                types.push(UNUSED);
            }
        }
    }
    let merges = merges(model)?;
    let pre = pre_tokenizer(&tokens, &types, &merges, normalization)?;

    md.set("tokenizer.ggml.model", Value::String("gpt2".into()));
    md.set("tokenizer.ggml.pre", Value::String(pre.into()));
    md.set(
        "tokenizer.ggml.tokens",
        Value::Array(Array::String(tokens.clone().into())),
    );
    md.set("tokenizer.ggml.token_type", Value::Array(Array::I32(types)));
    if !merges.is_empty() {
        md.set(
            "tokenizer.ggml.merges",
            Value::Array(Array::String(merges.into())),
        );
    }
    // Special ids: tokenizer_config.json first, then config.json; the first one set wins.
    let mut ids: Vec<(&str, u32)> = Vec::new();
    let set = |typ: &'static str, id: Option<u64>, ids: &mut Vec<(&str, u32)>| {
        if let Some(id) = id.filter(|&i| i < n_vocab) {
            if !ids.iter().any(|(t, _)| *t == typ) {
                ids.push((typ, id as u32));
            }
        }
    };
    for (typ, _) in SPECIAL {
        let entry = &tc[format!("{typ}_token")];
        let content = entry.as_str().or_else(|| entry["content"].as_str());
        let id = content.and_then(|c| {
            added
                .iter()
                .find(|a| a["content"].as_str() == Some(c))
                .and_then(|a| a["id"].as_u64())
        });
        set(typ, id, &mut ids);
    }
    for (typ, _) in SPECIAL {
        set(typ, config[format!("{typ}_token_id")].as_u64(), &mut ids);
    }
    for (typ, id) in ids {
        let key = SPECIAL
            .iter()
            .find(|(t, _)| *t == typ)
            .expect("known type")
            .1;
        md.set(key, Value::U32(id));
    }
    for (typ, _) in SPECIAL {
        if let Some(b) = tc[format!("add_{typ}_token")].as_bool() {
            md.set(format!("tokenizer.ggml.add_{typ}_token"), Value::Bool(b));
        }
    }
    let mut notes = Vec::new();
    match chat_template(dir, &tc)? {
        Some(t) => md.set("tokenizer.chat_template", Value::String(t)),
        None => notes.push(format!(
            "no chat template in {} (tokenizer_config.json, chat_template.jinja): none written",
            dir.display()
        )),
    }
    Ok(notes)
}

fn merges(model: &Json) -> Result<Vec<String>, ConvertError> {
    let Some(list) = model["merges"].as_array() else {
        return Ok(Vec::new());
    };
    list.iter()
        .map(|m| match m {
            Json::String(s) => Ok(s.clone()),
            Json::Array(pair) if pair.len() == 2 => {
                let part = |p: &Json| {
                    p.as_str()
                        .map(|s| s.replace(' ', "\u{120}"))
                        .ok_or_else(|| bad(format!("merge {m}: not a pair of strings")))
                };
                Ok(format!("{} {}", part(&pair[0])?, part(&pair[1])?))
            }
            other => Err(bad(format!("merge {other}: unknown format"))),
        })
        .collect()
}

fn chat_template(dir: &Path, tc: &Json) -> Result<Option<String>, ConvertError> {
    match &tc["chat_template"] {
        Json::String(s) => return Ok(Some(s.clone())),
        Json::Null => {}
        other => {
            return Err(bad(format!(
                "tokenizer_config.json chat_template of type {} is not supported (a string)",
                match other {
                    Json::Array(_) => "list (named templates)",
                    _ => "other",
                }
            )))
        }
    }
    let jinja = dir.join("chat_template.jinja");
    if jinja.is_file() {
        return std::fs::read_to_string(&jinja)
            .map(Some)
            .map_err(|e| ConvertError::Io {
                path: jinja,
                source: e,
            });
    }
    let json = dir.join("chat_template.json");
    if json.is_file() {
        return Ok(read_json(&json, "the chat template")?["chat_template"]
            .as_str()
            .map(String::from));
    }
    Ok(None)
}

/// Python's `str()` of a list of ints, hashed: llama.cpp's `chkhsh`.
fn ids_hash(ids: &[u32]) -> String {
    let text = format!(
        "[{}]",
        ids.iter()
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The pre-tokenizer name whose llama.cpp hash our encoding of the check text produces.
fn pre_tokenizer(
    tokens: &[String],
    types: &[i32],
    merges: &[String],
    normalization: Normalization,
) -> Result<&'static str, ConvertError> {
    let mut md = Metadata::new();
    md.set("tokenizer.ggml.model", Value::String("gpt2".into()));
    md.set(
        "tokenizer.ggml.tokens",
        Value::Array(Array::String(tokens.to_vec().into())),
    );
    md.set(
        "tokenizer.ggml.token_type",
        Value::Array(Array::I32(types.to_vec())),
    );
    md.set(
        "tokenizer.ggml.merges",
        Value::Array(Array::String(merges.to_vec().into())),
    );
    let mut seen = Vec::new();
    let mut names: Vec<&str> = PRE_HASHES.iter().map(|(n, _)| *n).collect();
    names.dedup();
    for name in names {
        md.set("tokenizer.ggml.pre", Value::String(name.into()));
        let Ok(tok) = Tokenizer::from_metadata(&md) else {
            continue;
        };
        let hash = ids_hash(
            &tok.with_normalization(normalization)
                .encode(CHECK_TEXT, true),
        );
        if PRE_HASHES.iter().any(|(n, h)| *n == name && *h == hash) {
            return Ok(name);
        }
        seen.push(format!("{name}: {hash}"));
    }
    Err(bad(format!(
        "the BPE pre-tokenizer is not one minfer knows: the check text's hash matches none of \
         llama.cpp's table entries for qwen2, llama-bpe or smollm ({})",
        seen.join("; ")
    )))
}
