//! Identity with llama.cpp (and, with NFC, with HF `tokenizers`) on the 500-string oracle
//! corpus, both `parse_special` modes, plus the decode round trip. Fixtures come from
//! /work/shared/oracle/tokenize (see its README for how they were produced).
//!
//! Control: mutating the Qwen2 digit rule to groups of three (`split_llama3(.., 3, ..)`)
//! makes `qwen_matches_llama_cpp` fail on the digit strings; dropping the user-defined
//! token set makes the `<tool_call>` rows fail.

mod common;

use common::{fixture, load, Row};
use minfer_testkit::models::{QWEN, SMOL};
use minfer_tokenizer::{Normalization, Tokenizer};

/// Compares every row in both modes; returns (matches without, matches with parse_special).
fn check(tok: &Tokenizer, rows: &[Row], label: &str) -> (usize, usize) {
    let mut ok = [0usize; 2];
    let mut failures = Vec::new();
    for row in rows {
        let expected = [
            row.ids.clone(),
            row.ids_parse_special
                .clone()
                .unwrap_or_else(|| row.ids.clone()),
        ];
        for (mode, want) in expected.iter().enumerate() {
            let got = tok.encode(&row.text, mode == 1);
            if &got == want {
                ok[mode] += 1;
            } else if failures.len() < 12 {
                failures.push(format!(
                    "{label} i={} ({}) parse_special={}: text {:?}\n  want {:?}\n  got  {:?}",
                    row.i,
                    row.category,
                    mode == 1,
                    row.text,
                    want,
                    got
                ));
            }
        }
    }
    println!(
        "{label}: {}/{} match (parse_special=false), {}/{} match (parse_special=true)",
        ok[0],
        rows.len(),
        ok[1],
        rows.len()
    );
    for f in &failures {
        println!("{f}");
    }
    (ok[0], ok[1])
}

fn round_trip(tok: &Tokenizer, rows: &[Row]) {
    for row in rows {
        for parse_special in [false, true] {
            let ids = tok.encode(&row.text, parse_special);
            let back = tok.decode(&ids).expect("decode");
            assert_eq!(
                String::from_utf8(back).expect("utf8"),
                row.text,
                "round trip i={} parse_special={parse_special}",
                row.i
            );
        }
    }
}

#[test]
fn qwen_matches_llama_cpp() {
    let Some(tok) = load(QWEN) else { return };
    let rows = fixture("qwen.jsonl");
    assert_eq!(rows.len(), 500);
    let (a, b) = check(&tok, &rows, "qwen");
    assert_eq!((a, b), (500, 500));
    round_trip(&tok, &rows);
}

#[test]
fn smol_matches_llama_cpp() {
    let Some(tok) = load(SMOL) else { return };
    let rows = fixture("smol.jsonl");
    assert_eq!(rows.len(), 500);
    let (a, b) = check(&tok, &rows, "smol");
    assert_eq!((a, b), (500, 500));
    round_trip(&tok, &rows);
}

#[test]
fn qwen_nfc_matches_hf_tokenizers() {
    let Some(tok) = load(QWEN) else { return };
    let tok = tok.with_normalization(Normalization::Nfc);
    let rows = fixture("qwen-hf.jsonl");
    let (a, b) = check(&tok, &rows, "qwen-hf (NFC)");
    assert_eq!((a, b), (500, 500));
}

#[test]
fn qwen_without_nfc_differs_from_hf_exactly_on_the_nfc_rows() {
    // The control for the NFC option: without it, the rows the oracle lists as NFC
    // differences (36) must differ and no others.
    let Some(tok) = load(QWEN) else { return };
    let rows = fixture("qwen-hf.jsonl");
    let differing = rows
        .iter()
        .filter(|r| tok.encode(&r.text, false) != r.ids)
        .count();
    assert_eq!(differing, 36);
}

/// Leftmost-longest (ours) and llama.cpp's longest-token-first partition agree when no special
/// text contains another or overlaps one (a proper suffix of one being a prefix of another).
/// Checked for both real vocabularies, both sets.
#[test]
fn special_texts_do_not_overlap() {
    fn overlaps(a: &[u8], b: &[u8]) -> bool {
        let contains = a.len() > b.len() && a.windows(b.len()).any(|w| w == b);
        let suffix_prefix = (1..a.len().min(b.len())).any(|k| a[a.len() - k..] == b[..k]);
        contains || suffix_prefix
    }
    // Control: the check itself finds overlaps.
    assert!(overlaps(b"<|a", b"a|>") && overlaps(b"<abc>", b"b") && !overlaps(b"<a>", b"<b>"));
    for name in [QWEN, SMOL] {
        let Some(tok) = load(name) else { return };
        let (always, with_special) = tok.special_texts();
        for set in [always, with_special] {
            for a in &set {
                for b in &set {
                    if a != b {
                        assert!(
                            !overlaps(a, b),
                            "{name}: {:?} overlaps {:?}",
                            String::from_utf8_lossy(a),
                            String::from_utf8_lossy(b)
                        );
                    }
                }
            }
        }
    }
}
