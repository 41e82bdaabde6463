//! Loading refusals and the special-token rules, on a synthetic vocabulary (always runs).

mod common;

use common::synthetic_metadata;
use minfer_gguf::{Array, Value};
use minfer_tokenizer::{Error, PreTokenizer, Tokenizer};

fn build(md: &minfer_gguf::Metadata) -> Result<Tokenizer, Error> {
    Tokenizer::from_metadata(md)
}

#[test]
fn synthetic_vocabulary_encodes_with_merges() {
    let tok = build(&synthetic_metadata("qwen2")).unwrap();
    assert_eq!(tok.pre_tokenizer(), PreTokenizer::Qwen2);
    let ids = tok.encode("hello world", false);
    // "hello" and " wor" are merged tokens (256 + 3 and 256 + 7); byte b is token b.
    assert_eq!(ids, vec![256 + 3, 256 + 7, b'l' as u32, b'd' as u32]);
    assert_eq!(tok.decode(&ids).unwrap(), b"hello world");
    assert!(tok.is_eog(256 + 9));
    assert!(!tok.add_bos());
}

#[test]
fn refuses_other_model_types() {
    let mut md = synthetic_metadata("qwen2");
    md.set("tokenizer.ggml.model", Value::String("llama".into()));
    let e = build(&md).unwrap_err();
    assert!(
        matches!(e, Error::UnsupportedModel { ref model } if model == "llama"),
        "{e}"
    );
}

#[test]
fn refuses_unknown_or_missing_pre_tokenizer() {
    let e = build(&synthetic_metadata("gpt-9")).unwrap_err();
    assert!(e.to_string().contains("\"gpt-9\""), "{e}");
    let mut md = synthetic_metadata("qwen2");
    md.remove("tokenizer.ggml.pre");
    assert!(matches!(
        build(&md).unwrap_err(),
        Error::MissingPreTokenizer
    ));
}

#[test]
fn accepts_the_aliases() {
    for (name, rule) in [
        ("deepseek-r1-qwen", PreTokenizer::Qwen2),
        ("llama-bpe", PreTokenizer::Llama3),
        ("smollm", PreTokenizer::SmolLm),
    ] {
        let tok = build(&synthetic_metadata(name)).unwrap();
        assert_eq!(tok.pre_tokenizer(), rule);
    }
}

#[test]
fn llama_bpe_defaults_to_adding_bos_and_needs_a_bos_id() {
    let mut md = synthetic_metadata("llama-bpe");
    md.remove("tokenizer.ggml.bos_token_id");
    assert!(matches!(build(&md).unwrap_err(), Error::MissingKey { key } if key.contains("bos")));
    let md = synthetic_metadata("llama-bpe");
    let tok = build(&md).unwrap();
    assert!(tok.add_bos());
    assert_eq!(
        tok.encode_prompt("hello", true, false),
        vec![256 + 9, 256 + 3]
    );
    // ignore_merges: a word that is a whole token is taken as is.
    assert_eq!(tok.encode("hello", false), vec![256 + 3]);
}

#[test]
fn refuses_empty_merges() {
    let mut md = synthetic_metadata("qwen2");
    md.set(
        "tokenizer.ggml.merges",
        Value::Array(Array::String(Vec::<String>::new().into())),
    );
    assert!(matches!(build(&md).unwrap_err(), Error::EmptyMerges));
}

#[test]
fn refuses_a_missing_byte_token_by_name() {
    let mut md = synthetic_metadata("qwen2");
    let Some(Value::Array(Array::String(tokens))) = md.get("tokenizer.ggml.tokens").cloned() else {
        panic!()
    };
    let mut tokens = tokens.to_vec();
    tokens[b'a' as usize] = "not-a".into();
    md.set(
        "tokenizer.ggml.tokens",
        Value::Array(Array::String(tokens.into())),
    );
    let e = build(&md).unwrap_err();
    assert!(
        matches!(e, Error::MissingByteToken { byte: b'a', .. }),
        "{e}"
    );
}

#[test]
fn refuses_bad_special_ids_and_lengths() {
    let mut md = synthetic_metadata("qwen2");
    md.set("tokenizer.ggml.eos_token_id", Value::U32(100_000));
    assert!(matches!(
        build(&md).unwrap_err(),
        Error::SpecialIdOutOfRange { id: 100_000, .. }
    ));
    let mut md = synthetic_metadata("qwen2");
    md.set(
        "tokenizer.ggml.token_type",
        Value::Array(Array::I32(vec![1; 3])),
    );
    assert!(matches!(
        build(&md).unwrap_err(),
        Error::LengthMismatch { got: 3, .. }
    ));
}

#[test]
fn special_tokens_follow_llama_cpp_rules() {
    let tok = build(&synthetic_metadata("qwen2")).unwrap();
    let ctrl = 256 + 9;
    let user = 256 + 10;
    let unused = 256 + 11;
    // control: only with parse_special
    assert_eq!(tok.encode("<|s|>", true), vec![ctrl]);
    assert!(!tok.encode("<|s|>", false).contains(&ctrl));
    // user-defined: always
    assert_eq!(tok.encode("<u>", false), vec![user]);
    assert_eq!(
        tok.encode("a<u>b", true),
        vec![b'a' as u32, user, b'b' as u32]
    );
    // unused: never
    assert!(!tok.encode("[PAD]", true).contains(&unused));
    // round trips in both modes, control text rendered
    for s in ["x<|s|>y<u>z[PAD]", "<|s|><|s|>", "<<u>>"] {
        for ps in [false, true] {
            assert_eq!(tok.decode(&tok.encode(s, ps)).unwrap(), s.as_bytes());
        }
    }
    assert_eq!(tok.decode_skip_special(&[ctrl, user]).unwrap(), b"<u>");
    assert_eq!(tok.decode(&[unused]).unwrap(), b"");
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    let tok = build(&synthetic_metadata("qwen2")).unwrap();
    let n = tok.n_vocab() as u32;
    let e = tok.decode(&[1, 2, n, 3]).unwrap_err();
    assert!(
        matches!(e, Error::IdOutOfRange { id, index: 2, .. } if id == n),
        "{e}"
    );
    assert!(tok.piece(u32::MAX).is_err());
    let e = tok.encode_bytes(b"ok\xffno", false).unwrap_err();
    assert!(matches!(e, Error::InvalidUtf8 { offset: 2 }), "{e}");
    assert_eq!(
        tok.encode_bytes(b"hello", false).unwrap(),
        tok.encode("hello", false)
    );
}

#[test]
fn merges_outside_the_vocabulary_still_merge_then_fall_back_to_bytes() {
    // llama.cpp merges strings: "x y" applies even though "xy" is no token, so "xyz" can reach
    // the token "xyz" through it, while a lone "xy" falls back to its bytes.
    // Control: without virtual ids (dropping merges whose result is not a token) "xyz" encodes
    // as three byte tokens and this test fails.
    let mut md = synthetic_metadata("qwen2");
    let Some(Value::Array(Array::String(mut tokens))) = md.get("tokenizer.ggml.tokens").cloned()
    else {
        panic!()
    };
    let xyz = tokens.len() as u32;
    tokens.push("xyz");
    md.set("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)));
    let Some(Value::Array(Array::I32(mut types))) = md.get("tokenizer.ggml.token_type").cloned()
    else {
        panic!()
    };
    types.push(1);
    md.set("tokenizer.ggml.token_type", Value::Array(Array::I32(types)));
    md.set(
        "tokenizer.ggml.merges",
        Value::Array(Array::String(vec!["x y", "xy z"].into())),
    );
    let tok = build(&md).unwrap();
    assert_eq!(tok.merge_stats(), (2, 1));
    assert_eq!(tok.encode("xyz", false), vec![xyz]);
    assert_eq!(tok.encode("xy", false), vec![b'x' as u32, b'y' as u32]);
}
