//! A model: one GGUF file or a split set (`NAME-00001-of-0000N.gguf`) opened as one tensor
//! index. The first part carries the model metadata; `split.*` keys tie the parts together.

use crate::error::{Error, Result};
use crate::file::GgufFile;
use crate::header::{Metadata, TensorInfo};
use crate::types::GgmlType;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

pub const KEY_SPLIT_NO: &str = "split.no";
pub const KEY_SPLIT_COUNT: &str = "split.count";
pub const KEY_SPLIT_TENSORS: &str = "split.tensors.count";

/// A tensor in a model: which part holds it and its info there.
#[derive(Clone, Debug)]
pub struct ModelTensor {
    pub part: usize,
    pub info: TensorInfo,
}

#[derive(Debug)]
pub struct GgufModel {
    parts: Vec<GgufFile>,
    tensors: Vec<ModelTensor>,
    by_name: HashMap<String, usize>,
}

/// `(prefix, number, count)` from a `PREFIX-00001-of-00003.gguf` path.
pub fn parse_split_name(path: &Path) -> Option<(String, u32, u32)> {
    let name = path.file_name()?.to_str()?;
    let stem = name.strip_suffix(".gguf")?;
    let (rest, count) = stem.rsplit_once("-of-")?;
    let (prefix, no) = rest.rsplit_once('-')?;
    if no.len() != 5 || count.len() != 5 {
        return None;
    }
    Some((prefix.to_string(), no.parse().ok()?, count.parse().ok()?))
}

/// The path of part `no` (1-based) of `count` for a split prefix.
pub fn split_path(dir: &Path, prefix: &str, no: u32, count: u32) -> PathBuf {
    dir.join(format!("{prefix}-{no:05}-of-{count:05}.gguf"))
}

impl GgufModel {
    /// Opens a single file, or all parts of a split model given any of its parts.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufModel> {
        let path = path.as_ref();
        let first = GgufFile::open(path)?;
        let count = first.header().metadata.get_u64(KEY_SPLIT_COUNT);
        let Some(count) = count.filter(|&c| c > 1) else {
            if let Some((_, _, c)) = parse_split_name(path) {
                if c > 1 {
                    return Err(Error::Split {
                        path: path.into(),
                        problem: format!(
                            "file name says it is one of {c} parts but it has no {KEY_SPLIT_COUNT} key"
                        ),
                    });
                }
            }
            return Self::from_parts(vec![first]);
        };
        let split_err = |p: &Path, problem: String| Error::Split {
            path: p.into(),
            problem,
        };
        let Some((prefix, _, name_count)) = parse_split_name(path) else {
            return Err(split_err(
                path,
                format!(
                    "{KEY_SPLIT_COUNT} is {count} but the name is not PREFIX-NNNNN-of-MMMMM.gguf"
                ),
            ));
        };
        if name_count as u64 != count {
            return Err(split_err(
                path,
                format!("file name says {name_count} parts, {KEY_SPLIT_COUNT} says {count}"),
            ));
        }
        let dir = path.parent().unwrap_or(Path::new("."));
        let mut parts = Vec::with_capacity(count as usize);
        // The part we were given is already open; the others are found by name.
        let mut given = Some(first);
        for no in 1..=count as u32 {
            let p = split_path(dir, &prefix, no, count as u32);
            let f = match given.take_if(|f| f.path() == p) {
                Some(f) => f,
                None if !p.exists() => {
                    return Err(split_err(&p, format!("part {no} of {count} is missing")))
                }
                None => GgufFile::open(&p)?,
            };
            let md = &f.header().metadata;
            let got_no = md.get_u64(KEY_SPLIT_NO);
            if got_no != Some(no as u64 - 1) {
                return Err(split_err(
                    &p,
                    format!(
                        "{KEY_SPLIT_NO} is {got_no:?}, expected {} for part {no} (a duplicated or misnamed part)",
                        no - 1
                    ),
                ));
            }
            let got_count = md.get_u64(KEY_SPLIT_COUNT);
            if got_count != Some(count) {
                return Err(split_err(
                    &p,
                    format!("{KEY_SPLIT_COUNT} is {got_count:?}, expected {count} (part of another split)"),
                ));
            }
            parts.push(f);
        }
        let total = parts[0].header().metadata.get_u64(KEY_SPLIT_TENSORS);
        let model = Self::from_parts(parts)?;
        if let Some(total) = total {
            if total != model.tensors.len() as u64 {
                return Err(split_err(
                    path,
                    format!(
                        "{KEY_SPLIT_TENSORS} is {total} but the parts hold {} tensors",
                        model.tensors.len()
                    ),
                ));
            }
        }
        Ok(model)
    }

    fn from_parts(parts: Vec<GgufFile>) -> Result<GgufModel> {
        let mut tensors = Vec::new();
        let mut by_name = HashMap::new();
        for (pi, part) in parts.iter().enumerate() {
            for info in &part.header().tensors {
                if by_name.insert(info.name.clone(), tensors.len()).is_some() {
                    return Err(Error::Split {
                        path: part.path().into(),
                        problem: format!("tensor {:?} appears in more than one part", info.name),
                    });
                }
                tensors.push(ModelTensor {
                    part: pi,
                    info: info.clone(),
                });
            }
        }
        Ok(GgufModel {
            parts,
            tensors,
            by_name,
        })
    }

    /// Model metadata (from the first part).
    pub fn metadata(&self) -> &Metadata {
        &self.parts[0].header().metadata
    }
    pub fn parts(&self) -> &[GgufFile] {
        &self.parts
    }
    pub fn tensors(&self) -> &[ModelTensor] {
        &self.tensors
    }
    pub fn tensor(&self, name: &str) -> Option<&ModelTensor> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }
    /// Info and zero-copy bytes of a tensor, refusing a missing one by name.
    pub fn tensor_data(&self, name: &str) -> Result<(&TensorInfo, &[u8])> {
        let t = self
            .tensor(name)
            .ok_or_else(|| Error::MissingTensor { name: name.into() })?;
        Ok((&t.info, self.parts[t.part].tensor_bytes(&t.info)))
    }
    /// Refuses the first tensor whose type minfer cannot compute with, naming it.
    pub fn check_supported_types(&self) -> Result<()> {
        for t in &self.tensors {
            if !t.info.ty.is_supported() {
                return Err(Error::UnsupportedType {
                    name: t.info.name.clone(),
                    ty: t.info.ty.name().into(),
                });
            }
        }
        Ok(())
    }
    /// Total tensor bytes per type, in type-id order.
    pub fn bytes_per_type(&self) -> Vec<(GgmlType, u64, usize)> {
        let mut m: HashMap<GgmlType, (u64, usize)> = HashMap::new();
        for t in &self.tensors {
            let e = m.entry(t.info.ty).or_default();
            e.0 += t.info.n_bytes;
            e.1 += 1;
        }
        let mut v: Vec<_> = m.into_iter().map(|(t, (b, n))| (t, b, n)).collect();
        v.sort_by_key(|x| x.0.id());
        v
    }
}
