//! The vocabulary check a draft model passes at load (issue 31): its drafts are token ids the
//! target verifies, so both must mean the same text by the same id. Compared on the GGUF
//! metadata (`tokenizer.ggml.*`), in this order, the first difference named: the tokenizer
//! type, the vocabulary sizes (at most 128 apart, as llama.cpp allows for padding), BOS and
//! EOS (ids and whether BOS is added), then each token's text over the shared range.

use minfer_gguf::Metadata;
use minfer_tokenizer::vocab::{KEY_ADD_BOS, KEY_BOS, KEY_EOS, KEY_MODEL, KEY_TOKENS};

/// Most the two vocabulary sizes may differ.
pub const VOCAB_SLACK: usize = 128;

/// `Ok` when a model with metadata `draft` may draft for one with `target`; otherwise the
/// first difference, in words.
pub fn check_vocab(target: &Metadata, draft: &Metadata) -> Result<(), String> {
    let (tm, dm) = (target.get_str(KEY_MODEL), draft.get_str(KEY_MODEL));
    if tm != dm {
        return Err(format!(
            "the tokenizer types differ: {} in the target, {} in the draft",
            shown(tm),
            shown(dm)
        ));
    }
    let (Some(tt), Some(dt)) = (
        target.get_strings(KEY_TOKENS),
        draft.get_strings(KEY_TOKENS),
    ) else {
        return Err(format!(
            "{KEY_TOKENS} is missing from the target or the draft"
        ));
    };
    let (tn, dn) = (tt.len(), dt.len());
    if tn.abs_diff(dn) > VOCAB_SLACK {
        return Err(format!(
            "the vocabularies have {tn} (target) and {dn} (draft) tokens, more than {VOCAB_SLACK} apart"
        ));
    }
    for key in [KEY_BOS, KEY_EOS] {
        let (a, b) = (target.get_u64(key), draft.get_u64(key));
        if a != b {
            return Err(format!(
                "{key} differs: {} in the target, {} in the draft",
                id(a),
                id(b)
            ));
        }
    }
    let (a, b) = (target.get_bool(KEY_ADD_BOS), draft.get_bool(KEY_ADD_BOS));
    if a.unwrap_or(false) != b.unwrap_or(false) {
        return Err(format!(
            "{KEY_ADD_BOS} differs: {a:?} in the target, {b:?} in the draft"
        ));
    }
    for i in 0..tn.min(dn) {
        let (a, b) = (tt.get(i), dt.get(i));
        if a != b {
            return Err(format!(
                "token {i} is {:?} in the target and {:?} in the draft",
                a.unwrap_or(""),
                b.unwrap_or("")
            ));
        }
    }
    Ok(())
}

fn shown(s: Option<&str>) -> String {
    s.map_or_else(|| "none".into(), |s| format!("`{s}`"))
}

fn id(v: Option<u64>) -> String {
    v.map_or_else(|| "none".into(), |v| v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use minfer_gguf::{Array, Value};

    fn md(tokens: &[&str], bos: u32, model: &str) -> Metadata {
        let mut m = Metadata::new();
        m.set(KEY_MODEL, Value::String(model.into()));
        m.set(
            KEY_TOKENS,
            Value::Array(Array::String(tokens.iter().copied().collect())),
        );
        m.set(KEY_BOS, Value::U32(bos));
        m.set(KEY_EOS, Value::U32(1));
        m
    }

    #[test]
    fn the_first_difference_is_named_and_equal_vocabularies_pass() {
        let base = ["<s>", "</s>", "a", "b", "c"];
        // Control: the same vocabulary, and one padded by a few tokens, pass.
        assert_eq!(
            check_vocab(&md(&base, 0, "gpt2"), &md(&base, 0, "gpt2")),
            Ok(())
        );
        let padded = ["<s>", "</s>", "a", "b", "c", "<pad1>", "<pad2>"];
        assert_eq!(
            check_vocab(&md(&base, 0, "gpt2"), &md(&padded, 0, "gpt2")),
            Ok(())
        );
        let e = check_vocab(&md(&base, 0, "gpt2"), &md(&base, 0, "llama")).unwrap_err();
        assert!(
            e.contains("tokenizer types") && e.contains("`llama`"),
            "{e}"
        );
        let e = check_vocab(&md(&base, 0, "gpt2"), &md(&base, 2, "gpt2")).unwrap_err();
        assert!(
            e.contains("bos_token_id") && e.contains("0 in the target"),
            "{e}"
        );
        let other = ["<s>", "</s>", "a", "x", "y"];
        let e = check_vocab(&md(&base, 0, "gpt2"), &md(&other, 0, "gpt2")).unwrap_err();
        assert_eq!(e, "token 3 is \"b\" in the target and \"x\" in the draft");
        let many: Vec<String> = (0..200).map(|i| format!("t{i}")).collect();
        let many: Vec<&str> = many.iter().map(|s| s.as_str()).collect();
        let e = check_vocab(&md(&base, 0, "gpt2"), &md(&many, 0, "gpt2")).unwrap_err();
        assert!(e.contains("5 (target) and 200 (draft)"), "{e}");
    }
}
