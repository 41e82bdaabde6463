//! `--keep-split`: the output as a split set with the input's parts, laid out as
//! llama-quantize lays it out (facts from llama.cpp's src/llama-quant.cpp and
//! tools/quantize/quantize.cpp):
//!
//! - the tensors are visited, planned and written in file order (by input part, then by
//!   offset in the part) instead of llama.cpp's layer-then-name map order, and each one goes
//!   to the output part of the same number as its input part;
//! - OUT loses a trailing `.gguf`, and part `k` of `n` is `OUT-0000k-of-0000n.gguf` (the
//!   naming of llama-gguf-split);
//! - the first part carries the whole output metadata (as an unsplit output's), later parts
//!   none of it; when there is more than one part, every part then gets `split.no` (u16,
//!   0-based), `split.count` (u16) and `split.tensors.count` (i32) in that order, which is
//!   not gguf-split's order (it sets the count last);
//! - an unsplit input still gives one part, `OUT-00001-of-00001.gguf`, with no split keys.

use crate::{Error, Result};
use minfer_gguf::model::{split_path, KEY_SPLIT_COUNT, KEY_SPLIT_NO, KEY_SPLIT_TENSORS};
use minfer_gguf::{GgufModel, Metadata, Value};
use std::ops::Range;
use std::path::{Path, PathBuf};

/// One output part: its file, its metadata, and the run of the plan it holds.
pub(crate) struct OutputPart {
    pub path: PathBuf,
    pub metadata: Metadata,
    pub tensors: Range<usize>,
}

/// The input's tensor names in file order, each with its input part.
pub(crate) fn file_order(model: &GgufModel) -> Vec<(&str, usize)> {
    let mut v: Vec<(&str, usize, u64)> = model
        .tensors()
        .iter()
        .map(|t| (t.info.name.as_str(), t.part, t.info.offset))
        .collect();
    v.sort_by_key(|&(_, part, offset)| (part, offset));
    v.into_iter().map(|(n, p, _)| (n, p)).collect()
}

/// The path prefix the parts are named from: `output` without a trailing `.gguf`.
/// llama-quantize cuts the last five characters whenever `.gguf` occurs anywhere in the
/// name; for a name with `.gguf` elsewhere that mangles it, so such a name is refused.
fn prefix(output: &Path) -> Result<(PathBuf, String)> {
    let bad = |problem: &str| Error::KeepSplitOutput {
        path: output.into(),
        problem: problem.to_string(),
    };
    let name = output
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| bad("the file name is not UTF-8"))?;
    let stem = name.strip_suffix(".gguf").unwrap_or(name);
    if stem.contains(".gguf") {
        return Err(bad(
            "\".gguf\" inside the name: llama-quantize would cut its last 5 characters; \
             give OUT ending in .gguf or without .gguf",
        ));
    }
    if stem.is_empty() {
        return Err(bad("empty name"));
    }
    let dir = output.parent().unwrap_or(Path::new("")).to_path_buf();
    Ok((dir, stem.to_string()))
}

/// The output parts for a plan whose entries come from input parts `part_of` (in file
/// order, so non-decreasing), `first` being the first part's metadata.
///
/// # Errors
/// An unusable OUT name, and an input part after the first that holds no tensors
/// (llama-quantize assumes there is none and crashes on one).
pub(crate) fn layout(
    output: &Path,
    first: Metadata,
    part_of: &[usize],
    n_parts: usize,
) -> Result<Vec<OutputPart>> {
    let (dir, stem) = prefix(output)?;
    let n_tensors = i32::try_from(part_of.len()).map_err(|_| Error::KeepSplitOutput {
        path: output.into(),
        problem: format!(
            "{} tensors do not fit split.tensors.count (i32)",
            part_of.len()
        ),
    })?;
    let mut parts = Vec::with_capacity(n_parts);
    let mut start = 0;
    for no in 0..n_parts {
        let end = start + part_of[start..].iter().take_while(|&&p| p == no).count();
        if no > 0 && end == start {
            return Err(Error::KeepSplitEmptyPart {
                part: no + 1,
                count: n_parts,
            });
        }
        let mut metadata = if no == 0 {
            first.clone()
        } else {
            Metadata::new()
        };
        if n_parts > 1 {
            metadata.set(KEY_SPLIT_NO, Value::U16(no as u16));
            metadata.set(KEY_SPLIT_COUNT, Value::U16(n_parts as u16));
            metadata.set(KEY_SPLIT_TENSORS, Value::I32(n_tensors));
        }
        parts.push(OutputPart {
            path: split_path(&dir, &stem, no as u32 + 1, n_parts as u32),
            metadata,
            tensors: start..end,
        });
        start = end;
    }
    debug_assert_eq!(start, part_of.len(), "part_of is sorted and below n_parts");
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_named_from_out_without_its_gguf() {
        let md = Metadata::new();
        let parts = layout(Path::new("d/q.gguf"), md.clone(), &[0, 0, 1, 2], 3).unwrap();
        let names: Vec<_> = parts.iter().map(|p| p.path.clone()).collect();
        assert_eq!(
            names,
            [
                PathBuf::from("d/q-00001-of-00003.gguf"),
                PathBuf::from("d/q-00002-of-00003.gguf"),
                PathBuf::from("d/q-00003-of-00003.gguf"),
            ]
        );
        assert_eq!(parts[1].tensors, 2..3);
        let keys: Vec<&str> = parts[2].metadata.iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["split.no", "split.count", "split.tensors.count"]);
        let one = layout(Path::new("q"), md.clone(), &[0, 0], 1).unwrap();
        assert_eq!(one[0].path, PathBuf::from("q-00001-of-00001.gguf"));
        assert_eq!(
            one[0].metadata.iter().count(),
            0,
            "no split keys for one part"
        );
    }

    #[test]
    fn mangling_names_and_empty_parts_are_refused() {
        let md = Metadata::new();
        assert!(matches!(
            layout(Path::new("q.gguf.bin"), md.clone(), &[0], 1),
            Err(Error::KeepSplitOutput { .. })
        ));
        // A metadata-only first part is fine (gguf-split --no-tensor-first-split); an empty
        // later part is not.
        assert!(layout(Path::new("q"), md.clone(), &[1, 2], 3).is_ok());
        assert!(matches!(
            layout(Path::new("q"), md, &[0, 2], 3),
            Err(Error::KeepSplitEmptyPart { part: 2, count: 3 })
        ));
    }
}
