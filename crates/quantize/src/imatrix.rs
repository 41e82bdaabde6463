//! Importance matrices as llama-imatrix writes them, read the way llama-quantize reads them
//! (`common_imatrix_load` and `load_imatrix` in llama.cpp's `common/imatrix-loader.cpp` and
//! `tools/quantize/quantize.cpp`).
//!
//! Two formats:
//! - GGUF (llama-imatrix's default): keys `imatrix.datasets` (string array),
//!   `imatrix.chunk_count` and `imatrix.chunk_size` (u32, all three required), and per
//!   matrix two f32 tensors, `<name>.in_sum2` (ne0 x n_mat sums of squared activations) and
//!   `<name>.counts` (1 x n_mat token counts). A column's weight is its sum over its
//!   matrix's count rounded to an integer (1 where the count is 0).
//! - Legacy `.dat` (`--output-format dat`), little-endian: i32 entry count, then per entry
//!   i32 name length, the name, i32 ncall, i32 nval, nval f32 values (already means times
//!   ncall); then optionally i32 chunk count, i32 dataset-name length and the name. A
//!   column's weight is its value over ncall (the value itself when ncall <= 0).
//!
//! Where llama.cpp would read past a malformed file or divide by zero, this refuses it,
//! naming the file and the entry.

use crate::{Error, Result};
use minfer_gguf::{GgmlType, GgufFile, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Which format a file was in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImatrixFormat {
    Gguf,
    Legacy,
}

/// A loaded importance matrix: per tensor name, one weight per column (per expert, experts
/// one after another).
#[derive(Clone, Debug)]
pub struct Imatrix {
    /// The file name as given, which llama-quantize records in `quantize.imatrix.file`.
    pub file: String,
    pub format: ImatrixFormat,
    pub entries: BTreeMap<String, Vec<f32>>,
    pub datasets: Vec<String>,
    /// Chunks of text it was computed on (0 when the file does not say).
    pub chunk_count: u32,
}

fn bad(path: &Path, problem: impl Into<String>) -> Error {
    Error::Imatrix {
        path: path.to_path_buf(),
        problem: problem.into(),
    }
}

impl Imatrix {
    /// Reads a GGUF or legacy imatrix file (told apart by the GGUF magic).
    ///
    /// # Errors
    /// Unreadable or malformed files and GGUF files without the `imatrix.*` metadata, each
    /// naming the file (and the entry).
    pub fn load(path: &Path) -> Result<Imatrix> {
        let file = path
            .to_str()
            .ok_or_else(|| bad(path, "the file name is not UTF-8"))?
            .to_string();
        let bytes = std::fs::read(path).map_err(|source| Error::Io {
            path: PathBuf::from(path),
            source,
        })?;
        let mut m = if bytes.starts_with(b"GGUF") {
            drop(bytes);
            load_gguf(path)?
        } else {
            load_legacy(path, &bytes)?
        };
        m.file = file;
        Ok(m)
    }

    /// llama-quantize refuses non-finite weights in the entries it keeps (after
    /// [`Imatrix::filter`]); [`crate::quantize_model`] calls this.
    ///
    /// # Errors
    /// The first entry with a NaN or infinity, by name.
    pub fn check_finite(&self) -> Result<()> {
        for (name, v) in &self.entries {
            if let Some(x) = v.iter().find(|x| !x.is_finite()) {
                return Err(bad(
                    Path::new(&self.file),
                    format!("entry {name} contains the non-finite value {x}"),
                ));
            }
        }
        Ok(())
    }

    /// llama-quantize's `--include-weights` / `--exclude-weights`: keep only the entries
    /// whose name contains one of `include` (when given), drop those containing one of
    /// `exclude`.
    pub fn filter(&mut self, include: &[String], exclude: &[String]) {
        if !exclude.is_empty() {
            self.entries
                .retain(|name, _| !exclude.iter().any(|e| name.contains(e.as_str())));
        }
        if !include.is_empty() {
            self.entries
                .retain(|name, _| include.iter().any(|i| name.contains(i.as_str())));
        }
    }
}

/// A little-endian cursor over a legacy file.
struct Reader<'a> {
    path: &'a Path,
    bytes: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize, what: &str) -> Result<&[u8]> {
        let left = self.bytes.len() - self.pos;
        if n > left {
            return Err(bad(
                self.path,
                format!(
                    "truncated at offset {}: {what} needs {n} bytes, {left} left",
                    self.pos
                ),
            ));
        }
        let s = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn i32(&mut self, what: &str) -> Result<i32> {
        let b = self.take(4, what)?;
        Ok(i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// A length-prefixed name, cut at its first NUL as C reads it.
    fn name(&mut self, len: i32, what: &str) -> Result<String> {
        let len = usize::try_from(len)
            .map_err(|_| bad(self.path, format!("{what} has negative length {len}")))?;
        let b = self.take(len, what)?;
        let b = b.split(|&c| c == 0).next().unwrap_or(b);
        String::from_utf8(b.to_vec()).map_err(|_| bad(self.path, format!("{what} is not UTF-8")))
    }

    fn left(&self) -> usize {
        self.bytes.len() - self.pos
    }
}

fn load_legacy(path: &Path, bytes: &[u8]) -> Result<Imatrix> {
    let mut r = Reader {
        path,
        bytes,
        pos: 0,
    };
    let n = r.i32("the entry count")?;
    if n < 1 {
        return Err(bad(
            path,
            format!("no data: the legacy imatrix entry count is {n} (not GGUF either)"),
        ));
    }
    let mut entries = BTreeMap::new();
    for i in 1..=n {
        let what = format!("entry {i}'s name");
        let len = r.i32(&what)?;
        let name = r.name(len, &what)?;
        let ncall = r.i32(&format!("entry {name}'s ncall"))?;
        let nval = r.i32(&format!("entry {name}'s value count"))?;
        if nval < 1 {
            return Err(bad(path, format!("entry {name} has {nval} values")));
        }
        let raw = r.take(nval as usize * 4, &format!("entry {name}'s values"))?;
        let mut values: Vec<f32> = raw
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        // The values are sums / count * ncall; llama-quantize divides ncall back out.
        if ncall > 0 {
            let c = ncall as f32;
            for v in &mut values {
                *v /= c;
            }
        }
        if entries.insert(name.clone(), values).is_some() {
            return Err(bad(path, format!("entry {name} appears twice")));
        }
    }
    let (mut chunk_count, mut datasets) = (0, Vec::new());
    if r.left() > 0 {
        let c = r.i32("the chunk count after the entries")?;
        chunk_count = u32::try_from(c).unwrap_or(0);
        let len = r.i32("the dataset name's length")?;
        if len > 0 {
            datasets.push(r.name(len, "the dataset name")?);
        }
        if r.left() > 0 {
            return Err(bad(
                path,
                format!("{} unexpected bytes after the dataset name", r.left()),
            ));
        }
    }
    Ok(Imatrix {
        file: String::new(),
        format: ImatrixFormat::Legacy,
        entries,
        datasets,
        chunk_count,
    })
}

fn load_gguf(path: &Path) -> Result<Imatrix> {
    let f = GgufFile::open(path)?;
    let h = f.header();
    if h.tensors.is_empty() {
        return Err(bad(path, "no data: the GGUF imatrix has no tensors"));
    }
    let md = &h.metadata;
    let u32_key = |k: &str| -> Result<Option<u32>> {
        match md.get(k) {
            None => Ok(None),
            Some(Value::U32(v)) => Ok(Some(*v)),
            Some(v) => Err(bad(
                path,
                format!("{k} is {}, expected u32", v.value_type().name()),
            )),
        }
    };
    let chunk_count = u32_key("imatrix.chunk_count")?;
    let chunk_size = u32_key("imatrix.chunk_size")?;
    let datasets_v = md.get("imatrix.datasets");
    if datasets_v.is_none() || chunk_count.is_none() || chunk_size.is_none() {
        return Err(bad(
            path,
            "missing imatrix metadata (imatrix.datasets, imatrix.chunk_count and \
             imatrix.chunk_size are all required)",
        ));
    }
    let datasets = datasets_v
        .and_then(Value::as_array)
        .and_then(minfer_gguf::Array::as_strings)
        .map(|s| s.to_vec())
        .unwrap_or_default();
    // name -> (in_sum2, counts)
    type Pair<'a> = (
        Option<&'a minfer_gguf::TensorInfo>,
        Option<&'a minfer_gguf::TensorInfo>,
    );
    let mut pairs: BTreeMap<&str, Pair> = BTreeMap::new();
    for t in &h.tensors {
        if let Some(n) = t.name.strip_suffix(".in_sum2") {
            pairs.entry(n).or_default().0 = Some(t);
        } else if let Some(n) = t.name.strip_suffix(".counts") {
            pairs.entry(n).or_default().1 = Some(t);
        }
    }
    let floats = |t: &minfer_gguf::TensorInfo| -> Vec<f32> {
        f.tensor_bytes(t)
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    };
    let mut entries = BTreeMap::new();
    for (name, pair) in pairs {
        let (Some(sums), Some(counts)) = pair else {
            return Err(bad(
                path,
                format!("mismatched sums and counts for {name} (one of {name}.in_sum2 / {name}.counts is missing)"),
            ));
        };
        if sums.ty != GgmlType::F32 || counts.ty != GgmlType::F32 {
            return Err(bad(
                path,
                format!(
                    "sums and counts for {name} must be F32 (they are {} and {})",
                    sums.ty, counts.ty
                ),
            ));
        }
        let sums = floats(sums);
        // llama.cpp rounds the counts to integers (lround) before dividing by them.
        let counts: Vec<f32> = floats(counts)
            .into_iter()
            .map(|c| c.round() as i64 as f32)
            .collect();
        if counts.is_empty() || !sums.len().is_multiple_of(counts.len()) {
            return Err(bad(
                path,
                format!(
                    "entry {name}: {} sums do not split into {} matrices",
                    sums.len(),
                    counts.len()
                ),
            ));
        }
        let ne0 = sums.len() / counts.len();
        let mut e = vec![0f32; sums.len()];
        for (j, &count) in counts.iter().enumerate() {
            for i in 0..ne0 {
                e[j * ne0 + i] = if count > 0.0 {
                    sums[j * ne0 + i] / count
                } else {
                    1.0
                };
            }
        }
        entries.insert(name.to_string(), e);
    }
    if entries.is_empty() {
        return Err(bad(
            path,
            "no imatrix entries: no <name>.in_sum2 / <name>.counts tensors",
        ));
    }
    Ok(Imatrix {
        file: String::new(),
        format: ImatrixFormat::Gguf,
        entries,
        datasets,
        chunk_count: chunk_count.unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dat(entries: &[(&str, i32, &[f32])], trailer: &[u8]) -> Vec<u8> {
        let mut b = (entries.len() as i32).to_le_bytes().to_vec();
        for (name, ncall, values) in entries {
            b.extend((name.len() as i32).to_le_bytes());
            b.extend(name.as_bytes());
            b.extend(ncall.to_le_bytes());
            b.extend((values.len() as i32).to_le_bytes());
            values.iter().for_each(|v| b.extend(v.to_le_bytes()));
        }
        b.extend(trailer);
        b
    }

    /// Values come back over ncall (as is when ncall is 0); the trailer names the chunks
    /// and the dataset.
    #[test]
    fn legacy_values_are_divided_by_ncall() {
        let mut trailer = 7i32.to_le_bytes().to_vec();
        trailer.extend(4i32.to_le_bytes());
        trailer.extend(b"wiki");
        let b = dat(&[("a", 4, &[4.0, 10.0]), ("b", 0, &[3.0])], &trailer);
        let m = load_legacy(Path::new("x.dat"), &b).unwrap();
        assert_eq!(m.entries["a"], [1.0, 2.5]);
        assert_eq!(m.entries["b"], [3.0]);
        assert_eq!(
            (m.chunk_count, m.datasets.as_slice()),
            (7, &["wiki".to_string()][..])
        );
        let err = load_legacy(Path::new("x.dat"), &b[..b.len() - 2]).unwrap_err();
        assert!(err.to_string().contains("x.dat"), "{err}");
        let dup = dat(&[("a", 1, &[1.0]), ("a", 1, &[1.0])], &[]);
        let err = load_legacy(Path::new("x.dat"), &dup).unwrap_err();
        assert!(err.to_string().contains("entry a appears twice"), "{err}");
    }

    #[test]
    fn include_and_exclude_match_substrings() {
        let b = dat(
            &[
                ("blk.0.ffn_up.weight", 1, &[1.0]),
                ("blk.0.attn_v.weight", 1, &[1.0]),
            ],
            &[],
        );
        let m = load_legacy(Path::new("x.dat"), &b).unwrap();
        let mut e = m.clone();
        e.filter(&[], &["attn".into()]);
        assert_eq!(
            e.entries.keys().collect::<Vec<_>>(),
            ["blk.0.ffn_up.weight"]
        );
        let mut i = m.clone();
        i.filter(&["attn_v".into()], &[]);
        assert_eq!(
            i.entries.keys().collect::<Vec<_>>(),
            ["blk.0.attn_v.weight"]
        );
    }
}
