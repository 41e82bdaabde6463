//! Models by name from a Hugging Face–style hub: `hf:OWNER/REPO[:QUANT|:FILE]`.
//!
//! The hub's layout (huggingface.co; `HF_ENDPOINT` replaces the base URL):
//! - `GET {endpoint}/api/models/{repo}/tree/{revision}?recursive=true` lists the files as a
//!   JSON array of `{type, path, size, oid, lfs?: {oid, size, pointerSize}}`, where the LFS
//!   `oid` is the file's SHA-256; long listings continue at the `Link: <…>; rel="next"` URL.
//! - `GET {endpoint}/{repo}/resolve/{revision}/{path}` serves a file, usually through a
//!   redirect to a CDN; byte ranges are honoured (resume).
//! - `HF_TOKEN`, when set, goes as `Authorization: Bearer …` to the hub (not to the
//!   redirect target, which carries its own signature).
//!
//! Choosing files is a pure function of the listing ([`choose`]), so the rules are tested
//! without a network: a tag ending in `.gguf` names a file; any other tag is a quantization
//! label matched case-insensitively against each GGUF's label (`…-Q4_K_M.gguf`,
//! `…-Q4_K_M-00001-of-00003.gguf`, or a `Q4_K_M/` directory); no tag takes the only GGUF
//! set, else the `Q4_K_M` one (llama.cpp's default); split parts always come together.
//!
//! Files are cached as `{models_dir}/hf/{owner}/{repo}/{path}`; a name whose files are all
//! cached resolves without the network, choosing among the cached files by the same rules
//! (so a bare `hf:OWNER/REPO` is the only cached set when one is cached); `minfer pull`
//! always asks the hub. A cached file is trusted by its size; its hash was checked when it
//! was downloaded.

use super::download::{self, Transfer};
use super::{FetchError, Result};
use std::path::{Path, PathBuf};

/// The default hub.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";
/// What no tag means when a repository has several quantizations (llama.cpp's default).
pub const DEFAULT_QUANT: &str = "Q4_K_M";

/// A parsed `hf:` model name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HubRef {
    /// `owner/name`.
    pub repo: String,
    pub select: Select,
}

/// Which files of the repository a name asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Select {
    /// No tag: the only GGUF set, else the default quantization.
    Default,
    /// A quantization label such as `q4_k_m` (case-insensitive).
    Quant(String),
    /// A file path in the repository (ends in `.gguf`).
    File(String),
}

impl HubRef {
    /// Parses `hf:OWNER/REPO[:TAG]` (the `hf:` prefix is optional here).
    ///
    /// # Errors
    /// [`FetchError::BadHubName`] naming what is wrong.
    pub fn parse(name: &str) -> Result<HubRef> {
        let spec = name.strip_prefix("hf:").unwrap_or(name);
        let bad = |why: &str| FetchError::BadHubName {
            name: name.into(),
            why: why.into(),
        };
        let (repo, tag) = match spec.split_once(':') {
            Some((r, t)) => (r, Some(t)),
            None => (spec, None),
        };
        let mut segs = repo.split('/');
        let (Some(owner), Some(model), None) = (segs.next(), segs.next(), segs.next()) else {
            return Err(bad("expected hf:OWNER/REPO[:QUANT|:FILE.gguf]"));
        };
        let ok_seg = |s: &str| {
            !s.is_empty()
                && s != "."
                && s != ".."
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        };
        if !ok_seg(owner) || !ok_seg(model) {
            return Err(bad(
                "owner and repository are letters, digits, '-', '_' and '.'",
            ));
        }
        let select = match tag {
            None => Select::Default,
            Some("") => return Err(bad("empty tag after ':'")),
            Some(t) if t.to_ascii_lowercase().ends_with(".gguf") => {
                if t.split('/').any(|s| s.is_empty() || s == "." || s == "..") || t.contains('\\') {
                    return Err(bad("the file path must be relative, without '..'"));
                }
                Select::File(t.into())
            }
            Some(t) => Select::Quant(t.into()),
        };
        Ok(HubRef {
            repo: repo.into(),
            select,
        })
    }

    /// The name as the user writes it.
    pub fn display(&self) -> String {
        match &self.select {
            Select::Default => format!("hf:{}", self.repo),
            Select::Quant(q) | Select::File(q) => format!("hf:{}:{q}", self.repo),
        }
    }
}

/// Where the hub is and who we are to it.
#[derive(Clone, Debug)]
pub struct HubConfig {
    /// Base URL without a trailing slash.
    pub endpoint: String,
    pub token: Option<String>,
    pub revision: String,
}

impl HubConfig {
    /// `HF_ENDPOINT` (default huggingface.co) and `HF_TOKEN`, revision `main`.
    pub fn from_env() -> HubConfig {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        HubConfig {
            endpoint: var("HF_ENDPOINT")
                .unwrap_or_else(|| DEFAULT_ENDPOINT.into())
                .trim_end_matches('/')
                .to_string(),
            token: var("HF_TOKEN").map(|t| t.trim().to_string()),
            revision: "main".into(),
        }
    }

    pub fn tree_url(&self, repo: &str) -> String {
        format!(
            "{}/api/models/{repo}/tree/{}?recursive=true",
            self.endpoint, self.revision
        )
    }

    pub fn resolve_url(&self, repo: &str, path: &str) -> String {
        format!(
            "{}/{repo}/resolve/{}/{}",
            self.endpoint,
            self.revision,
            percent_encode_path(path)
        )
    }
}

/// Percent-encodes a repository path for a URL, keeping `/` and RFC 3986's unreserved
/// characters (file names may hold spaces, `+` or non-ASCII letters).
fn percent_encode_path(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for b in path.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A file in the repository listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepoFile {
    pub path: String,
    pub size: u64,
    /// SHA-256 (lowercase hex) when the hub gives one (LFS files).
    pub sha256: Option<String>,
}

/// `name-00001-of-00003.gguf` → (`name`, 1, 3), on the file name (any case of `.gguf`).
fn split_parts(file_name: &str) -> Option<(&str, u32, u32)> {
    let stem = strip_gguf(file_name)?;
    let (rest, count) = stem.rsplit_once("-of-")?;
    let (prefix, no) = rest.rsplit_once('-')?;
    if no.len() != 5 || count.len() != 5 {
        return None;
    }
    Some((prefix, no.parse().ok()?, count.parse().ok()?))
}

fn strip_gguf(name: &str) -> Option<&str> {
    let n = name.len().checked_sub(5)?;
    name.get(n..)?
        .eq_ignore_ascii_case(".gguf")
        .then(|| &name[..n])
}

/// The quantization label of a GGUF path: the last `-`/`.`-separated word of its stem
/// (split suffix removed), `Q4_K_M` in `Qwen2.5-0.5B-Instruct-Q4_K_M-00001-of-00002.gguf`.
pub fn quant_label(path: &str) -> Option<String> {
    let name = path.rsplit('/').next()?;
    let stem = match split_parts(name) {
        Some((prefix, _, _)) => prefix,
        None => strip_gguf(name)?,
    };
    let label = stem.rsplit(['-', '.']).next()?;
    (!label.is_empty()).then(|| label.to_ascii_uppercase())
}

/// A single GGUF or all parts of a split one, first part first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileSet {
    pub files: Vec<RepoFile>,
}

impl FileSet {
    pub fn first(&self) -> &RepoFile {
        &self.files[0]
    }
    pub fn size(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }
}

/// Groups the GGUF files of a listing into sets (a split model's parts together).
/// Incomplete split sets are kept with the parts they have; [`choose`] refuses them.
fn gguf_sets(files: &[RepoFile]) -> Vec<(String, FileSet, Option<u32>)> {
    let mut sets: Vec<(String, FileSet, Option<u32>)> = Vec::new();
    for f in files.iter().filter(|f| strip_gguf(&f.path).is_some()) {
        let (dir, name) = f.path.rsplit_once('/').unwrap_or(("", &f.path));
        let (key, count) = match split_parts(name) {
            Some((prefix, _, count)) => (format!("{dir}/{prefix}#{count}"), Some(count)),
            None => (f.path.clone(), None),
        };
        match sets.iter_mut().find(|(k, _, _)| *k == key) {
            Some((_, s, _)) => s.files.push(f.clone()),
            None => sets.push((
                key,
                FileSet {
                    files: vec![f.clone()],
                },
                count,
            )),
        }
    }
    for (_, s, _) in &mut sets {
        s.files.sort_by(|a, b| a.path.cmp(&b.path));
    }
    sets
}

fn is_projector(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path).to_ascii_lowercase();
    name.starts_with("mmproj")
}

fn check_complete(set: &FileSet, count: Option<u32>) -> Result<()> {
    if let Some(count) = count {
        if set.files.len() != count as usize {
            return Err(FetchError::HubChoice {
                what: set.first().path.clone(),
                why: format!(
                    "a split of {count} parts, but the repository lists {}",
                    set.files.len()
                ),
            });
        }
    }
    Ok(())
}

/// The files a selection names in a listing.
///
/// # Errors
/// [`FetchError::HubChoice`] when nothing matches (listing the labels there are), when a
/// label matches more than one set, or when a split set is incomplete.
pub fn choose(files: &[RepoFile], select: &Select) -> Result<FileSet> {
    let sets = gguf_sets(files);
    let labels = || {
        let mut l: Vec<String> = sets
            .iter()
            .filter(|(_, s, _)| !is_projector(&s.first().path))
            .filter_map(|(_, s, _)| quant_label(&s.first().path))
            .collect();
        l.sort();
        l.dedup();
        if l.is_empty() {
            "no GGUF files".into()
        } else {
            format!("quantizations here: {}", l.join(", "))
        }
    };
    let pick = |found: Vec<&(String, FileSet, Option<u32>)>, what: &str| -> Result<FileSet> {
        match found.as_slice() {
            [] => Err(FetchError::HubChoice {
                what: what.into(),
                why: format!("no match ({})", labels()),
            }),
            [(_, s, count)] => {
                check_complete(s, *count)?;
                Ok(s.clone())
            }
            many => Err(FetchError::HubChoice {
                what: what.into(),
                why: format!(
                    "matches {} files; name one with :FILE.gguf ({})",
                    many.len(),
                    many.iter()
                        .map(|(_, s, _)| s.first().path.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            }),
        }
    };
    match select {
        Select::File(path) => {
            let found = sets
                .iter()
                .filter(|(_, s, _)| s.files.iter().any(|f| f.path == *path))
                .collect();
            pick(found, path)
        }
        Select::Quant(q) => {
            let q = q.to_ascii_uppercase();
            let found = sets
                .iter()
                .filter(|(_, s, _)| !is_projector(&s.first().path))
                .filter(|(_, s, _)| {
                    let p = &s.first().path;
                    let in_dir = p.rsplit_once('/').is_some_and(|(d, _)| {
                        d.rsplit('/').next().unwrap_or(d).eq_ignore_ascii_case(&q)
                    });
                    quant_label(p).as_deref() == Some(q.as_str()) || in_dir
                })
                .collect();
            pick(found, &q)
        }
        Select::Default => {
            let models: Vec<_> = sets
                .iter()
                .filter(|(_, s, _)| !is_projector(&s.first().path))
                .collect();
            if models.len() == 1 {
                return pick(models, "the only GGUF");
            }
            choose(files, &Select::Quant(DEFAULT_QUANT.into())).map_err(|e| match e {
                FetchError::HubChoice { why, .. } => FetchError::HubChoice {
                    what: "no tag".into(),
                    why: format!(
                        "several GGUF files and the default {DEFAULT_QUANT}: {why}; add :QUANT"
                    ),
                },
                other => other,
            })
        }
    }
}

/// `{models_dir}/hf/{owner}/{repo}`.
pub fn cache_dir(models_dir: &Path, repo: &str) -> PathBuf {
    let (owner, name) = repo.split_once('/').unwrap_or(("", repo));
    models_dir.join("hf").join(owner).join(name)
}

/// The cached files of a repository as a listing (no hashes), in-progress downloads left out.
fn cached_listing(dir: &Path) -> Vec<RepoFile> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(dir.join(&rel)) else {
            continue;
        };
        for e in rd.flatten() {
            let Ok(ty) = e.file_type() else { continue };
            let rel = rel.join(e.file_name());
            if ty.is_dir() {
                stack.push(rel);
            } else if let (true, Some(p)) = (ty.is_file(), rel.to_str()) {
                if strip_gguf(p).is_some() {
                    let size = e.metadata().map(|m| m.len()).unwrap_or(0);
                    out.push(RepoFile {
                        path: p.replace(std::path::MAIN_SEPARATOR, "/"),
                        size,
                        sha256: None,
                    });
                }
            }
        }
    }
    out
}

/// The cached first part for a name, when every file of its set is in the cache.
pub fn find_cached(models_dir: &Path, r: &HubRef) -> Option<PathBuf> {
    let dir = cache_dir(models_dir, &r.repo);
    let set = choose(&cached_listing(&dir), &r.select).ok()?;
    Some(dir.join(&set.first().path))
}

/// Asks the hub for the repository's files (all pages).
pub fn list_files(agent: &ureq::Agent, cfg: &HubConfig, repo: &str) -> Result<Vec<RepoFile>> {
    let mut url = cfg.tree_url(repo);
    let mut files = Vec::new();
    for _page in 0..1000 {
        let (body, next) = download::get_text(agent, cfg, &url)?;
        let entries: serde_json::Value =
            serde_json::from_str(&body).map_err(|e| FetchError::Hub {
                url: url.clone(),
                detail: format!("the file listing is not JSON: {e}"),
            })?;
        let arr = entries.as_array().ok_or_else(|| FetchError::Hub {
            url: url.clone(),
            detail: "the file listing is not a JSON array".into(),
        })?;
        for e in arr {
            if e.get("type").and_then(|t| t.as_str()) != Some("file") {
                continue;
            }
            let (Some(path), Some(size)) = (
                e.get("path").and_then(|p| p.as_str()),
                e.get("size").and_then(|s| s.as_u64()),
            ) else {
                return Err(FetchError::Hub {
                    url: url.clone(),
                    detail: format!("a file entry without path or size: {e}"),
                });
            };
            let lfs = e.get("lfs");
            let sha256 = lfs
                .and_then(|l| l.get("oid"))
                .and_then(|o| o.as_str())
                .map(|o| o.trim_start_matches("sha256:").to_ascii_lowercase());
            let size = lfs
                .and_then(|l| l.get("size"))
                .and_then(|s| s.as_u64())
                .unwrap_or(size);
            files.push(RepoFile {
                path: path.into(),
                size,
                sha256,
            });
        }
        match next {
            Some(n) => url = n,
            None => return Ok(files),
        }
    }
    Err(FetchError::Hub {
        url,
        detail: "more than 1000 pages of files".into(),
    })
}

/// What [`pull`] did with one file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileOutcome {
    /// Already cached with the listed size and hash.
    Present,
    Downloaded,
}

/// Resolves a name against the hub and makes sure its files are cached and verified.
/// Returns each file's local path and what was done, first part first.
pub fn pull(
    models_dir: &Path,
    r: &HubRef,
    cfg: &HubConfig,
    progress: bool,
) -> Result<Vec<(PathBuf, FileOutcome)>> {
    let agent = download::agent();
    let files = list_files(&agent, cfg, &r.repo)?;
    let set = choose(&files, &r.select).map_err(|e| match e {
        FetchError::HubChoice { what, why } => FetchError::HubChoice {
            what: format!("{}: {what}", r.display()),
            why,
        },
        other => other,
    })?;
    let dir = cache_dir(models_dir, &r.repo);
    let mut out = Vec::with_capacity(set.files.len());
    for f in &set.files {
        let dest = dir.join(&f.path);
        let t = Transfer {
            url: cfg.resolve_url(&r.repo, &f.path),
            dest: dest.clone(),
            size: f.size,
            sha256: f.sha256.clone(),
            label: f.path.clone(),
        };
        let outcome = download::fetch(&agent, cfg, &t, progress)?;
        out.push((dest, outcome));
    }
    Ok(out)
}

/// The local path of `hf:…`: the cache when it holds the whole set, else a pull.
pub fn resolve(models_dir: &Path, name: &str) -> Result<PathBuf> {
    let r = HubRef::parse(name)?;
    if let Some(p) = find_cached(models_dir, &r) {
        return Ok(p);
    }
    let pulled = pull(models_dir, &r, &HubConfig::from_env(), true)?;
    Ok(pulled
        .into_iter()
        .next()
        .expect("a chosen set has a file")
        .0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(path: &str) -> RepoFile {
        RepoFile {
            path: path.into(),
            size: 1,
            sha256: None,
        }
    }

    fn paths(s: &FileSet) -> Vec<&str> {
        s.files.iter().map(|f| f.path.as_str()).collect()
    }

    #[test]
    fn names_parse_and_bad_names_are_refused() {
        let r = HubRef::parse("hf:Qwen/Qwen2.5-0.5B-Instruct-GGUF:q4_k_m").unwrap();
        assert_eq!(r.repo, "Qwen/Qwen2.5-0.5B-Instruct-GGUF");
        assert_eq!(r.select, Select::Quant("q4_k_m".into()));
        let r = HubRef::parse("hf:a/b:sub/x-Q8_0.GGUF").unwrap();
        assert_eq!(r.select, Select::File("sub/x-Q8_0.GGUF".into()));
        assert_eq!(HubRef::parse("hf:a/b").unwrap().select, Select::Default);
        for bad in [
            "hf:a",
            "hf:a/b/c",
            "hf:/b",
            "hf:a/b:",
            "hf:../b",
            "hf:a/b:../x.gguf",
            "hf:a b/c",
        ] {
            assert!(HubRef::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn quant_labels_come_from_the_stem_without_the_split_suffix() {
        assert_eq!(quant_label("m-Q4_K_M.gguf").as_deref(), Some("Q4_K_M"));
        assert_eq!(
            quant_label("Llama-3.2-1B.Q8_0.gguf").as_deref(),
            Some("Q8_0")
        );
        assert_eq!(
            quant_label("d/m-q6_k-00002-of-00003.gguf").as_deref(),
            Some("Q6_K")
        );
        assert_eq!(quant_label("README.md"), None);
    }

    #[test]
    fn resolve_urls_percent_encode_the_path() {
        let cfg = HubConfig {
            endpoint: "http://h".into(),
            token: None,
            revision: "main".into(),
        };
        assert_eq!(
            cfg.resolve_url("a/b", "dir/m Q4+x.gguf"),
            "http://h/a/b/resolve/main/dir/m%20Q4%2Bx.gguf"
        );
    }

    #[test]
    fn quantizations_match_case_insensitively_and_splits_come_together() {
        let files = [
            f("README.md"),
            f("m-Q4_K_M.gguf"),
            f("m-Q4_K_S.gguf"),
            f("m-Q8_0-00002-of-00002.gguf"),
            f("m-Q8_0-00001-of-00002.gguf"),
            f("mmproj-m-f16.gguf"),
            f("BF16/m-BF16-00001-of-00002.gguf"),
            f("BF16/m-BF16-00002-of-00002.gguf"),
        ];
        let c = |s: Select| choose(&files, &s);
        assert_eq!(
            paths(&c(Select::Quant("q4_k_m".into())).unwrap()),
            ["m-Q4_K_M.gguf"]
        );
        assert_eq!(
            paths(&c(Select::Quant("Q8_0".into())).unwrap()),
            ["m-Q8_0-00001-of-00002.gguf", "m-Q8_0-00002-of-00002.gguf"]
        );
        assert_eq!(c(Select::Quant("bf16".into())).unwrap().files.len(), 2);
        // No tag and several sets: the default quantization.
        assert_eq!(paths(&c(Select::Default).unwrap()), ["m-Q4_K_M.gguf"]);
        // A file by name brings its whole split set.
        assert_eq!(
            c(Select::File("m-Q8_0-00002-of-00002.gguf".into()))
                .unwrap()
                .files
                .len(),
            2
        );
        let e = c(Select::Quant("Q4_K".into())).unwrap_err().to_string();
        assert!(e.contains("no match") && e.contains("Q4_K_S"), "{e}");
        assert!(c(Select::File("nope.gguf".into())).is_err());
    }

    #[test]
    fn ambiguous_incomplete_and_default_less_choices_are_refused() {
        let two = [f("a/m-Q4_0.gguf"), f("b/m-Q4_0.gguf")];
        let e = choose(&two, &Select::Quant("q4_0".into()))
            .unwrap_err()
            .to_string();
        assert!(e.contains("matches 2 files"), "{e}");
        let missing = [
            f("m-Q8_0-00001-of-00003.gguf"),
            f("m-Q8_0-00003-of-00003.gguf"),
        ];
        let e = choose(&missing, &Select::Quant("q8_0".into()))
            .unwrap_err()
            .to_string();
        assert!(e.contains("split of 3 parts"), "{e}");
        let no_default = [f("m-Q8_0.gguf"), f("m-F16.gguf")];
        let e = choose(&no_default, &Select::Default)
            .unwrap_err()
            .to_string();
        assert!(e.contains("add :QUANT") && e.contains("F16, Q8_0"), "{e}");
        let one = [f("m-F16.gguf"), f("mmproj-x.gguf")];
        assert_eq!(
            paths(&choose(&one, &Select::Default).unwrap()),
            ["m-F16.gguf"]
        );
    }
}
