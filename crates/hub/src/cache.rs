//! What the models directory holds (`minfer list`) and removing an entry (`minfer rm`).
//!
//! Two kinds of entries: files directly in the directory (the known models, and any GGUF
//! put there by hand), and `hf/OWNER/REPO/PATH` files fetched by name, a split model's parts
//! counted as one entry. Unfinished downloads (`.part`) are listed as such, so their space is
//! visible, and removed with their entry.

use super::hf::{self, HubRef, Select};
use super::{find, FetchError, Result};
use std::path::{Path, PathBuf};

/// One model in the cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachedModel {
    /// What to pass as `-m`: a known model's name (`smollm2-135m`) for its file, else the
    /// file name, or `hf:OWNER/REPO:PATH`.
    pub name: String,
    /// The files, first part first.
    pub files: Vec<PathBuf>,
    pub bytes: u64,
    /// An unfinished download (a `.part` file), not usable until pulled again.
    pub partial: bool,
}

fn size(p: &Path) -> u64 {
    std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
}

fn is_gguf(name: &str) -> bool {
    name.to_ascii_lowercase().ends_with(".gguf")
}

fn is_part(name: &str) -> bool {
    name.to_ascii_lowercase().ends_with(".gguf.part")
}

/// Every model in `dir`, files in the directory first, then hub repositories by name.
pub fn list(dir: &Path) -> Result<Vec<CachedModel>> {
    let mut out = Vec::new();
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => {
            return Err(FetchError::Io {
                path: dir.into(),
                source: e,
            })
        }
    };
    let mut top: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
    top.sort();
    for p in &top {
        let Some(name) = p.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if p.is_file() && (is_gguf(name) || is_part(name)) {
            let file = name.trim_end_matches(".part");
            out.push(CachedModel {
                name: find(file).map_or(file, |m| m.name).into(),
                files: vec![p.clone()],
                bytes: size(p),
                partial: is_part(name),
            });
        }
    }
    let hf = dir.join("hf");
    for owner in sorted_dirs(&hf) {
        for repo in sorted_dirs(&owner) {
            let (Some(o), Some(r)) = (file_name(&owner), file_name(&repo)) else {
                continue;
            };
            list_repo(&repo, &format!("{o}/{r}"), &mut out);
        }
    }
    Ok(out)
}

fn file_name(p: &Path) -> Option<&str> {
    p.file_name().and_then(|n| n.to_str())
}

fn sorted_dirs(p: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(p)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| p.is_dir())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Relative paths of the files under `root`, `/`-separated, sorted.
fn files_under(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if let Some(rel) = p.strip_prefix(root).ok().and_then(|r| r.to_str()) {
                out.push(rel.replace(std::path::MAIN_SEPARATOR, "/"));
            }
        }
    }
    out.sort();
    out
}

fn list_repo(root: &Path, repo: &str, out: &mut Vec<CachedModel>) {
    let files = files_under(root);
    let mut done: Vec<String> = Vec::new();
    for rel in files.iter().filter(|f| is_gguf(f)) {
        if done.contains(rel) {
            continue;
        }
        let listing: Vec<hf::RepoFile> = files
            .iter()
            .filter(|f| is_gguf(f))
            .map(|f| hf::RepoFile {
                path: f.clone(),
                size: size(&root.join(f)),
                sha256: None,
            })
            .collect();
        // A split set comes as one entry (an incomplete one as its parts, one by one).
        let set = hf::choose(&listing, &Select::File(rel.clone()))
            .map(|s| s.files.into_iter().map(|f| f.path).collect::<Vec<_>>())
            .unwrap_or_else(|_| vec![rel.clone()]);
        let paths: Vec<PathBuf> = set.iter().map(|f| root.join(f)).collect();
        out.push(CachedModel {
            name: format!("hf:{repo}:{}", set[0]),
            bytes: paths.iter().map(|p| size(p)).sum(),
            files: paths,
            partial: false,
        });
        done.extend(set);
    }
    for rel in files.iter().filter(|f| is_part(f)) {
        let p = root.join(rel);
        out.push(CachedModel {
            name: format!("hf:{repo}:{}", rel.trim_end_matches(".part")),
            bytes: size(&p),
            files: vec![p],
            partial: true,
        });
    }
}

/// Removes a cached model: `hf:OWNER/REPO` (the whole repository), `hf:OWNER/REPO:QUANT` or
/// `:FILE.gguf` (that set, with any unfinished download of it), a known model's name, or a
/// file name in the directory. Returns the paths removed.
///
/// # Errors
/// A name that matches nothing in the cache ([`FetchError::NotCached`]), a path with
/// separators outside `hf:` names, and I/O failures.
pub fn remove(dir: &Path, name: &str) -> Result<Vec<PathBuf>> {
    let not_cached = || FetchError::NotCached {
        name: name.into(),
        dir: dir.into(),
    };
    let io = |p: &Path| {
        let p = p.to_path_buf();
        move |e| FetchError::Io { path: p, source: e }
    };
    if name.starts_with("hf:") {
        let r = HubRef::parse(name)?;
        let root = hf::cache_dir(dir, &r.repo);
        if !root.is_dir() {
            return Err(not_cached());
        }
        let removed: Vec<PathBuf> = match &r.select {
            Select::Default => {
                let files = files_under(&root)
                    .into_iter()
                    .map(|f| root.join(f))
                    .collect();
                std::fs::remove_dir_all(&root).map_err(io(&root))?;
                files
            }
            select => {
                let m = list(dir)?
                    .into_iter()
                    .filter(|m| m.name.starts_with(&format!("hf:{}:", r.repo)))
                    .find(|m| {
                        let listing: Vec<hf::RepoFile> = m
                            .files
                            .iter()
                            .filter_map(|f| f.strip_prefix(&root).ok()?.to_str())
                            .map(|rel| hf::RepoFile {
                                path: rel.trim_end_matches(".part").replace('\\', "/"),
                                size: 0,
                                sha256: None,
                            })
                            .collect();
                        hf::choose(&listing, select).is_ok()
                    })
                    .ok_or_else(not_cached)?;
                let mut removed = Vec::new();
                for f in &m.files {
                    for p in [f.clone(), with_suffix(f, ".json")] {
                        if p.exists() {
                            std::fs::remove_file(&p).map_err(io(&p))?;
                            removed.push(p);
                        }
                    }
                }
                prune_empty(&root, dir);
                removed
            }
        };
        return Ok(removed);
    }
    if name.contains('/') || name.contains(std::path::MAIN_SEPARATOR) || name.starts_with('.') {
        return Err(not_cached());
    }
    let file = find(name).map_or(name, |m| m.file);
    let p = dir.join(file);
    let mut removed = Vec::new();
    for p in [p.clone(), with_suffix(&p, ".part")] {
        if p.is_file() {
            std::fs::remove_file(&p).map_err(io(&p))?;
            removed.push(p);
        }
    }
    if removed.is_empty() {
        return Err(not_cached());
    }
    Ok(removed)
}

fn with_suffix(p: &Path, s: &str) -> PathBuf {
    let mut o = p.as_os_str().to_owned();
    o.push(s);
    PathBuf::from(o)
}

/// Removes empty directories from `from` up to (not including) `stop`.
fn prune_empty(from: &Path, stop: &Path) {
    let mut d = from.to_path_buf();
    for sub in sorted_dirs(&d) {
        prune_empty(&sub, &d);
    }
    while d.starts_with(stop) && d != stop {
        // remove_dir fails on a non-empty directory, which ends the walk up.
        if std::fs::remove_dir(&d).is_err() {
            break;
        }
        if !d.pop() {
            break;
        }
    }
}
