//! The session reader under seeded mutation (issue 34): copies of valid session files
//! (one and three sequences) with fields overwritten by hostile values, bytes flipped,
//! inserted, deleted and duplicated, and the file cut short, most of them with the checksum
//! recomputed so the structural checks behind it see the damage (a plain flip only ever
//! meets the checksum: session_file.rs). `read_session` must return Ok or a typed error,
//! never panic; a mutant it accepts must also apply (or be refused) without a panic.
//!
//! `MINFER_SESSION_FUZZ_CASES` sets the number (default 50 000, ~2.5 s in release);
//! `MINFER_FUZZ_SEED` replays a run. `scripts/fuzz-files` runs 10⁶.
//!
//! Control: turning off the "shorter than declared" check in `verify_file`
//! (engine/src/session.rs) lets a cut mutant with a valid checksum read past the end:
//! "case 20 … panicked in read_session" at the default seed.

use minfer_engine::session::fnv1a64;
use minfer_engine::{BatchEntry, Engine};
use minfer_gguf::GgmlType;
use minfer_models::Arch;
use minfer_testkit::rng::Rng;
use minfer_testkit::synth::*;
use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};

fn cases() -> u64 {
    std::env::var("MINFER_SESSION_FUZZ_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(50_000)
}

/// A session of one sequence and one of three (two layers, F16 KV), and an engine to read
/// them into.
fn bases() -> (Engine, Vec<Vec<u8>>) {
    let path = model_heads(Arch::Qwen2, 2, 31, 2, 1);
    let mut e = engine(&path, 64, GgmlType::F16);
    let vocab = e.hparams().vocab_size;
    let t0 = tokens(5, 1, vocab);
    e.decode(&t0, 0, 1).unwrap();
    let one = e.session_bytes(&t0, b"app").unwrap();
    let (s1, s2) = (e.seq_create(), e.seq_create());
    let (t1, t2) = (tokens(3, 2, vocab), tokens(4, 3, vocab));
    e.forward_batch(&[BatchEntry::new(s1, &t1, 0), BatchEntry::new(s2, &t2, 0)])
        .unwrap();
    let d = e.default_seq();
    let seqs: Vec<(minfer_engine::SeqId, &[u32])> = vec![(d, &t0), (s1, &t1), (s2, &t2)];
    let three = e.session_bytes_of(&seqs, b"").unwrap();
    let reader = engine(&path, 64, GgmlType::F16);
    (reader, vec![one, three])
}

/// The values a u32 field is overwritten with: edges, off-by-ones, sign bits.
fn hostile_u32(rng: &mut Rng, old: u32) -> u32 {
    let picks = [
        0,
        1,
        2,
        old.wrapping_add(1),
        old.wrapping_sub(1),
        u32::MAX,
        0x8000_0000,
        0x7fff_ffff,
        1 << 16,
        rng.next_u64() as u32,
    ];
    picks[rng.below(picks.len())]
}

fn mutate(rng: &mut Rng, base: &[u8]) -> (Vec<u8>, &'static str) {
    let mut b = base.to_vec();
    let body = b.len() - 8;
    let what = match rng.below(6) {
        0 | 1 => {
            // A u32 field: the fixed header (8..48) half the time, else any aligned word.
            let at = if rng.below(2) == 0 {
                8 + 4 * rng.below(10)
            } else {
                4 * rng.below(body / 4)
            };
            let old = u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
            b[at..at + 4].copy_from_slice(&hostile_u32(rng, old).to_le_bytes());
            "field"
        }
        2 => {
            for _ in 0..1 + rng.below(4) {
                let at = rng.below(body);
                b[at] ^= 1 << rng.below(8);
            }
            "flip"
        }
        3 => {
            let at = rng.below(body);
            let n = 1 + rng.below(16);
            let fill: Vec<u8> = (0..n).map(|_| rng.below(256) as u8).collect();
            b.splice(at..at, fill);
            "insert"
        }
        4 => {
            let at = rng.below(body);
            let n = (1 + rng.below(16)).min(body - at);
            b.drain(at..at + n);
            "delete"
        }
        _ => {
            let at = rng.below(body);
            b.truncate(at.max(8) + 8);
            "cut"
        }
    };
    // Most mutants get a valid checksum, so the checks behind it are reached.
    if rng.below(10) < 8 && b.len() >= 8 {
        let n = b.len() - 8;
        let sum = fnv1a64(&b[..n]);
        b[n..].copy_from_slice(&sum.to_le_bytes());
    }
    (b, what)
}

#[test]
fn mutated_sessions_are_refused_or_read_and_never_panic() {
    let seed = std::env::var("MINFER_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5E55_1011);
    let (mut e, bases) = bases();
    for b in &bases {
        // The checksum this test recomputes is the reader's: a valid file still reads.
        let n = b.len() - 8;
        assert_eq!(fnv1a64(&b[..n]).to_le_bytes(), b[n..]);
        e.read_session(b).unwrap();
    }
    let mut rng = Rng::splitmix64(seed);
    let mut outcomes = BTreeMap::<String, u64>::new();
    let t = std::time::Instant::now();
    let n = cases();
    for i in 0..n {
        let k = (i % 2) as usize;
        let (b, what) = mutate(&mut rng, &bases[k]);
        let r = catch_unwind(AssertUnwindSafe(|| e.read_session(&b)));
        let kind = match r {
            Err(_) => panic!("case {i} (seed {seed}, base {k}, {what}) panicked in read_session"),
            Ok(Ok(s)) => {
                let applied = catch_unwind(AssertUnwindSafe(|| e.apply_session_all(&s)));
                match applied {
                    Err(_) => panic!("case {i} (seed {seed}, base {k}, {what}) panicked applying"),
                    Ok(Ok(())) => "Ok".to_string(),
                    Ok(Err(_)) => "Ok, apply refused".to_string(),
                }
            }
            Ok(Err(x)) => {
                let s = format!("{x:?}");
                // The variant's name: the first word of its debug form after `Session(`.
                let s = s.trim_start_matches("Session(");
                s.split([' ', '{', '(']).next().unwrap_or("").to_string()
            }
        };
        *outcomes.entry(kind).or_default() += 1;
    }
    eprintln!(
        "{n} mutants in {:.1} s (seed {seed}): {outcomes:?}",
        t.elapsed().as_secs_f64()
    );
    // The mutations reach past the checksum: several kinds of refusal, and some mutants
    // (a changed token id, a K value) still read.
    assert!(outcomes.len() >= 5, "{outcomes:?}");
    assert!(outcomes.contains_key("Ok"), "{outcomes:?}");
}
