//! Crash-safe file writes, shared by every writer of a user file (model files, sessions,
//! downloads; issue 34).
//!
//! The one protocol: bytes go to `<final>.partial` in the same directory (a rename is only
//! atomic within one file system), the temporary is fsynced, renamed over the final name,
//! and the directory is fsynced so the rename itself survives a power cut. A process
//! killed at any moment therefore leaves under the final name either what was there
//! before (or nothing) or the complete new file, never a prefix of it.
//!
//! - [`AtomicFile`] is the writer; [`AtomicFile::commit`] does the whole protocol.
//! - [`AtomicFile::finish`] stops before the rename and hands back a [`Staged`] file, so a
//!   set of files (split parts) is renamed only once every member is complete.
//! - Dropping either without committing removes the temporary: an error path cannot
//!   forget it. A `kill -9` leaves the `.partial` behind (no code runs); the next write of
//!   the same name truncates and reuses it.
//! - Write errors are annotated with how many bytes were written of how many, and where,
//!   so a full disk reads "No space left on device … after 4194304 of 60000000 bytes".

use crate::{Error, Result};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// `<path>.partial`: where a file is assembled before it is renamed into place.
pub fn partial_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".partial");
    PathBuf::from(s)
}

/// The directory holding `path` (`.` for a bare file name).
fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Fsyncs the directory holding `path`, so a rename or create in it is on disk.
pub fn sync_parent_dir(path: &Path) -> Result<()> {
    let dir = parent_dir(path);
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|source| Error::Io {
            path: dir.into(),
            source,
        })
}

/// Renames `from` over `to` and fsyncs the directory: for a writer that has fsynced its
/// own temporary (a resumable download's `.part`). Both must be in one directory.
pub fn rename_durable(from: &Path, to: &Path) -> Result<()> {
    std::fs::rename(from, to).map_err(|source| Error::Io {
        path: to.into(),
        source,
    })?;
    sync_parent_dir(to)
}

/// Writes `bytes` to `path` crash-safely (the whole protocol, for a file held in memory).
pub fn write_bytes(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = AtomicFile::create(path, Some(bytes.len() as u64))?;
    f.write_all(bytes).map_err(|source| Error::Io {
        path: path.into(),
        source,
    })?;
    f.commit()
}

/// A file being written under a temporary name next to its final one.
pub struct AtomicFile {
    dest: PathBuf,
    tmp: PathBuf,
    // None only after `finish` took it (drop then has nothing to flush).
    out: Option<BufWriter<File>>,
    written: u64,
    total: Option<u64>,
}

impl AtomicFile {
    /// Creates (or truncates a stale) `<dest>.partial`. `total`, when known, is only used to
    /// say "N of M bytes" in a write error.
    pub fn create(dest: &Path, total: Option<u64>) -> Result<AtomicFile> {
        let tmp = partial_path(dest);
        let file = File::create(&tmp).map_err(|source| Error::Io {
            path: tmp.clone(),
            source,
        })?;
        Ok(AtomicFile {
            dest: dest.into(),
            tmp,
            out: Some(BufWriter::with_capacity(1 << 20, file)),
            written: 0,
            total,
        })
    }

    /// Bytes accepted so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// The temporary's path (for messages).
    pub fn tmp_path(&self) -> &Path {
        &self.tmp
    }

    /// The io error `e` with where it happened and how far the write had come.
    fn annotate(&self, e: std::io::Error) -> std::io::Error {
        let of = self.total.map_or(String::new(), |t| format!(" of {t}"));
        std::io::Error::new(
            e.kind(),
            format!(
                "{e} after {}{of} bytes written to {} (the partial file is removed)",
                self.written,
                self.tmp.display()
            ),
        )
    }

    /// Flushes and fsyncs the temporary; the final name is not touched yet.
    pub fn finish(mut self) -> Result<Staged> {
        let out = self.out.take().expect("finish runs once");
        let file = match out.into_inner() {
            Ok(f) => f,
            Err(e) => {
                let source = self.annotate(e.into_error());
                return Err(Error::Io {
                    path: self.dest.clone(),
                    source,
                });
            }
        };
        file.sync_all().map_err(|e| Error::Io {
            path: self.dest.clone(),
            source: self.annotate(e),
        })?;
        drop(file);
        // Ownership of the temporary moves to `Staged`; this drop must not remove it.
        let staged = Staged {
            dest: std::mem::take(&mut self.dest),
            tmp: std::mem::take(&mut self.tmp),
            done: false,
        };
        Ok(staged)
    }

    /// The whole protocol: flush, fsync, rename over the final name, fsync the directory.
    pub fn commit(self) -> Result<()> {
        self.finish()?.commit()
    }
}

impl Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let out = self.out.as_mut().expect("not finished");
        match out.write(buf) {
            Ok(n) => {
                self.written += n as u64;
                Ok(n)
            }
            Err(e) => Err(self.annotate(e)),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let out = self.out.as_mut().expect("not finished");
        out.flush().map_err(|e| self.annotate(e))
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if self.tmp.as_os_str().is_empty() {
            return;
        }
        // Unflushed bytes are discarded with the file; only the temporary's removal matters,
        // and a failure to remove it (already gone) changes no error being reported.
        if let Some(out) = self.out.take() {
            let (file, _) = out.into_parts();
            drop(file);
        }
        let _ = std::fs::remove_file(&self.tmp);
    }
}

/// A complete, fsynced temporary waiting to be renamed over its final name.
pub struct Staged {
    dest: PathBuf,
    tmp: PathBuf,
    done: bool,
}

impl Staged {
    /// The final name.
    pub fn dest(&self) -> &Path {
        &self.dest
    }

    /// Renames the temporary over the final name and fsyncs the directory.
    pub fn commit(mut self) -> Result<()> {
        std::fs::rename(&self.tmp, &self.dest).map_err(|source| Error::Io {
            path: self.dest.clone(),
            source,
        })?;
        self.done = true;
        sync_parent_dir(&self.dest)
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if !self.done {
            // Best effort, as in AtomicFile's drop.
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Commits staged files in order: every member is complete on disk before the first rename,
/// so a failure (or a kill) before the renames leaves no new member under its name.
pub fn commit_all(staged: Vec<Staged>) -> Result<()> {
    let mut it = staged.into_iter();
    for s in it.by_ref() {
        // The rest are dropped on error, which removes their temporaries.
        s.commit()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("minfer-atomic-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn names(d: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn commit_replaces_the_old_file_and_leaves_no_temporary() {
        let d = tmpdir("commit");
        let p = d.join("f.bin");
        std::fs::write(&p, b"old").unwrap();
        let mut f = AtomicFile::create(&p, None).unwrap();
        f.write_all(b"new bytes").unwrap();
        // Until the commit the old file is what the name holds.
        assert_eq!(std::fs::read(&p).unwrap(), b"old");
        f.commit().unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"new bytes");
        assert_eq!(names(&d), ["f.bin"]);
    }

    #[test]
    fn a_dropped_writer_or_staged_file_leaves_the_old_file_and_no_temporary() {
        let d = tmpdir("drop");
        let p = d.join("f.bin");
        std::fs::write(&p, b"old").unwrap();
        let mut f = AtomicFile::create(&p, None).unwrap();
        f.write_all(b"half").unwrap();
        drop(f);
        assert_eq!(names(&d), ["f.bin"]);
        let mut f = AtomicFile::create(&p, None).unwrap();
        f.write_all(b"staged").unwrap();
        drop(f.finish().unwrap());
        assert_eq!(names(&d), ["f.bin"]);
        assert_eq!(std::fs::read(&p).unwrap(), b"old");
    }

    #[test]
    fn a_bare_file_name_syncs_the_current_directory() {
        // `parent()` of a bare name is "", which File::open refuses; "." must be used.
        assert_eq!(parent_dir(Path::new("x.gguf")), Path::new("."));
        sync_parent_dir(Path::new("x.gguf")).unwrap();
    }
}
