//! Splitting a model into parts and merging parts back into one file, laid out the way
//! llama.cpp's `llama-gguf-split` lays them out, so that either tool reads the other's
//! output and, for 32-byte-aligned models, both write the same bytes.
//!
//! The layout, as gguf-split writes it (facts from its source, tools/gguf-split):
//! - part `k` of `n` is `PREFIX-0000k-of-0000n.gguf`;
//! - the first part carries every metadata key of the model, then `split.no` (u16, 0-based),
//!   `split.tensors.count` (i32, the whole model's), `split.count` (u16) in that order
//!   (gguf-split sets the count last, after it knows it, and ggml's setter re-appends a key
//!   it replaces); later parts carry only those three keys;
//! - tensors keep their order; a tensor's n_dims is its highest non-1 dimension (ggml's
//!   writer); data is padded per tensor to the alignment;
//! - `--split-max-size` starts a new part when the part's padded tensor bytes would exceed
//!   the limit (metadata is not counted); `--split-max-tensors N` starts one every N tensors.
//!
//! Where we differ, on purpose:
//! - a model whose `general.alignment` is not 32: gguf-split pads with 32 whatever the key
//!   says, which leaves such a model unreadable; we pad with the model's alignment and repeat
//!   `general.alignment` in every part (before the split keys), so each part is valid.
//! - a first tensor larger than `--split-max-size`: gguf-split stops ("one of splits have 0
//!   tensors"); we put every oversized tensor in a part of its own, as gguf-split already does
//!   for later ones, and report them in [`SplitPlan::oversized`].
//! - merge drops the split keys; gguf-split's merge keeps `split.no` and
//!   `split.tensors.count` and sets `split.count` to 0. Dropping them gives back the file
//!   that was split, byte for byte, whenever that file was in the canonical layout
//!   ([`canonical_layout`]).

use crate::error::{Error, Result};
use crate::header::{Metadata, DEFAULT_ALIGNMENT, KEY_ALIGNMENT};
use crate::model::{split_path, GgufModel, KEY_SPLIT_COUNT, KEY_SPLIT_NO, KEY_SPLIT_TENSORS};
use crate::value::Value;
use crate::writer::{header_bytes, stage_streaming, TensorPlan};
use std::path::{Path, PathBuf};

/// When to start a new part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SplitLimit {
    /// At most this many bytes of padded tensor data per part (metadata not counted).
    MaxBytes(u64),
    /// At most this many tensors per part.
    MaxTensors(usize),
}

/// What a split does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SplitOptions {
    pub limit: SplitLimit,
    /// The first part holds metadata only (gguf-split's `--no-tensor-first-split`).
    pub first_part: FirstPart,
}

/// Whether the first part holds tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FirstPart {
    WithTensors,
    MetadataOnly,
}

/// The parts a split will write: tensor indices (into [`GgufModel::tensors`]) per part.
#[derive(Clone, Debug, PartialEq)]
pub struct SplitPlan {
    pub parts: Vec<Vec<usize>>,
    /// Tensors larger than `MaxBytes` on their own (each sits alone in its part).
    pub oversized: Vec<usize>,
    /// Every part's file size in bytes, in order.
    pub part_sizes: Vec<u64>,
    /// Tensors per part before the split was planned: the model's total.
    pub n_tensors: usize,
}

/// Parses a size as gguf-split does, decimal units: `500M` is 500 * 10^6 bytes, `2G`
/// 2 * 10^9; we also take `K` (10^3) and a plain byte count.
pub fn parse_size(s: &str) -> Result<u64> {
    let bad = |why: &str| Error::Invalid(format!("split size {s:?}: {why}"));
    let (digits, mult) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1_000u64),
        Some('M' | 'm') => (&s[..s.len() - 1], 1_000_000),
        Some('G' | 'g') => (&s[..s.len() - 1], 1_000_000_000),
        Some(c) if c.is_ascii_digit() => (s, 1),
        _ => return Err(bad("expected a number with an optional K, M or G suffix")),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| bad("expected a number with an optional K, M or G suffix"))?;
    if n == 0 {
        return Err(bad("must be positive"));
    }
    n.checked_mul(mult).ok_or_else(|| bad("too large"))
}

fn alignment_of(md: &Metadata) -> u64 {
    match md.get(KEY_ALIGNMENT) {
        Some(Value::U32(a)) if *a > 0 && a.is_power_of_two() => *a as u64,
        _ => DEFAULT_ALIGNMENT,
    }
}

/// The model's metadata without split keys: what a merge writes, and what the first part
/// of a split starts from.
pub fn unsplit_metadata(model: &GgufModel) -> Metadata {
    let mut md = model.metadata().clone();
    for k in [KEY_SPLIT_NO, KEY_SPLIT_COUNT, KEY_SPLIT_TENSORS] {
        md.remove(k);
    }
    md
}

/// Tensor entries as ggml's writer emits them: dims trimmed to the highest non-1 one.
fn plans(model: &GgufModel, indices: &[usize]) -> Vec<TensorPlan> {
    indices
        .iter()
        .map(|&i| {
            let info = &model.tensors()[i].info;
            let n_dims = info.dims.iter().rposition(|&d| d != 1).map_or(1, |p| p + 1);
            TensorPlan {
                name: info.name.clone(),
                dims: info.dims[..n_dims].to_vec(),
                ty: info.ty,
            }
        })
        .collect()
}

fn part_metadata(base: &Metadata, no: usize, count: usize, n_tensors: i32, align: u64) -> Metadata {
    let mut md = if no == 0 {
        base.clone()
    } else {
        let mut md = Metadata::new();
        if align != DEFAULT_ALIGNMENT {
            md.set(KEY_ALIGNMENT, Value::U32(align as u32));
        }
        md
    };
    md.set(KEY_SPLIT_NO, Value::U16(no as u16));
    md.set(KEY_SPLIT_TENSORS, Value::I32(n_tensors));
    md.set(KEY_SPLIT_COUNT, Value::U16(count as u16));
    md
}

fn file_size(md: &Metadata, plans: &[TensorPlan], align: u64) -> Result<u64> {
    let sizes = plans
        .iter()
        .map(TensorPlan::n_bytes)
        .collect::<Result<Vec<_>>>()?;
    let (header, _) = header_bytes(md, plans, &sizes, align);
    let data: u64 = sizes.iter().map(|s| s.div_ceil(align) * align).sum();
    Ok(header.len() as u64 + data)
}

/// Plans a split of `model` (which may itself be split).
///
/// # Errors
/// A zero limit, more than 65535 parts (`split.count` is a u16), more tensors than an i32.
pub fn plan_split(model: &GgufModel, opts: SplitOptions) -> Result<SplitPlan> {
    let md = unsplit_metadata(model);
    let align = alignment_of(&md);
    let tensors = model.tensors();
    let mut parts: Vec<Vec<usize>> = vec![Vec::new()];
    if opts.first_part == FirstPart::MetadataOnly {
        parts.push(Vec::new());
    }
    let mut oversized = Vec::new();
    let mut bytes = 0u64;
    for (i, t) in tensors.iter().enumerate() {
        let padded = t.info.n_bytes.div_ceil(align) * align;
        let current = parts.last().expect("at least one part");
        let new_part = match opts.limit {
            SplitLimit::MaxBytes(0) | SplitLimit::MaxTensors(0) => {
                return Err(Error::Invalid("a split limit must be positive".into()))
            }
            SplitLimit::MaxBytes(max) => {
                if padded > max {
                    oversized.push(i);
                }
                !current.is_empty() && bytes + padded > max
            }
            SplitLimit::MaxTensors(n) => i > 0 && i % n == 0,
        };
        if new_part {
            parts.push(Vec::new());
            bytes = 0;
        }
        bytes += padded;
        parts.last_mut().expect("at least one part").push(i);
    }
    if parts.len() > u16::MAX as usize {
        return Err(Error::Invalid(format!(
            "the split would make {} parts; split.count holds at most {}",
            parts.len(),
            u16::MAX
        )));
    }
    let n_tensors = i32::try_from(tensors.len()).map_err(|_| {
        Error::Invalid(format!(
            "{} tensors do not fit split.tensors.count (i32)",
            tensors.len()
        ))
    })?;
    let part_sizes = parts
        .iter()
        .enumerate()
        .map(|(no, idx)| {
            let pmd = part_metadata(&md, no, parts.len(), n_tensors, align);
            file_size(&pmd, &plans(model, idx), align)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(SplitPlan {
        parts,
        oversized,
        part_sizes,
        n_tensors: tensors.len(),
    })
}

/// Writes the planned parts as `PREFIX-0000k-of-0000n.gguf` (prefix may hold a directory).
/// Refuses to overwrite an existing file; on any failure removes the parts it wrote, so a
/// set on disk is always complete. `progress(bytes)` is called as tensor bytes are copied.
pub fn write_split(
    model: &GgufModel,
    plan: &SplitPlan,
    prefix: &Path,
    progress: &mut dyn FnMut(u64),
) -> Result<Vec<PathBuf>> {
    split_into(model, plan, prefix, false, progress)
}

/// [`write_split`] over existing parts of the same names (`--force`): each old part stays
/// whole until the new set is complete and renamed over it, so an interrupted split never
/// loses the old file (deleting it first would).
pub fn write_split_replacing(
    model: &GgufModel,
    plan: &SplitPlan,
    prefix: &Path,
    progress: &mut dyn FnMut(u64),
) -> Result<Vec<PathBuf>> {
    split_into(model, plan, prefix, true, progress)
}

fn split_into(
    model: &GgufModel,
    plan: &SplitPlan,
    prefix: &Path,
    replace: bool,
    progress: &mut dyn FnMut(u64),
) -> Result<Vec<PathBuf>> {
    let md = unsplit_metadata(model);
    let align = alignment_of(&md);
    let n = plan.parts.len();
    let dir = prefix.parent().unwrap_or(Path::new(""));
    let stem = prefix
        .file_name()
        .and_then(|s| s.to_str())
        .ok_or_else(|| Error::Invalid(format!("bad output prefix {}", prefix.display())))?;
    let paths: Vec<PathBuf> = (0..n)
        .map(|k| split_path(dir, stem, k as u32 + 1, n as u32))
        .collect();
    if !replace {
        for p in &paths {
            refuse_existing(p)?;
        }
    }
    let n_tensors = plan.n_tensors as i32;
    // Every part is written and fsynced under its temporary name first and only then are
    // all renamed (crate::atomic), so a failure or a kill before the renames leaves no part
    // of the new set; a dropped staged part removes its temporary.
    let mut staged = Vec::with_capacity(n);
    for (no, (idx, path)) in plan.parts.iter().zip(&paths).enumerate() {
        let pmd = part_metadata(&md, no, n, n_tensors, align);
        staged.push(stage_tensors(model, &pmd, idx, path, progress)?);
    }
    crate::atomic::commit_all(staged)?;
    Ok(paths)
}

/// Merges a split model (opened from any part) into one file at `out`, dropping the split
/// keys. Refuses a model that is not a split set, and an existing `out`.
pub fn merge(model: &GgufModel, out: &Path, progress: &mut dyn FnMut(u64)) -> Result<()> {
    merge_into(model, out, false, progress)
}

/// [`merge`] over an existing `out` (`--force`): the old file stays whole until the new
/// one is complete and renamed over it.
pub fn merge_replacing(model: &GgufModel, out: &Path, progress: &mut dyn FnMut(u64)) -> Result<()> {
    merge_into(model, out, true, progress)
}

fn merge_into(
    model: &GgufModel,
    out: &Path,
    replace: bool,
    progress: &mut dyn FnMut(u64),
) -> Result<()> {
    if model.metadata().get(KEY_SPLIT_COUNT).is_none() {
        return Err(Error::Split {
            path: model.parts()[0].path().into(),
            problem: format!("not a split model (no {KEY_SPLIT_COUNT} key); nothing to merge"),
        });
    }
    if !replace {
        refuse_existing(out)?;
    }
    let md = unsplit_metadata(model);
    let all: Vec<usize> = (0..model.tensors().len()).collect();
    stage_tensors(model, &md, &all, out, progress)?.commit()
}

fn refuse_existing(p: &Path) -> Result<()> {
    if p.exists() {
        return Err(Error::Invalid(format!(
            "{} already exists; remove it first (minfer does not overwrite model files)",
            p.display()
        )));
    }
    Ok(())
}

fn stage_tensors(
    model: &GgufModel,
    md: &Metadata,
    indices: &[usize],
    path: &Path,
    progress: &mut dyn FnMut(u64),
) -> Result<crate::atomic::Staged> {
    let plans = plans(model, indices);
    stage_streaming(md, &plans, path, |i, out| {
        let t = &model.tensors()[indices[i]];
        let bytes = model.parts()[t.part].tensor_bytes(&t.info);
        // Copy in slices so the progress callback sees big tensors move.
        for chunk in bytes.chunks(8 << 20) {
            out.write_all(chunk).map_err(|source| Error::Io {
                path: path.into(),
                source,
            })?;
            progress(chunk.len() as u64);
        }
        Ok::<(), Error>(())
    })
}

/// Why a single-file model is not in the canonical layout (what ggml's writer and ours
/// produce: GGUF v3, the header as we would write it, tensors in index order at padded
/// offsets, zero padding, the file ending at the padded end of the last tensor), or None
/// when it is. Only a canonical file comes back byte for byte from split + merge.
pub fn canonical_layout(model: &GgufModel) -> Result<Option<String>> {
    let [part] = model.parts() else {
        return Ok(Some(format!("{} parts", model.parts().len())));
    };
    let h = part.header();
    if h.version != 3 {
        return Ok(Some(format!("GGUF version {} (merge writes 3)", h.version)));
    }
    let all: Vec<usize> = (0..model.tensors().len()).collect();
    let plans = plans(model, &all);
    let sizes: Vec<u64> = model.tensors().iter().map(|t| t.info.n_bytes).collect();
    let (header, offsets) = header_bytes(&h.metadata, &plans, &sizes, h.alignment);
    let map = part.mapping();
    if map.len() < header.len() || map[..header.len()] != header[..] {
        return Ok(Some(
            "the header is not laid out as ggml writes it (n_dims with trailing 1s, or padding)"
                .into(),
        ));
    }
    let base = header.len() as u64;
    let mut end = base;
    for (t, &off) in model.tensors().iter().zip(&offsets) {
        if t.info.offset != off {
            return Ok(Some(format!(
                "tensor {:?} at data offset {}, not {off}",
                t.info.name, t.info.offset
            )));
        }
        let gap = &map[end as usize..(base + off) as usize];
        if gap.iter().any(|&b| b != 0) {
            return Ok(Some(format!("non-zero padding before {:?}", t.info.name)));
        }
        end = base + off + t.info.n_bytes;
    }
    let padded = end.div_ceil(h.alignment) * h.alignment;
    if map.len() as u64 != padded || map[end as usize..].iter().any(|&b| b != 0) {
        return Ok(Some(format!(
            "{} bytes where the data ends at {padded} (trailing bytes or missing padding)",
            map.len()
        )));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_in_decimal_units_as_gguf_split_does() {
        assert_eq!(parse_size("500M").unwrap(), 500_000_000);
        assert_eq!(parse_size("2G").unwrap(), 2_000_000_000);
        assert_eq!(parse_size("4K").unwrap(), 4_000);
        assert_eq!(parse_size("123").unwrap(), 123);
        for bad in ["", "0M", "M", "1.5G", "12X", "-1M"] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
    }
}
