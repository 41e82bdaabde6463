//! The one policy of every command that writes a model file (`quantize`, `synth`, `convert`,
//! `split`, `merge`): an output that is one of the inputs is always refused; an existing
//! output is refused unless `--force` (`-y`) is given; a missing output directory is named
//! (not the hidden `.partial` file the writer would have created in it).

use anyhow::bail;
use std::path::{Path, PathBuf};

/// `--force` / `-y`, shared by the commands that write model files.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ForceArg {
    /// Overwrite an existing output file (an output that is the input is always refused).
    #[arg(short = 'y', long = "force", visible_alias = "yes")]
    pub force: bool,
}

/// Whether `a` and `b` are the same file (same device and inode; both must exist).
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

/// The directory a file is written in (`.` for a bare name).
pub fn dir_of(out: &Path) -> PathBuf {
    match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.into(),
        _ => PathBuf::from("."),
    }
}

/// Checks that `outs` may be written: none is a directory or one of `inputs`, each one's
/// directory exists, and none exists unless `force`. Returns the outputs that exist (which
/// the caller overwrites; `force` was given).
pub fn check_outputs(
    outs: &[PathBuf],
    inputs: &[PathBuf],
    force: bool,
) -> anyhow::Result<Vec<PathBuf>> {
    let mut existing = Vec::new();
    for out in outs {
        if let Some(i) = inputs.iter().find(|i| same_file(out, i)) {
            bail!(
                "the output {} is the input {}: write to another file (a model is never rewritten in place)",
                out.display(),
                i.display()
            );
        }
        if out.is_dir() {
            bail!(
                "the output {} is a directory; give a file name",
                out.display()
            );
        }
        let dir = dir_of(out);
        if !dir.is_dir() {
            bail!(
                "the output directory {} does not exist (create it first)",
                dir.display()
            );
        }
        if out.exists() {
            if !force {
                bail!(
                    "{} already exists; remove it or pass --force to overwrite it",
                    out.display()
                );
            }
            existing.push(out.clone());
        }
    }
    Ok(existing)
}

/// [`check_outputs`] for one output.
pub fn check_output(out: &Path, inputs: &[PathBuf], force: bool) -> anyhow::Result<()> {
    check_outputs(&[out.into()], inputs, force)?;
    Ok(())
}

/// Bytes free for an unprivileged user in the directory `dir` (None when unknown).
pub fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `st` a writable statvfs.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    // A pseudo file system (/proc) has no blocks at all: its free space means nothing.
    if st.f_blocks == 0 {
        return None;
    }
    Some((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

/// A byte count for people: `1.2 GB`, `340.5 MB`, `12.0 kB` (decimal units, as `df -H`).
pub fn human_bytes(b: u64) -> String {
    let b = b as f64;
    if b >= 1e12 {
        format!("{:.1} TB", b / 1e12)
    } else if b >= 1e9 {
        format!("{:.1} GB", b / 1e9)
    } else if b >= 1e6 {
        format!("{:.1} MB", b / 1e6)
    } else {
        format!("{:.1} kB", b / 1e3)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_input_is_refused_even_with_force() {
        let d = std::env::temp_dir().join(format!("minfer-output-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let f = d.join("m.gguf");
        std::fs::write(&f, b"x").unwrap();
        let e = check_output(&f, std::slice::from_ref(&f), true).unwrap_err();
        assert!(e.to_string().contains("is the input"), "{e}");
        let e = check_output(&f, &[], false).unwrap_err();
        assert!(e.to_string().contains("--force"), "{e}");
        assert!(check_output(&f, &[], true).is_ok());
        let e = check_output(&d.join("no/such/x.gguf"), &[], false).unwrap_err();
        assert!(e.to_string().contains("does not exist"), "{e}");
        assert!(!e.to_string().contains("partial"), "{e}");
        assert_eq!(human_bytes(1_500_000_000), "1.5 GB");
    }
}
