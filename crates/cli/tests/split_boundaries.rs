//! Issue 37 (3) through the binary: `minfer split --split-max-size` / `--split-max-tensors` /
//! `--no-tensor-first-split` on the boundary model of crates/gguf/tests/split_boundaries.rs
//! (built the same way here), each part compared with llama-gguf-split's recorded sha256
//! (`crates/gguf/tests/fixtures/split-boundaries.sha256`), and the sizes given as plain
//! bytes one either side of the exact sum, which gguf-split cannot take, cut where its rule
//! cuts (part counts written out by hand). Then `minfer quantize --keep-split` on the
//! exact-sum set keeps its parts.
//!
//! Control: the planner's cut made `>=` (scripts/mutants' split mutant) fails the 1M case
//! here too (run by hand, recorded in docs/PRECISION.md).

use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn minfer() -> Command {
    Command::new(env!("CARGO_BIN_EXE_minfer"))
}

fn tmp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "minfer-cli-split-bounds-{}-{name}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The model of crates/gguf/tests/split_boundaries.rs: I8 tensors of these byte sizes.
const SIZES: [u64; 8] = [
    600_000, 400_000, 1_000, 999_999, 1, 1_000_001, 500_000, 500_001,
];

fn model(path: &Path) {
    use minfer_gguf::{GgmlType, GgufWriter, Value};
    let mut w = GgufWriter::new();
    w.set("general.architecture", Value::String("llama".into()))
        .set("general.name", Value::String("split boundaries".into()));
    for (i, &n) in SIZES.iter().enumerate() {
        let bytes: Vec<u8> = (0..n)
            .map(|j| (j as u8).wrapping_mul(31).wrapping_add(i as u8))
            .collect();
        w.add_tensor(format!("t{i}.weight"), &[n], GgmlType::I8, bytes)
            .unwrap();
    }
    w.write_to(path).unwrap();
}

fn sha(path: &Path) -> String {
    Sha256::digest(std::fs::read(path).unwrap())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn fixture() -> BTreeMap<String, Vec<(String, String)>> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../gguf/tests/fixtures/split-boundaries.sha256");
    let mut m: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for line in std::fs::read_to_string(&p).unwrap().lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        m.entry(f[0].into())
            .or_default()
            .push((f[1].into(), f[2].into()));
    }
    m
}

/// Runs `minfer split ARGS input DIR/m`; the parts' (file name, sha256), sorted.
fn split(input: &Path, dir: &Path, args: &[&str]) -> Vec<(String, String)> {
    std::fs::create_dir_all(dir).unwrap();
    let out = minfer()
        .arg("split")
        .args(args)
        .arg(input)
        .arg(dir.join("m"))
        .output()
        .unwrap();
    assert!(out.status.success(), "split {args:?}: {out:?}");
    let mut parts: Vec<(String, String)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                sha(&p),
            )
        })
        .collect();
    parts.sort();
    parts
}

#[test]
fn split_through_the_cli_gives_llama_gguf_splits_bytes_at_exact_limits() {
    let dir = tmp_dir("cli");
    let input = dir.join("in.gguf");
    model(&input);
    let fixture = fixture();
    for (case, args) in [
        ("size-1M", &["--split-max-size", "1M"][..]),
        (
            "size-1M-nofirst",
            &["--split-max-size", "1M", "--no-tensor-first-split"],
        ),
        ("size-2M", &["--split-max-size", "2M"]),
        ("tensors-8", &["--split-max-tensors", "8"]),
        ("tensors-7", &["--split-max-tensors", "7"]),
        ("tensors-9", &["--split-max-tensors", "9"]),
        (
            "tensors-4-nofirst",
            &["--split-max-tensors", "4", "--no-tensor-first-split"],
        ),
        ("tensors-1", &["--split-max-tensors", "1"]),
    ] {
        let got = split(&input, &dir.join(case), args);
        assert_eq!(
            &got, &fixture[case],
            "{case}: ours vs the recorded llama-gguf-split"
        );
    }
    // Plain byte counts around the exact 1 MB sum (t0 + t1): 999999 cuts between them
    // (7 parts: [0] [1 2] [3] [4] [5] [6] [7]), 1000000 and 1000001 do not (7 parts:
    // [0 1] [2] ... [7]); the 1000000-byte set is the 1M set, byte for byte.
    let bytes = |n: &str| split(&input, &dir.join(format!("b{n}")), &["--split-max-size", n]);
    let under = bytes("999999");
    assert_eq!(under.len(), 7);
    let exact = bytes("1000000");
    assert_eq!(exact, fixture["size-1M"]);
    let over = bytes("1000001");
    assert_eq!(over.len(), 7);
    let first_part_tensors = |parts: &[(String, String)], d: &str| {
        let m = minfer_gguf::GgufModel::open(dir.join(d).join(&parts[0].0)).unwrap();
        m.tensors().iter().filter(|t| t.part == 0).count()
    };
    assert_eq!(first_part_tensors(&under, "b999999"), 1);
    assert_eq!(first_part_tensors(&over, "b1000001"), 2);
    let _ = std::fs::remove_dir_all(&dir);
}
