//! Session files: a restored KV continues bit-identically; every corruption is refused with
//! its reason and leaves the engine unchanged.

use minfer_engine::session::SessionError;
use minfer_engine::{Engine, Error};
use minfer_gguf::GgmlType;
use minfer_models::Arch;
use minfer_testkit::synth::*;

fn session_err(e: Error) -> SessionError {
    match e {
        Error::Session(s) => s,
        other => panic!("expected a session error, got {other}"),
    }
}

/// A small session: 1 layer, 32 values per cell, 6 tokens.
fn small() -> (std::path::PathBuf, Engine, Vec<u32>, Vec<u8>) {
    let path = model(Arch::Qwen2, 1, 11);
    let mut e = engine(&path, 32, GgmlType::F32);
    let vocab = e.hparams().vocab_size;
    let toks = tokens(6, 5, vocab);
    e.decode(&toks, 0, 1).unwrap();
    let bytes = e.session_bytes(&toks, b"app").unwrap();
    (path, e, toks, bytes)
}

#[test]
fn restored_kv_continues_bit_identically() {
    let path = model_heads(Arch::Llama, 2, 12, 2, 1);
    for ty in [GgmlType::F32, GgmlType::F16, GgmlType::Q8_0] {
        let mut a = engine(&path, 64, ty);
        let vocab = a.hparams().vocab_size;
        let toks = tokens(17, 1, vocab);
        a.decode(&toks, 0, 1).unwrap();
        let file = tmp("s.session");
        a.save_session(&file, &toks, b"{}").unwrap();
        let probe = tokens(3, 2, vocab);
        let want = a.decode(&probe, 17, 3).unwrap().to_vec();

        let mut b = engine(&path, 64, ty);
        let s = b.load_session(&file).unwrap();
        assert_eq!(s.tokens(), toks);
        assert_eq!(s.app, b"{}");
        assert_eq!(b.n_past(), 17);
        let got = b.decode(&probe, 17, 3).unwrap().to_vec();
        assert!(
            got.iter()
                .zip(&want)
                .all(|(x, y)| x.to_bits() == y.to_bits()),
            "{ty}"
        );
    }
}

/// Every single-byte flip and every truncation of a small file is refused, and loading it
/// leaves the engine as it was (same n_past, same next logits).
#[test]
fn every_flip_and_truncation_is_refused_and_changes_nothing() {
    let (_, mut e, toks, bytes) = small();
    let vocab = e.hparams().vocab_size;
    assert!(bytes.len() < 4096, "small file: {} bytes", bytes.len());
    e.read_session(&bytes).unwrap();
    let mut reasons = std::collections::BTreeMap::<String, usize>::new();
    let mut count = |err: Error| {
        let s = session_err(err);
        let kind = format!("{s:?}");
        let kind = kind.split([' ', '{', '(']).next().unwrap().to_string();
        *reasons.entry(kind).or_default() += 1;
    };
    let file = tmp("flip.session");
    for at in 0..bytes.len() {
        for mask in [0x01u8, 0xFF] {
            let mut b = bytes.clone();
            b[at] ^= mask;
            std::fs::write(&file, &b).unwrap();
            count(e.load_session(&file).unwrap_err());
            assert_eq!(e.n_past(), toks.len(), "flip at {at}");
        }
    }
    for len in 0..bytes.len() {
        std::fs::write(&file, &bytes[..len]).unwrap();
        count(e.load_session(&file).unwrap_err());
        assert_eq!(e.n_past(), toks.len(), "truncated to {len}");
    }
    let mut longer = bytes.clone();
    longer.push(0);
    count(e.read_session(&longer).unwrap_err());
    eprintln!("{} bytes; refusals by reason: {reasons:?}", bytes.len());
    assert!(reasons.contains_key("Checksum") && reasons.contains_key("Truncated"));
    // The engine still continues exactly as one that never saw a corrupt file.
    let probe = tokens(1, 3, vocab);
    let got = e.decode(&probe, toks.len(), 1).unwrap().to_vec();
    let (_, mut fresh, _, _) = small();
    let want = fresh.decode(&probe, toks.len(), 1).unwrap().to_vec();
    assert_eq!(got, want);
}

#[test]
fn another_model_n_ctx_or_kv_type_is_refused_by_name() {
    let (path, _, _, bytes) = small();
    let other = model(Arch::Qwen2, 1, 99);
    let err = session_err(
        engine(&other, 32, GgmlType::F32)
            .read_session(&bytes)
            .unwrap_err(),
    );
    assert!(matches!(err, SessionError::OtherModel { .. }), "{err}");
    assert!(err.to_string().contains("another model"));

    let err = session_err(
        engine(&path, 64, GgmlType::F32)
            .read_session(&bytes)
            .unwrap_err(),
    );
    assert!(
        matches!(
            err,
            SessionError::NCtx {
                saved: 32,
                this: 64
            }
        ),
        "{err}"
    );

    let err = session_err(
        engine(&path, 32, GgmlType::F16)
            .read_session(&bytes)
            .unwrap_err(),
    );
    assert!(err.to_string().contains("KV type is F32"), "{err}");

    let err = session_err(
        engine(&path, 32, GgmlType::F32)
            .read_session(b"GGUF....")
            .unwrap_err(),
    );
    assert!(matches!(err, SessionError::Magic { .. }), "{err}");

    // A version-1 file (the one-sequence format) and a newer version, each with a correct
    // checksum, are refused by their version, naming it.
    for (v, hint) in [(1u8, "version 1"), (3, "version 3")] {
        let mut b = bytes.clone();
        b[8] = v;
        let n = b.len();
        let sum = minfer_engine::session::fnv1a64(&b[..n - 8]);
        b[n - 8..].copy_from_slice(&sum.to_le_bytes());
        let err = session_err(
            engine(&path, 32, GgmlType::F32)
                .read_session(&b)
                .unwrap_err(),
        );
        assert!(
            matches!(err, SessionError::Version { found, .. } if found == v as u32),
            "{err}"
        );
        assert!(err.to_string().contains(hint), "{err}");
    }
}

/// Several sequences (one sharing another's prefix, one scattered over the arena) saved
/// together and loaded into a fresh engine, all at once or one by one into another id, each
/// continue bit-identically.
#[test]
fn many_sequences_save_and_load_all_or_one() {
    let path = model_heads(Arch::Qwen2, 2, 21, 2, 1);
    for ty in [GgmlType::F32, GgmlType::F16, GgmlType::Q8_0] {
        let mut a = engine(&path, 96, ty);
        let vocab = a.hparams().vocab_size;
        let (s1, s2) = (a.seq_create(), a.seq_create());
        let (t0, t1, t2) = (
            tokens(9, 1, vocab),
            tokens(14, 2, vocab),
            tokens(5, 3, vocab),
        );
        a.decode(&t0, 0, 1).unwrap();
        a.forward_batch(&[
            minfer_engine::BatchEntry::new(s1, &t1, 0),
            minfer_engine::BatchEntry::new(s2, &t2, 0),
        ])
        .unwrap();
        let d = a.default_seq();
        let seqs: Vec<(minfer_engine::SeqId, &[u32])> = vec![(d, &t0), (s1, &t1), (s2, &t2)];
        let file = tmp("many.session");
        a.save_session_of(&file, &seqs, b"x").unwrap();
        let probe = tokens(1, 7, vocab);
        let mut want = Vec::new();
        for (seq, t) in &seqs {
            let out = a
                .forward_batch(&[minfer_engine::BatchEntry::new(*seq, &probe, t.len())])
                .unwrap();
            want.push(out.logits(0).to_vec());
        }

        let mut b = engine(&path, 96, ty);
        let bytes = std::fs::read(&file).unwrap();
        let s = b.read_session(&bytes).unwrap();
        assert_eq!(s.seqs.len(), 3);
        b.apply_session_all(&s).unwrap();
        b.cells().check().unwrap();
        for ((seq, t), want) in seqs.iter().zip(&want) {
            let out = b
                .forward_batch(&[minfer_engine::BatchEntry::new(*seq, &probe, t.len())])
                .unwrap();
            assert!(bits_eq(out.logits(0), want), "{ty} seq {seq}");
        }
        // One sequence into a new id of another engine.
        let mut c = engine(&path, 96, ty);
        let target = c.seq_create();
        c.apply_session_seq(&s, s1.0, target).unwrap();
        let out = c
            .forward_batch(&[minfer_engine::BatchEntry::new(target, &probe, t1.len())])
            .unwrap();
        assert!(bits_eq(out.logits(0), &want[1]), "{ty} one sequence");
        let err = session_err(c.apply_session_seq(&s, 77, target).unwrap_err());
        assert!(matches!(err, SessionError::NoSuchSeq { seq: 77 }), "{err}");
        // Control: a different sequence's saved cells do not continue this one.
        let mut d2 = engine(&path, 96, ty);
        let t = d2.seq_create();
        d2.apply_session_seq(&s, s2.0, t).unwrap();
        let out = d2
            .forward_batch(&[minfer_engine::BatchEntry::new(t, &probe, t2.len())])
            .unwrap();
        assert!(!bits_eq(out.logits(0), &want[1]), "{ty}: control");
    }
}

fn bits_eq(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// The layout the module docs describe, read back field by field (independently of the
/// reader): magic, version 2, n_ctx, type id, layers, values per cell, sequences, blob, the
/// layer table (cpu = 0), the sequence (id, tokens, K rows, V rows) and the checksum over
/// everything before it.
#[test]
fn layout_matches_the_documented_format() {
    let (_, e, toks, b) = small();
    let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
    assert_eq!(&b[..8], b"MINFSESS");
    assert_eq!(u32_at(8), 2);
    assert_eq!(
        u64::from_le_bytes(b[16..24].try_into().unwrap()),
        e.model_identity()
    );
    assert_eq!(u32_at(24), 32);
    assert_eq!(u32_at(28), 0); // GGML_TYPE_F32
    assert_eq!(u32_at(32), 1);
    assert_eq!(u32_at(36), 32);
    assert_eq!(u32_at(40), 1, "one sequence");
    assert_eq!(u32_at(44), 3);
    assert_eq!(&b[48..51], b"app");
    assert_eq!(&b[51..55], &[0, 0, 0, 0], "layer 0 on the cpu");
    assert_eq!(u32_at(55), e.default_seq().0);
    assert_eq!(u32_at(59), toks.len() as u32);
    for (i, t) in toks.iter().enumerate() {
        assert_eq!(u32_at(63 + 4 * i), *t);
    }
    let cells = toks.len() * 32 * 4;
    assert_eq!(b.len(), 63 + 4 * toks.len() + 2 * cells + 8);
    let n = b.len();
    let mut h: u64 = 0xcbf29ce484222325;
    for &x in &b[..n - 8] {
        h = (h ^ x as u64).wrapping_mul(0x100000001b3);
    }
    assert_eq!(u64::from_le_bytes(b[n - 8..].try_into().unwrap()), h);
}
