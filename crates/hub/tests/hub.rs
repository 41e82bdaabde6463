//! Downloads by name (issue 17) against scripts/hf-test-server.py, a loopback stand-in for
//! the hub's URL layout (paged tree listing, resolve with a 302 to a CDN path, Range,
//! If-Range, ETag). No test reaches the internet.
//!
//! Control: sending no `Range` header on a retry (download.rs) makes
//! `a_cut_transfer_resumes_with_range_requests` fail on the logged ranges, and skipping the
//! SHA-256 check makes `a_corrupted_download_is_refused_and_removed` fail.

use minfer_hub::hf::{self, FileOutcome, HubConfig, HubRef};
use minfer_hub::{cache, FetchError};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

const TOKEN: &str = "hf_test_token";

struct Server {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Server {
    fn start(root: &Path, log: &Path, extra: &[&str]) -> Server {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/hf-test-server.py");
        let mut child = Command::new("python3")
            .arg(script)
            .arg("--root")
            .arg(root)
            .arg("--log")
            .arg(log)
            .args(["--token", TOKEN, "--page-size", "2"])
            .args(extra)
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 runs the test hub");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line
            .strip_prefix("PORT ")
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| panic!("test hub said {line:?}"));
        Server {
            child,
            port,
            log: log.into(),
        }
    }

    fn cfg(&self, token: Option<&str>) -> HubConfig {
        HubConfig {
            endpoint: format!("http://127.0.0.1:{}", self.port),
            token: token.map(String::from),
            revision: "main".into(),
        }
    }

    /// The logged requests, as (path, range, auth).
    fn requests(&self) -> Vec<(String, Option<String>, Option<String>)> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|l| {
                let j: serde_json::Value = serde_json::from_str(l).unwrap();
                let s = |k: &str| j[k].as_str().map(String::from);
                (s("path").unwrap(), s("range"), s("auth"))
            })
            .collect()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("minfer-hub-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A repository of one single-file quantization, one split in two, a projector, a README
/// and a file in a directory: more than one page of listing at two entries a page.
fn make_repo(root: &Path) -> PathBuf {
    let repo = root.join("tester/tiny-GGUF");
    std::fs::create_dir_all(repo.join("F16")).unwrap();
    let files: [(&str, usize); 6] = [
        ("README.md", 100),
        ("tiny-Q4_K_M.gguf", 300_000),
        ("tiny-Q8_0-00001-of-00002.gguf", 120_000),
        ("tiny-Q8_0-00002-of-00002.gguf", 70_001),
        ("mmproj-tiny-f16.gguf", 5_000),
        ("F16/tiny-F16.gguf", 10_000),
    ];
    for (i, (p, n)) in files.iter().enumerate() {
        std::fs::write(repo.join(p), bytes(*n, i as u64 + 1)).unwrap();
    }
    repo
}

fn same_file(a: &Path, b: &Path) -> bool {
    std::fs::read(a).unwrap() == std::fs::read(b).unwrap()
}

#[test]
fn pull_lists_all_pages_picks_the_quantization_and_verifies() {
    let dir = tmp("pull");
    let repo = make_repo(&dir.join("root"));
    let cache_root = dir.join("models");
    let server = Server::start(&dir.join("root"), &dir.join("log.jsonl"), &[]);
    let cfg = server.cfg(Some(TOKEN));
    let r = HubRef::parse("hf:tester/tiny-GGUF:q8_0").unwrap();
    let got = hf::pull(&cache_root, &r, &cfg, false).unwrap();
    let names: Vec<_> = got
        .iter()
        .map(|(p, o)| (p.file_name().unwrap().to_str().unwrap().to_string(), *o))
        .collect();
    assert_eq!(
        names,
        [
            (
                "tiny-Q8_0-00001-of-00002.gguf".into(),
                FileOutcome::Downloaded
            ),
            (
                "tiny-Q8_0-00002-of-00002.gguf".into(),
                FileOutcome::Downloaded
            )
        ]
    );
    for (p, _) in &got {
        assert!(same_file(p, &repo.join(p.file_name().unwrap())));
    }
    let reqs = server.requests();
    // Four pages of two entries (7 entries with the directory).
    let pages = reqs
        .iter()
        .filter(|r| r.0.starts_with("/api/models/"))
        .count();
    assert_eq!(pages, 4, "{reqs:?}");
    // The token goes to the hub, not to the redirect target.
    for (path, _, auth) in &reqs {
        let want = (!path.starts_with("/cdn/")).then(|| format!("Bearer {TOKEN}"));
        assert_eq!(auth, &want, "{path}");
    }
    assert_eq!(reqs.iter().filter(|r| r.0.starts_with("/cdn/")).count(), 2);
    // Again: present, nothing transferred; no tag means the Q4_K_M file (several sets).
    let again = hf::pull(&cache_root, &r, &cfg, false).unwrap();
    assert!(again.iter().all(|(_, o)| *o == FileOutcome::Present));
    assert_eq!(
        server
            .requests()
            .iter()
            .filter(|r| r.0.starts_with("/cdn/"))
            .count(),
        2
    );
    let d = hf::pull(
        &cache_root,
        &HubRef::parse("hf:tester/tiny-GGUF").unwrap(),
        &cfg,
        false,
    )
    .unwrap();
    assert!(d[0].0.ends_with("tiny-Q4_K_M.gguf"));
    // A directory named after the quantization, matched case-insensitively.
    let f = hf::pull(
        &cache_root,
        &HubRef::parse("hf:tester/tiny-GGUF:f16").unwrap(),
        &cfg,
        false,
    )
    .unwrap();
    assert!(same_file(&f[0].0, &repo.join("F16/tiny-F16.gguf")));
    drop(server);
    // With the hub gone, cached names still resolve.
    let p = hf::resolve(&cache_root, "hf:tester/tiny-GGUF:Q8_0").unwrap();
    assert!(
        p.ends_with("tiny-Q8_0-00001-of-00002.gguf"),
        "{}",
        p.display()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn refusals_name_the_token_the_repository_and_the_quantization() {
    let dir = tmp("refuse");
    make_repo(&dir.join("root"));
    let server = Server::start(&dir.join("root"), &dir.join("log.jsonl"), &[]);
    let cache_root = dir.join("models");
    let pull = |name: &str, token: Option<&str>| {
        hf::pull(
            &cache_root,
            &HubRef::parse(name).unwrap(),
            &server.cfg(token),
            false,
        )
        .unwrap_err()
        .to_string()
    };
    let e = pull("hf:tester/tiny-GGUF:q8_0", None);
    assert!(e.contains("HF_TOKEN") && e.contains("401"), "{e}");
    let e = pull("hf:tester/tiny-GGUF:q8_0", Some("wrong"));
    assert!(e.contains("HF_TOKEN was refused"), "{e}");
    let e = pull("hf:tester/nope:q8_0", Some(TOKEN));
    assert!(e.contains("404"), "{e}");
    let e = pull("hf:tester/tiny-GGUF:IQ2_XXS", Some(TOKEN));
    assert!(
        e.contains("IQ2_XXS") && e.contains("F16, Q4_K_M, Q8_0"),
        "{e}"
    );
    assert!(
        !cache_root.join("hf/tester/tiny-GGUF").exists()
            || cache::list(&cache_root).unwrap().is_empty()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_cut_transfer_resumes_with_range_requests() {
    let dir = tmp("resume");
    let repo = make_repo(&dir.join("root"));
    let cache_root = dir.join("models");
    let r = HubRef::parse("hf:tester/tiny-GGUF:Q4_K_M").unwrap();
    // Each transfer is cut after 100000 bytes: the retries within one pull finish it.
    let server = Server::start(
        &dir.join("root"),
        &dir.join("log1.jsonl"),
        &["--cut", "tiny-Q4_K_M.gguf=100000"],
    );
    let got = hf::pull(&cache_root, &r, &server.cfg(Some(TOKEN)), false).unwrap();
    assert!(same_file(&got[0].0, &repo.join("tiny-Q4_K_M.gguf")));
    let ranges: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|q| q.0.starts_with("/cdn/"))
        .map(|q| q.1)
        .collect();
    assert_eq!(
        ranges,
        [
            None,
            Some("bytes=100000-".into()),
            Some("bytes=200000-".into())
        ]
    );
    drop(server);
    std::fs::remove_file(&got[0].0).unwrap();

    // Cut after 50000 bytes: four attempts leave 200000 of 300000; the pull fails, the
    // partial stays, and the next pull (a healthy hub) asks for the rest only.
    let cut = Server::start(
        &dir.join("root"),
        &dir.join("log2.jsonl"),
        &["--cut", "tiny-Q4_K_M.gguf=50000"],
    );
    let e = hf::pull(&cache_root, &r, &cut.cfg(Some(TOKEN)), false).unwrap_err();
    assert!(matches!(e, FetchError::Interrupted { .. }), "{e}");
    assert!(e.to_string().contains("run the same command again"), "{e}");
    let part = cache_root.join("hf/tester/tiny-GGUF/tiny-Q4_K_M.gguf.part");
    assert_eq!(std::fs::metadata(&part).unwrap().len(), 200_000);
    let listed = cache::list(&cache_root).unwrap();
    assert!(
        listed.iter().any(|m| m.partial && m.bytes == 200_000),
        "{listed:?}"
    );
    drop(cut);
    let ok = Server::start(&dir.join("root"), &dir.join("log3.jsonl"), &[]);
    let got = hf::pull(&cache_root, &r, &ok.cfg(Some(TOKEN)), false).unwrap();
    assert!(same_file(&got[0].0, &repo.join("tiny-Q4_K_M.gguf")));
    assert!(!part.exists());
    let cdn: Vec<_> = ok
        .requests()
        .into_iter()
        .filter(|q| q.0.starts_with("/cdn/"))
        .collect();
    assert_eq!(cdn.len(), 1);
    assert_eq!(cdn[0].1.as_deref(), Some("bytes=200000-"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_corrupted_download_is_refused_and_removed() {
    let dir = tmp("corrupt");
    make_repo(&dir.join("root"));
    let cache_root = dir.join("models");
    let server = Server::start(
        &dir.join("root"),
        &dir.join("log.jsonl"),
        &["--corrupt", "tiny-Q4_K_M.gguf"],
    );
    let r = HubRef::parse("hf:tester/tiny-GGUF:q4_k_m").unwrap();
    let e = hf::pull(&cache_root, &r, &server.cfg(Some(TOKEN)), false).unwrap_err();
    assert!(matches!(e, FetchError::ShaMismatch { .. }), "{e}");
    assert!(e.to_string().contains("removed"), "{e}");
    let d = cache_root.join("hf/tester/tiny-GGUF");
    for f in [
        "tiny-Q4_K_M.gguf",
        "tiny-Q4_K_M.gguf.part",
        "tiny-Q4_K_M.gguf.part.json",
    ] {
        assert!(!d.join(f).exists(), "{f} left behind");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn list_and_rm_see_hub_entries_as_sets() {
    let dir = tmp("list");
    make_repo(&dir.join("root"));
    let cache_root = dir.join("models");
    let server = Server::start(&dir.join("root"), &dir.join("log.jsonl"), &[]);
    let cfg = server.cfg(Some(TOKEN));
    for name in ["hf:tester/tiny-GGUF:q8_0", "hf:tester/tiny-GGUF:q4_k_m"] {
        hf::pull(&cache_root, &HubRef::parse(name).unwrap(), &cfg, false).unwrap();
    }
    std::fs::write(cache_root.join("local.gguf"), b"x").unwrap();
    // A known model's file is listed by the name to run it by (issue 30); control: the file
    // name itself, which `list` printed before.
    std::fs::write(cache_root.join("smollm2-135m-instruct-q4_1.gguf"), b"yy").unwrap();
    let names: Vec<_> = cache::list(&cache_root)
        .unwrap()
        .into_iter()
        .map(|m| (m.name, m.files.len(), m.bytes))
        .collect();
    assert_eq!(
        names,
        [
            ("local.gguf".into(), 1, 1),
            ("smollm2-135m".into(), 1, 2),
            ("hf:tester/tiny-GGUF:tiny-Q4_K_M.gguf".into(), 1, 300_000),
            (
                "hf:tester/tiny-GGUF:tiny-Q8_0-00001-of-00002.gguf".into(),
                2,
                190_001
            ),
        ]
    );
    let removed = cache::remove(&cache_root, "hf:tester/tiny-GGUF:Q8_0").unwrap();
    assert_eq!(removed.len(), 2);
    assert!(cache::remove(&cache_root, "hf:tester/tiny-GGUF:Q8_0").is_err());
    assert!(cache::remove(&cache_root, "../etc").is_err());
    cache::remove(&cache_root, "hf:tester/tiny-GGUF").unwrap();
    assert!(!cache_root.join("hf/tester/tiny-GGUF").exists());
    cache::remove(&cache_root, "local.gguf").unwrap();
    cache::remove(&cache_root, "smollm2-135m").unwrap();
    assert!(cache::list(&cache_root).unwrap().is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}
