//! Session files: a restored KV continues bit-identically; every corruption is refused with
//! its reason and leaves the engine unchanged.

mod synthkit;

use minfer_engine::session::SessionError;
use minfer_engine::{Engine, Error};
use minfer_gguf::GgmlType;
use minfer_models::Arch;
use synthkit::*;

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
        assert_eq!(s.tokens, toks);
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

    // A newer version with a correct checksum is refused by its version.
    let mut b = bytes.clone();
    b[8] = 2;
    let n = b.len();
    let sum = minfer_engine::session::fnv1a64(&b[..n - 8]);
    b[n - 8..].copy_from_slice(&sum.to_le_bytes());
    let err = session_err(
        engine(&path, 32, GgmlType::F32)
            .read_session(&b)
            .unwrap_err(),
    );
    assert!(matches!(err, SessionError::Version { found: 2 }), "{err}");
}

/// The layout the module docs describe, read back field by field (independently of the
/// reader): magic, version, n_ctx, type id, layers, values per cell, tokens, blob, the
/// layer's backend id (cpu = 0) and the checksum over everything before it.
#[test]
fn layout_matches_the_documented_format() {
    let (_, e, toks, b) = small();
    let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
    assert_eq!(&b[..8], b"MINFSESS");
    assert_eq!(u32_at(8), 1);
    assert_eq!(
        u64::from_le_bytes(b[16..24].try_into().unwrap()),
        e.model_identity()
    );
    assert_eq!(u32_at(24), 32);
    assert_eq!(u32_at(28), 0); // GGML_TYPE_F32
    assert_eq!(u32_at(32), 1);
    assert_eq!(u32_at(36), 32);
    assert_eq!(u32_at(40), toks.len() as u32);
    assert_eq!(u32_at(44), 3);
    for (i, t) in toks.iter().enumerate() {
        assert_eq!(u32_at(48 + 4 * i), *t);
    }
    let blob = 48 + 4 * toks.len();
    assert_eq!(&b[blob..blob + 3], b"app");
    assert_eq!(&b[blob + 3..blob + 7], &[0, 0, 0, 0]);
    let cells = toks.len() * 32 * 4;
    assert_eq!(b.len(), blob + 7 + 2 * cells + 8);
    let n = b.len();
    let mut h: u64 = 0xcbf29ce484222325;
    for &x in &b[..n - 8] {
        h = (h ^ x as u64).wrapping_mul(0x100000001b3);
    }
    assert_eq!(u64::from_le_bytes(b[n - 8..].try_into().unwrap()), h);
}
