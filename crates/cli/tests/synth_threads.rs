//! `minfer synth` writes the same bytes on any number of threads.
//!
//! Two gates: the files written on 2, 3 and 7 threads equal the one-thread file byte for
//! byte, and the one-thread file's sha256 equals the one recorded from the single-threaded
//! writer before synth went parallel (main at bda16b2, `minfer synth` with the flags of
//! [`FLAGS`] and each case's type flags), so a change that altered every thread count's
//! bytes alike is caught too.

use minfer_gguf::GgmlType;
use minfer_models::synth::{self, SynthSpec};
use minfer_models::Arch;
use sha2::{Digest, Sha256};
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The shape of every case: whole Q4_K/Q6_K blocks in 256-wide rows, and a 320-wide
/// ffn_down row that needs the fallback type.
const FLAGS: &[&str] = &[
    "--arch",
    "qwen2",
    "--layers",
    "2",
    "--embd",
    "256",
    "--heads",
    "4",
    "--kv-heads",
    "2",
    "--ffn",
    "320",
    "--seed",
    "11",
];

struct Case {
    ty: GgmlType,
    fallback: Option<GgmlType>,
    /// sha256 of the single-threaded writer's file (before the parallel one existed).
    sha256: &'static str,
}

const CASES: &[Case] = &[
    Case {
        ty: GgmlType::F16,
        fallback: None,
        sha256: "a7763f543595c0559d26bd5d17dd294f2289bda5ac3f4c02449b546e710c1117",
    },
    Case {
        ty: GgmlType::Q4K,
        fallback: Some(GgmlType::Q8_0),
        sha256: "00c4dd30a659531ebecf09dadf054ca966fa24f14bad3133357a9f99db85099c",
    },
    Case {
        ty: GgmlType::Q5_0,
        fallback: None,
        sha256: "9c46cdf690640252a8bb22cf89fa17988ab877ec5c437a3ef4f4105965f2a1f6",
    },
    Case {
        ty: GgmlType::Q6K,
        fallback: Some(GgmlType::Q5_0),
        sha256: "7b2208c3dc257e31df6c26da9faa404c1fe7261e265585e934228a0a0a0a9338",
    },
];

/// The spec `minfer synth` builds from [`FLAGS`] and the case's types.
fn spec(case: &Case) -> SynthSpec {
    let mut s = SynthSpec::new(Arch::Qwen2, 2, 256, 4, 2, 320);
    s.seed = 11;
    s.weight_type = case.ty;
    s.fallback_type = case.fallback;
    s
}

fn sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "minfer-synth-threads-{name}-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn threads(n: usize) -> NonZeroUsize {
    NonZeroUsize::new(n).unwrap()
}

fn write(spec: &SynthSpec, path: &Path, n: usize) -> Vec<u8> {
    synth::write_synth_threads(spec, path, threads(n), &mut |_, _| {}).unwrap();
    std::fs::read(path).unwrap()
}

#[test]
fn threaded_synth_writes_the_single_threaded_bytes() {
    let dir = tmpdir("lib");
    for case in CASES {
        let spec = spec(case);
        let path = dir.join(format!("{}.gguf", case.ty));
        let one = write(&spec, &path, 1);
        assert_eq!(
            sha256(&one),
            case.sha256,
            "{}: the one-thread file differs from the pre-parallel writer's",
            case.ty
        );
        for n in [2, 3, 7] {
            assert!(write(&spec, &path, n) == one, "{}: {n} threads", case.ty);
        }
        // The in-memory writer shares the row encoder.
        let in_memory = synth::synthesize_threads(&spec, threads(3)).unwrap();
        assert!(in_memory.to_bytes() == one, "{}: in memory", case.ty);
    }
    // Control: the hash tells seeds apart, so equal hashes above are not vacuous.
    let mut other = spec(&CASES[1]);
    other.seed = 12;
    let path = dir.join("other-seed.gguf");
    assert_ne!(sha256(&write(&other, &path, 3)), CASES[1].sha256);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn cli_threads_flag_changes_the_speed_not_the_file() {
    let dir = tmpdir("cli");
    let case = &CASES[1];
    let type_flags = ["--type", "q4_k", "--fallback-type", "q8_0"];
    // No -t and -t 0 mean every CPU; -t 9 may be more than the machine has (a warning only).
    for t in [None, Some("0"), Some("1"), Some("3"), Some("9")] {
        let out = dir.join(format!("t{}.gguf", t.unwrap_or("all")));
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_minfer"));
        cmd.arg("synth")
            .args(FLAGS)
            .args(type_flags)
            .arg("-o")
            .arg(&out);
        if let Some(t) = t {
            cmd.args(["-t", t]);
        }
        let o = cmd.output().unwrap();
        assert!(o.status.success(), "-t {t:?}: {o:?}");
        let bytes = std::fs::read(&out).unwrap();
        assert_eq!(sha256(&bytes), case.sha256, "-t {t:?}");
    }
    std::fs::remove_dir_all(dir).unwrap();
}
