//! One file over HTTP(S) into the cache, resumable and verified.
//!
//! The bytes go to `<dest>.part`, beside a `<dest>.part.json` that records what they are
//! meant to become (size, SHA-256, the server's ETag). A later attempt with the same
//! expectations resumes with `Range: bytes=N-` (and `If-Range` with the ETag, so a changed
//! file restarts from zero instead of splicing two versions); a transfer cut short is
//! retried from where it stopped. Only a file of the listed size and hash is renamed to its
//! final name; a complete transfer that fails the check is removed, never kept.

use super::hf::{FileOutcome, HubConfig};
use super::{hash_file, FetchError, Result};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Attempts per file when the connection drops mid-transfer.
const ATTEMPTS: usize = 4;

/// What to fetch and what it must be.
#[derive(Clone, Debug)]
pub struct Transfer {
    pub url: String,
    pub dest: PathBuf,
    pub size: u64,
    pub sha256: Option<String>,
    /// Shown on the progress bar.
    pub label: String,
}

/// The HTTP agent: rustls, redirects followed (the `Authorization` header is not sent to
/// a redirect target), status codes handled here rather than as errors.
pub fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(10)
        .timeout_connect(Some(Duration::from_secs(30)))
        .timeout_recv_response(Some(Duration::from_secs(60)))
        .timeout_per_read(Some(Duration::from_secs(60)))
        .user_agent(concat!("minfer/", env!("CARGO_PKG_VERSION")))
        .build()
        .into()
}

fn request(
    agent: &ureq::Agent,
    cfg: &HubConfig,
    url: &str,
) -> ureq::RequestBuilder<ureq::typestate::WithoutBody> {
    let mut req = agent.get(url);
    if let Some(t) = &cfg.token {
        req = req.header("Authorization", format!("Bearer {t}"));
    }
    req
}

fn http_err(url: &str, e: ureq::Error) -> FetchError {
    FetchError::Hub {
        url: url.into(),
        detail: e.to_string(),
    }
}

fn status_err(url: &str, status: u16, token: bool) -> FetchError {
    let detail = match status {
        401 | 403 if !token => {
            format!("HTTP {status}: the repository needs an access token (set HF_TOKEN)")
        }
        401 | 403 => format!("HTTP {status}: HF_TOKEN was refused for this repository"),
        404 => "HTTP 404: no such repository, revision or file".into(),
        s => format!("HTTP {s}"),
    };
    FetchError::Hub {
        url: url.into(),
        detail,
    }
}

/// A small text response (a listing) and the `Link: <…>; rel="next"` URL, if any.
pub fn get_text(
    agent: &ureq::Agent,
    cfg: &HubConfig,
    url: &str,
) -> Result<(String, Option<String>)> {
    let mut resp = request(agent, cfg, url)
        .call()
        .map_err(|e| http_err(url, e))?;
    let status = resp.status().as_u16();
    if status != 200 {
        return Err(status_err(url, status, cfg.token.is_some()));
    }
    let next = resp
        .headers()
        .get_all("link")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .find(|l| l.contains("rel=\"next\""))
        .and_then(|l| Some(l.split_once('<')?.1.split_once('>')?.0.to_string()))
        .map(|n| absolute(&cfg.endpoint, &n));
    let body = resp
        .body_mut()
        .with_config()
        .limit(256 << 20)
        .read_to_string()
        .map_err(|e| http_err(url, e))?;
    Ok((body, next))
}

fn absolute(endpoint: &str, link: &str) -> String {
    if link.starts_with('/') {
        format!("{endpoint}{link}")
    } else {
        link.into()
    }
}

fn suffixed(p: &Path, suffix: &str) -> PathBuf {
    let mut s = p.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// `<dest>.part`, where a download grows.
pub fn part_path(dest: &Path) -> PathBuf {
    suffixed(dest, ".part")
}

fn meta_path(dest: &Path) -> PathBuf {
    suffixed(dest, ".part.json")
}

fn io(p: &Path) -> impl FnOnce(std::io::Error) -> FetchError + '_ {
    move |e| FetchError::Io {
        path: p.into(),
        source: e,
    }
}

/// The ETag a partial download was started under ("" when the server sent none), when it
/// was started for this very file (same size and hash); None when there is nothing to
/// resume or the partial is stale.
fn resumable_etag(t: &Transfer, part: &Path, meta: &Path) -> Option<String> {
    if !part.exists() {
        return None;
    }
    let m: serde_json::Value = serde_json::from_slice(&std::fs::read(meta).ok()?).ok()?;
    let same = m.get("size")?.as_u64()? == t.size
        && m.get("sha256").and_then(|s| s.as_str()) == t.sha256.as_deref();
    same.then(|| {
        m.get("etag")
            .and_then(|e| e.as_str())
            .unwrap_or_default()
            .to_string()
    })
}

fn write_meta(t: &Transfer, meta: &Path, etag: &str) -> Result<()> {
    let m = serde_json::json!({"url": t.url, "size": t.size, "sha256": t.sha256, "etag": etag});
    std::fs::write(meta, m.to_string()).map_err(io(meta))
}

fn bar(t: &Transfer, progress: bool) -> ProgressBar {
    if !progress {
        return ProgressBar::hidden();
    }
    ProgressBar::new(t.size)
        .with_style(
            ProgressStyle::with_template(
                "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} ({eta})",
            )
            .expect("static template"),
        )
        .with_message(t.label.clone())
}

/// Makes sure `t.dest` holds the file: already there with the right size → `Present`;
/// else downloaded (resuming a matching `.part`), checked and renamed → `Downloaded`.
///
/// # Errors
/// HTTP failures after the retries (the `.part` stays, to resume), and a size or SHA-256
/// mismatch of a complete transfer (the `.part` is removed).
pub fn fetch(
    agent: &ureq::Agent,
    cfg: &HubConfig,
    t: &Transfer,
    progress: bool,
) -> Result<FileOutcome> {
    if let Ok(m) = std::fs::metadata(&t.dest) {
        if m.len() == t.size {
            return Ok(FileOutcome::Present);
        }
        return Err(FetchError::SizeMismatch {
            path: t.dest.clone(),
            expected: t.size,
            got: m.len(),
        });
    }
    let dir = t.dest.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let part = part_path(&t.dest);
    let meta = meta_path(&t.dest);
    let mut etag = match resumable_etag(t, &part, &meta) {
        Some(e) => e,
        None => {
            let _ = std::fs::remove_file(&part);
            String::new()
        }
    };
    let bar = bar(t, progress);
    let mut last_err = None;
    for _ in 0..ATTEMPTS {
        match transfer_once(agent, cfg, t, &part, &meta, &mut etag, &bar) {
            Ok(()) => {
                last_err = None;
                break;
            }
            Err(Attempt::Retry(e)) => last_err = Some(e),
            Err(Attempt::Fatal(e)) => {
                bar.abandon();
                return Err(e);
            }
        }
    }
    bar.finish_and_clear();
    if let Some(e) = last_err {
        return Err(FetchError::Interrupted {
            path: part,
            detail: e.to_string(),
        });
    }
    verify(t, &part)?;
    // The `.part` was fsynced by the transfer; the rename is made durable, too
    // (minfer_gguf::atomic's protocol, with a resumable temporary of its own name).
    minfer_gguf::atomic::rename_durable(&part, &t.dest).map_err(FetchError::from_gguf)?;
    let _ = std::fs::remove_file(&meta);
    Ok(FileOutcome::Downloaded)
}

/// Size and hash of a complete `.part`; on a mismatch it is removed with its record.
fn verify(t: &Transfer, part: &Path) -> Result<()> {
    let refuse = |e: FetchError| {
        let _ = std::fs::remove_file(part);
        let _ = std::fs::remove_file(meta_path(&t.dest));
        Err(e)
    };
    let got = std::fs::metadata(part).map_err(io(part))?.len();
    if got != t.size {
        return refuse(FetchError::SizeMismatch {
            path: part.into(),
            expected: t.size,
            got,
        });
    }
    if let Some(want) = &t.sha256 {
        let got = hash_file(part, &ProgressBar::hidden())?;
        if !got.eq_ignore_ascii_case(want) {
            return refuse(FetchError::ShaMismatch {
                what: format!("{} (downloaded from {}; removed)", t.dest.display(), t.url),
                expected: want.clone(),
                got,
            });
        }
    }
    Ok(())
}

enum Attempt {
    /// The connection failed or dropped; the `.part` is good so far.
    Retry(FetchError),
    Fatal(FetchError),
}

fn transfer_once(
    agent: &ureq::Agent,
    cfg: &HubConfig,
    t: &Transfer,
    part: &Path,
    meta: &Path,
    etag: &mut String,
    bar: &ProgressBar,
) -> std::result::Result<(), Attempt> {
    let have = std::fs::metadata(part).map(|m| m.len()).unwrap_or(0);
    bar.set_position(have);
    if have == t.size {
        return Ok(());
    }
    if have > t.size {
        let _ = std::fs::remove_file(part);
        return Err(Attempt::Retry(FetchError::SizeMismatch {
            path: part.into(),
            expected: t.size,
            got: have,
        }));
    }
    let mut req = request(agent, cfg, &t.url);
    if have > 0 {
        req = req.header("Range", format!("bytes={have}-"));
        if !etag.is_empty() {
            req = req.header("If-Range", etag.as_str());
        }
    }
    let mut resp = req
        .call()
        .map_err(|e| Attempt::Retry(http_err(&t.url, e)))?;
    let status = resp.status().as_u16();
    let append = match status {
        206 if have > 0 => {
            let start = resp
                .headers()
                .get("content-range")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("bytes "))
                .and_then(|v| v.split('-').next())
                .and_then(|v| v.parse::<u64>().ok());
            if start != Some(have) {
                return Err(Attempt::Fatal(FetchError::Hub {
                    url: t.url.clone(),
                    detail: format!("asked for bytes from {have}, the server sent {start:?}"),
                }));
            }
            true
        }
        200 => false,
        // The server has nothing past our partial: it is not the file we think; start over.
        416 => {
            let _ = std::fs::remove_file(part);
            return Err(Attempt::Retry(status_err(
                &t.url,
                status,
                cfg.token.is_some(),
            )));
        }
        500..=599 => {
            return Err(Attempt::Retry(status_err(
                &t.url,
                status,
                cfg.token.is_some(),
            )))
        }
        s => return Err(Attempt::Fatal(status_err(&t.url, s, cfg.token.is_some()))),
    };
    if let Some(e) = resp.headers().get("etag").and_then(|v| v.to_str().ok()) {
        e.clone_into(etag);
    }
    write_meta(t, meta, etag).map_err(Attempt::Fatal)?;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .append(append)
        .truncate(!append)
        .open(part)
        .map_err(|e| Attempt::Fatal(io(part)(e)))?;
    if !append {
        bar.set_position(0);
    }
    let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
    let mut body = resp.body_mut().with_config().limit(u64::MAX).reader();
    let mut buf = vec![0u8; 1 << 16];
    let mut written = if append { have } else { 0 };
    loop {
        let n = match body.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                // Keep what arrived: the next attempt resumes after it.
                out.flush().map_err(|e| Attempt::Fatal(io(part)(e)))?;
                return Err(Attempt::Retry(FetchError::Hub {
                    url: t.url.clone(),
                    detail: format!("transfer cut at byte {written}: {e}"),
                }));
            }
        };
        if written + n as u64 > t.size {
            drop(out);
            let _ = std::fs::remove_file(part);
            let _ = std::fs::remove_file(meta);
            return Err(Attempt::Fatal(FetchError::SizeMismatch {
                path: part.into(),
                expected: t.size,
                got: written + n as u64,
            }));
        }
        out.write_all(&buf[..n])
            .map_err(|e| Attempt::Fatal(io(part)(e)))?;
        written += n as u64;
        bar.set_position(written);
    }
    let file = out
        .into_inner()
        .map_err(|e| Attempt::Fatal(io(part)(e.into_error())))?;
    file.sync_all().map_err(|e| Attempt::Fatal(io(part)(e)))?;
    if written < t.size {
        return Err(Attempt::Retry(FetchError::Hub {
            url: t.url.clone(),
            detail: format!(
                "the server closed the transfer at byte {written} of {}",
                t.size
            ),
        }));
    }
    Ok(())
}
