//! Property tests over seeded random Unicode strings and random bytes (hand-written generator,
//! `common::Rng`): no panics, `decode(encode(s)) == s` in both modes, streaming decode equals
//! whole decode, the heap and scan merge loops agree. The synthetic vocabulary always runs;
//! the real ones run when the models are cached.
//!
//! Control: making the scan loop's tie-break rightmost-first (`r <= best`) breaks
//! `heap_and_scan_merges_agree` (tried). The oracle tests pin both loops to llama.cpp's ids.

mod common;

use common::{load, synthetic_metadata, Rng};
use minfer_testkit::models::{QWEN, SMOL};
use minfer_tokenizer::{Error, StreamDecoder, Tokenizer};

const SEED: u64 = 0x5EED_2026_1129;

fn round_trips(tok: &Tokenizer, n: usize, seed: u64, drop_missing: bool) {
    let mut rng = Rng::new(seed);
    let missing = tok.missing_byte_tokens().to_vec();
    for _ in 0..n {
        let s = rng.string(40);
        let want: Vec<u8> = if drop_missing {
            s.bytes().filter(|b| !missing.contains(b)).collect()
        } else {
            s.clone().into_bytes()
        };
        for ps in [false, true] {
            let ids = tok.encode(&s, ps);
            let back = tok.decode(&ids).expect("in-range ids");
            assert_eq!(back, want, "round trip of {s:?} (parse_special={ps})");
        }
    }
}

fn stream_equals_whole(tok: &Tokenizer, n: usize, seed: u64) {
    let mut rng = Rng::new(seed);
    for _ in 0..n {
        let s = rng.string(30);
        let ids = tok.encode(&s, true);
        let mut dec = StreamDecoder::new();
        let mut out = String::new();
        for &id in &ids {
            out.push_str(&dec.push(tok.piece(id).unwrap()));
        }
        out.push_str(&dec.finish());
        let whole = String::from_utf8_lossy(&tok.decode(&ids).unwrap()).into_owned();
        assert_eq!(out, whole, "stream decode of {s:?}");
    }
}

fn random_bytes_and_ids(tok: &Tokenizer, n: usize, seed: u64) {
    let mut rng = Rng::new(seed);
    let n_vocab = tok.n_vocab() as u64;
    for _ in 0..n {
        let len = rng.below(24) as usize;
        let bytes: Vec<u8> = (0..len).map(|_| rng.below(256) as u8).collect();
        match (std::str::from_utf8(&bytes), tok.encode_bytes(&bytes, true)) {
            (Ok(s), Ok(ids)) => assert_eq!(ids, tok.encode(s, true)),
            (Ok(_), Err(Error::UnrepresentableByte { .. })) => {}
            (Err(e), Err(Error::InvalidUtf8 { offset })) => assert_eq!(offset, e.valid_up_to()),
            (a, b) => panic!("bytes {bytes:?}: utf8 {a:?} vs encode_bytes {b:?}"),
        }
        let ids: Vec<u32> = (0..len).map(|_| rng.below(n_vocab + 8) as u32).collect();
        let bad = ids.iter().position(|&i| i as u64 >= n_vocab);
        match (tok.decode(&ids), bad) {
            (Ok(_), None) => {}
            (Err(Error::IdOutOfRange { index, .. }), Some(b)) => assert_eq!(index, b),
            (r, b) => panic!("decode {ids:?}: {r:?}, first bad {b:?}"),
        }
        // streaming over arbitrary pieces never panics and never splits a character
        let mut dec = StreamDecoder::new();
        for &id in ids.iter().filter(|&&i| (i as u64) < n_vocab) {
            let _chunk: String = dec.push(tok.piece(id).unwrap());
        }
        let _ = dec.finish();
    }
}

#[test]
fn synthetic_vocabulary_properties() {
    for pre in ["qwen2", "llama-bpe", "smollm"] {
        let tok = Tokenizer::from_metadata(&synthetic_metadata(pre)).unwrap();
        round_trips(&tok, 3000, SEED, false);
        stream_equals_whole(&tok, 1000, SEED + 1);
        random_bytes_and_ids(&tok, 3000, SEED + 2);
    }
}

#[test]
fn qwen_properties() {
    let Some(tok) = load(QWEN) else { return };
    assert!(tok.missing_byte_tokens().is_empty());
    round_trips(&tok, 3000, SEED + 10, false);
    stream_equals_whole(&tok, 1000, SEED + 11);
    random_bytes_and_ids(&tok, 3000, SEED + 12);
}

#[test]
fn smol_properties() {
    let Some(tok) = load(SMOL) else { return };
    // SmolLM2 lacks 21 byte tokens; encode drops those bytes (as llama.cpp does).
    assert_eq!(tok.missing_byte_tokens().len(), 21);
    round_trips(&tok, 3000, SEED + 20, true);
    stream_equals_whole(&tok, 1000, SEED + 21);
    random_bytes_and_ids(&tok, 3000, SEED + 22);
}

#[test]
fn heap_and_scan_merges_agree() {
    let Some(tok) = load(QWEN) else { return };
    let mut rng = Rng::new(SEED + 30);
    let bpe = tok.bpe();
    let alphabet: Vec<char> = "aaabbeeilnorst ing".chars().collect();
    for _ in 0..3000 {
        let n = 1 + rng.below(60);
        let word: String = if rng.below(2) == 0 {
            (0..n)
                .map(|_| alphabet[rng.below(alphabet.len() as u64) as usize])
                .collect()
        } else {
            (0..n).map(|_| rng.char()).collect()
        };
        let (mut a, mut b) = (Vec::new(), Vec::new());
        bpe.merge_scan(word.as_bytes(), &mut a);
        bpe.merge_heap(word.as_bytes(), &mut b);
        assert_eq!(a, b, "word {word:?}");
    }
}
