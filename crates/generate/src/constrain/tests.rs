//! The integration on a small synthetic vocabulary: every byte as a token, a few
//! multi-byte tokens, and special tokens (end of generation, a control token).

use super::*;

const EOS: u32 = 256;
const EOT: u32 = 257;
const CONTROL: u32 = 258;

/// Bytes 0..=255, then `<eos>` `<eot>` `<ctl>` (special), then some multi-byte text.
fn words() -> Vec<Vec<u8>> {
    let mut w: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    for s in ["<eos>", "<eot>", "<ctl>"] {
        let mut v = vec![TokTrie::SPECIAL_TOKEN_MARKER];
        v.extend_from_slice(s.as_bytes());
        w.push(v);
    }
    for s in [
        "{\"", "\": ", "true", "false", "null", "name", "  ", "\n", "abc",
    ] {
        w.push(s.as_bytes().to_vec());
    }
    w
}

fn grammars() -> Grammars {
    Grammars::from_words(words(), &[EOS, EOT]).unwrap()
}

/// Walks the constraint with a seeded random choice among allowed tokens (preferring EOG
/// with probability 1/4 once allowed), returning the text and whether it ended by EOG.
fn walk(g: &Grammar, seed: u64, max: usize) -> (Vec<u8>, bool) {
    let w = words();
    let mut st = g.start();
    let mut rng = crate::sampler::Rng::new(seed);
    let mut out = Vec::new();
    for _ in 0..max {
        let mut logits = vec![0.0f32; w.len()];
        st.apply(&mut logits).unwrap();
        let allowed: Vec<u32> = (0..w.len() as u32)
            .filter(|&i| logits[i as usize] > f32::NEG_INFINITY)
            .collect();
        assert!(!allowed.contains(&CONTROL), "a control token was allowed");
        let eog_ok = allowed.contains(&EOS);
        assert_eq!(eog_ok, allowed.contains(&EOT), "all EOG ids together");
        if eog_ok && (allowed.len() == 2 || rng.next_u64().is_multiple_of(4)) {
            return (out, true);
        }
        let text: Vec<u32> = allowed
            .into_iter()
            .filter(|&i| i != EOS && i != EOT)
            .collect();
        let t = text[(rng.next_u64() % text.len() as u64) as usize];
        out.extend_from_slice(&w[t as usize]);
        st.commit(t);
    }
    (out, false)
}

#[test]
fn json_schema_replies_parse_and_follow_the_schema() {
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 5},
            "ok": {"type": "boolean"},
            "n": {"type": "integer", "minimum": 0, "maximum": 9}
        },
        "required": ["name", "ok", "n"],
        "additionalProperties": false
    });
    let g = grammars()
        .compile(&ConstraintSpec::JsonSchema(schema))
        .unwrap();
    for seed in 0..20 {
        let (text, ended) = walk(&g, seed, 200);
        assert!(ended, "seed {seed}: {}", String::from_utf8_lossy(&text));
        let v: serde_json::Value = serde_json::from_slice(&text)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&text)));
        assert!(v["name"].as_str().unwrap().chars().count() <= 5);
        assert!(v["ok"].is_boolean());
        assert!((0..=9).contains(&v["n"].as_i64().unwrap()));
        assert_eq!(v.as_object().unwrap().len(), 3);
    }
}

#[test]
fn eog_is_allowed_only_where_the_grammar_accepts() {
    let g = grammars()
        .compile(&ConstraintSpec::Regex("ab+c".into()))
        .unwrap();
    let mut st = g.start();
    let w = words();
    for (i, &b) in b"abbc".iter().enumerate() {
        let mut l = vec![0.0f32; w.len()];
        st.apply(&mut l).unwrap();
        assert_eq!(l[EOS as usize], f32::NEG_INFINITY, "step {i}");
        assert!(l[b as usize] > f32::NEG_INFINITY);
        st.commit(b as u32);
    }
    let mut l = vec![0.0f32; w.len()];
    st.apply(&mut l).unwrap();
    assert!(l[EOS as usize] > f32::NEG_INFINITY && l[EOT as usize] > f32::NEG_INFINITY);
    // Control: accepts_tokens agrees, and refuses an unfinished reply.
    assert!(g.accepts_tokens(&[b'a' as u32, b'b' as u32, b'c' as u32]));
    assert!(!g.accepts_tokens(&[b'a' as u32, b'b' as u32]));
}

#[test]
fn gbnf_and_lark_constrain_like_their_text_says() {
    let gbnf = "root ::= (\"yes\" | \"no\") \" \" [0-9]{2}\n";
    let g = grammars()
        .compile(&ConstraintSpec::Gbnf(gbnf.into()))
        .unwrap();
    for seed in 0..10 {
        let (t, ended) = walk(&g, seed, 20);
        let s = String::from_utf8(t).unwrap();
        assert!(ended);
        let (word, num) = s.split_once(' ').unwrap();
        assert!(word == "yes" || word == "no", "{s}");
        assert!(
            num.len() == 2 && num.bytes().all(|b| b.is_ascii_digit()),
            "{s}"
        );
    }
    let g = grammars()
        .compile(&ConstraintSpec::Lark("start: \"x\"+ \"!\"".into()))
        .unwrap();
    let (t, _) = walk(&g, 1, 50);
    assert!(t.ends_with(b"!") && t[..t.len() - 1].iter().all(|&b| b == b'x'));
}

#[test]
fn refusals_name_the_construct_before_any_token() {
    let g = grammars();
    let e = g
        .compile(&ConstraintSpec::JsonSchema(serde_json::json!({
            "type": "object", "propertyNames": {"pattern": "^a"}, "unevaluatedProperties": false,
            "if": {"type": "object"}, "then": {"required": ["a"]}
        })))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("JSON schema") && (e.contains("if") || e.contains("unevaluated")),
        "{e}"
    );
    assert_eq!(
        g.compile(&ConstraintSpec::Regex(String::new()))
            .unwrap_err(),
        ConstraintError::EmptyRegex
    );
    let e = g
        .compile(&ConstraintSpec::Lark("start: foo".into()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("Lark grammar") && e.contains("foo"), "{e}");
    let e = g
        .compile(&ConstraintSpec::Gbnf("root ::= [a-".into()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("unterminated character class"), "{e}");
    // Issue 30: a regex's syntax error says what and where in the regex, on one line; it
    // quoted llguidance's Lark wrapper (`start: /a(b/`) at its line and column ("at 1(8)").
    // Control: llguidance's own message, which the check before it replaces.
    let e = g
        .compile(&ConstraintSpec::Regex("xy(b".into()))
        .unwrap_err();
    assert_eq!(
        e,
        ConstraintError::RegexSyntax {
            regex: "xy(b".into(),
            what: "unclosed group".into(),
            at: 3
        }
    );
    let e = e.to_string();
    assert!(!e.contains('\n') && !e.contains("start:"), "{e}");
    let own = match g.factory.create_parser(TopLevelGrammar::from_regex("xy(b")) {
        Ok(_) => panic!("llguidance took xy(b"),
        Err(e) => e.to_string(),
    };
    assert!(own.contains("start:"), "control: {own}");
    // Non-ASCII before the error: the position counts characters.
    let e = g.compile(&ConstraintSpec::Regex("é[".into())).unwrap_err();
    assert!(
        matches!(&e, ConstraintError::RegexSyntax { at: 2, .. }),
        "{e:?}"
    );
    // The same for a JSON schema's pattern, nested, once llguidance has refused it; a
    // pattern it takes is not second-guessed. Control: llguidance's own message spans lines.
    let schema = serde_json::json!({"type": "object", "properties": {
        "a": {"type": "string", "pattern": "^[a-z]+$"},
        "b": {"type": "array", "items": {"type": "string", "pattern": "ab(c"}}}});
    let e = g
        .compile(&ConstraintSpec::JsonSchema(schema.clone()))
        .unwrap_err();
    assert_eq!(
        e,
        ConstraintError::SchemaPattern {
            regex: "ab(c".into(),
            what: "unclosed group".into(),
            at: 3
        }
    );
    assert!(!e.to_string().contains('\n'), "{e}");
    let own = match g
        .factory
        .create_parser(TopLevelGrammar::from_json_schema(schema))
    {
        Ok(_) => panic!("llguidance took the pattern ab(c"),
        Err(e) => e.to_string(),
    };
    assert!(own.contains('\n'), "control: {own}");
    // What only llguidance refuses still reaches the user through its message.
    assert!(g.compile(&ConstraintSpec::Regex("(?<n>a)".into())).is_ok());
}

#[test]
fn json_object_is_any_object() {
    let g = grammars().compile(&ConstraintSpec::JsonObject).unwrap();
    for seed in 0..10 {
        let (t, ended) = walk(&g, seed, 300);
        if ended {
            let v: serde_json::Value = serde_json::from_slice(&t).unwrap();
            assert!(v.is_object());
        } else {
            assert!(t.starts_with(b"{"));
        }
    }
}
