//! Writing GGUF v3 files: metadata of every value type, tensor infos, aligned data with
//! zero padding. Used by tests, `minfer synth` and split tools.

use crate::atomic::{AtomicFile, Staged};
use crate::error::{Error, Result};
use crate::header::{Metadata, DEFAULT_ALIGNMENT, KEY_ALIGNMENT, MAGIC, MAX_DIMS};
use crate::model::{split_path, KEY_SPLIT_COUNT, KEY_SPLIT_NO, KEY_SPLIT_TENSORS};
use crate::types::GgmlType;
use crate::value::{Array, Value, ValueType};
use std::io::Write;
use std::path::{Path, PathBuf};

/// A tensor to write: name, dims (innermost first), type and its encoded bytes.
#[derive(Clone, Debug)]
pub struct WriterTensor {
    pub name: String,
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    pub data: Vec<u8>,
}

/// Collects metadata and tensors, then writes them out in one pass.
#[derive(Clone, Debug, Default)]
pub struct GgufWriter {
    pub metadata: Metadata,
    pub tensors: Vec<WriterTensor>,
}

impl GgufWriter {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn set(&mut self, key: impl Into<String>, value: Value) -> &mut Self {
        self.metadata.set(key, value);
        self
    }

    /// Adds a tensor; dims must be 1 to 4 non-zero dimensions whose row length is a whole
    /// number of blocks, the byte length must match dims and type, and the name must be new.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        dims: &[u64],
        ty: GgmlType,
        data: Vec<u8>,
    ) -> Result<&mut Self> {
        let name = name.into();
        let bad = |problem: String| Error::Invalid(format!("tensor {name:?}: {problem}"));
        if dims.is_empty() || dims.len() > MAX_DIMS as usize || dims.contains(&0) {
            return Err(bad(format!(
                "dims {dims:?} must be 1 to {MAX_DIMS} non-zero sizes"
            )));
        }
        if self.tensors.iter().any(|t| t.name == name) {
            return Err(bad("a tensor of that name was already added".into()));
        }
        let rows = dims[1..].iter().try_fold(1u64, |a, &d| a.checked_mul(d));
        let want = ty
            .row_bytes(dims[0])
            .zip(rows)
            .and_then(|(rb, r)| rb.checked_mul(r));
        if want != Some(data.len() as u64) {
            return Err(bad(format!(
                "{} bytes do not match {ty} dims {dims:?} (want {want:?})",
                data.len()
            )));
        }
        self.tensors.push(WriterTensor {
            name,
            dims: dims.to_vec(),
            ty,
            data,
        });
        Ok(self)
    }

    /// Refuses metadata the reader would refuse: a `general.alignment` that is not a u32
    /// power of two. `to_bytes` does not check (tests use it to craft malformed files);
    /// `write_to` and `write_split` do.
    pub fn check(&self) -> Result<()> {
        match self.metadata.get(KEY_ALIGNMENT) {
            None => Ok(()),
            Some(Value::U32(a)) if *a > 0 && a.is_power_of_two() => Ok(()),
            Some(v) => Err(Error::Invalid(format!(
                "{KEY_ALIGNMENT} must be a u32 power of two, found {} {v}",
                v.value_type().name()
            ))),
        }
    }

    /// The tensors' entries without their bytes.
    pub fn plan(&self) -> Vec<TensorPlan> {
        self.tensors
            .iter()
            .map(|t| TensorPlan {
                name: t.name.clone(),
                dims: t.dims.clone(),
                ty: t.ty,
            })
            .collect()
    }

    /// The complete file as bytes, exactly as held (no checks; see `check`).
    pub fn to_bytes(&self) -> Vec<u8> {
        let align = alignment(&self.metadata);
        let sizes: Vec<u64> = self.tensors.iter().map(|t| t.data.len() as u64).collect();
        let (mut out, offsets) = header_bytes(&self.metadata, &self.plan(), &sizes, align);
        let base = out.len() as u64;
        for (t, off) in self.tensors.iter().zip(offsets) {
            out.resize((base + off) as usize, 0);
            out.extend_from_slice(&t.data);
        }
        pad_to(&mut out, align);
        out
    }

    /// Writes the file atomically: to a temporary sibling, then renamed into place, so a
    /// failure never leaves a half-written file under the final name.
    pub fn write_to(&self, path: impl AsRef<Path>) -> Result<()> {
        self.stage(path.as_ref())?.commit()
    }

    /// The file written to its fsynced temporary, not yet renamed (checked first).
    fn stage(&self, path: &Path) -> Result<Staged> {
        self.check()?;
        stage_streaming(&self.metadata, &self.plan(), path, |i, out| {
            out.write_all(&self.tensors[i].data)
                .map_err(|source| Error::Io {
                    path: path.into(),
                    source,
                })
        })
    }

    /// Writes the model as a split set `dir/PREFIX-0000k-of-0000N.gguf` the way llama.cpp's
    /// gguf-split lays it out: every part carries `split.no` (u16, 0-based), `split.count`
    /// (u16) and `split.tensors.count` (i32); the first part carries all other metadata; the
    /// tensors are cut, in order, into `n_parts` runs of about equal byte size, each part
    /// holding at least one. `general.alignment`, when set, is repeated in every part so
    /// each part's data section keeps it. Returns the part paths in order.
    pub fn write_split(
        &self,
        dir: impl AsRef<Path>,
        prefix: &str,
        n_parts: u32,
    ) -> Result<Vec<PathBuf>> {
        self.check()?;
        let n = n_parts as usize;
        if n == 0 || n > self.tensors.len() || n_parts > u16::MAX as u32 {
            return Err(Error::Invalid(format!(
                "cannot split {} tensors into {n_parts} parts (1 to min(tensors, 65535))",
                self.tensors.len()
            )));
        }
        let n_tensors = i32::try_from(self.tensors.len()).map_err(|_| {
            Error::Invalid(format!(
                "{} tensors do not fit split.tensors.count (i32)",
                self.tensors.len()
            ))
        })?;
        for key in [KEY_SPLIT_NO, KEY_SPLIT_COUNT, KEY_SPLIT_TENSORS] {
            if self.metadata.get(key).is_some() {
                return Err(Error::Invalid(format!(
                    "metadata already has {key}; write_split sets it"
                )));
            }
        }
        let runs = split_runs(&self.tensors, n);
        let mut paths = Vec::with_capacity(n);
        // Every part is complete and fsynced before the first rename (crate::atomic).
        let mut staged = Vec::with_capacity(n);
        for (no, run) in runs.into_iter().enumerate() {
            let mut part = GgufWriter::new();
            if no == 0 {
                part.metadata = self.metadata.clone();
            } else if let Some(a) = self.metadata.get(KEY_ALIGNMENT) {
                part.set(KEY_ALIGNMENT, a.clone());
            }
            part.set(KEY_SPLIT_NO, Value::U16(no as u16))
                .set(KEY_SPLIT_COUNT, Value::U16(n_parts as u16))
                .set(KEY_SPLIT_TENSORS, Value::I32(n_tensors));
            part.tensors = run.to_vec();
            let path = split_path(dir.as_ref(), prefix, no as u32 + 1, n_parts);
            staged.push(part.stage(&path)?);
            paths.push(path);
        }
        crate::atomic::commit_all(staged)?;
        Ok(paths)
    }
}

/// Cuts `tensors` into `n` non-empty consecutive runs of roughly equal byte size.
/// A tensor's entry without its bytes: what the streaming path needs up front.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorPlan {
    pub name: String,
    /// Dimensions, innermost first.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
}

impl TensorPlan {
    /// Bytes of the tensor's data, or an error naming it when the dims are not whole blocks.
    pub fn n_bytes(&self) -> Result<u64> {
        let n: Option<u64> = self.dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
        let rows = n.and_then(|n| n.checked_div(*self.dims.first()?));
        self.dims
            .first()
            .and_then(|&d0| self.ty.row_bytes(d0))
            .zip(rows)
            .and_then(|(rb, rows)| rb.checked_mul(rows))
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "tensor {:?}: dims {:?} are not whole {} blocks of {} elements",
                    self.name,
                    self.dims,
                    self.ty,
                    self.ty.block_size()
                ))
            })
    }
}

/// Writes a GGUF v3 file whose tensor bytes are produced on demand, one tensor at a time,
/// so a file far larger than memory can be written. The header is computed from `tensors`
/// first; then `produce(i, out)` must write exactly `tensors[i].n_bytes()` bytes to `out`
/// (checked). The file is written crash-safely ([`crate::atomic`]: `<path>.partial`,
/// fsynced, renamed into place); on any failure the partial file is removed.
pub fn write_streaming<E, F>(
    metadata: &Metadata,
    tensors: &[TensorPlan],
    path: &Path,
    produce: F,
) -> std::result::Result<(), E>
where
    E: From<Error>,
    F: FnMut(usize, &mut dyn Write) -> std::result::Result<(), E>,
{
    stage_streaming(metadata, tensors, path, produce)?.commit()?;
    Ok(())
}

/// [`write_streaming`] up to the rename: the complete, fsynced temporary, for a writer of
/// several files that renames them only once all are complete (split parts).
pub fn stage_streaming<E, F>(
    metadata: &Metadata,
    tensors: &[TensorPlan],
    path: &Path,
    mut produce: F,
) -> std::result::Result<Staged, E>
where
    E: From<Error>,
    F: FnMut(usize, &mut dyn Write) -> std::result::Result<(), E>,
{
    let io = |source| Error::Io {
        path: path.into(),
        source,
    };
    let align = alignment(metadata);
    let sizes = tensors
        .iter()
        .map(TensorPlan::n_bytes)
        .collect::<Result<Vec<u64>>>()?;
    let (header, offsets) = header_bytes(metadata, tensors, &sizes, align);
    let data_end = offsets.last().zip(sizes.last()).map_or(0, |(o, s)| o + s);
    let total = (header.len() as u64 + data_end).div_ceil(align) * align;
    let mut out = AtomicFile::create(path, Some(total))?;
    out.write_all(&header).map_err(io)?;
    let base = header.len() as u64;
    for (i, (t, &off)) in tensors.iter().zip(&offsets).enumerate() {
        let pad = base + off - out.written();
        out.write_all(&vec![0u8; pad as usize]).map_err(io)?;
        let start = out.written();
        produce(i, &mut out)?;
        let got = out.written() - start;
        if got != sizes[i] {
            return Err(Error::Invalid(format!(
                "tensor {:?}: producer wrote {got} bytes, {} {:?} needs {}",
                t.name, t.ty, t.dims, sizes[i]
            ))
            .into());
        }
    }
    let end = out.written().div_ceil(align) * align;
    out.write_all(&vec![0u8; (end - out.written()) as usize])
        .map_err(io)?;
    Ok(out.finish()?)
}

fn alignment(metadata: &Metadata) -> u64 {
    match metadata.get(KEY_ALIGNMENT) {
        Some(Value::U32(a)) if *a > 0 && a.is_power_of_two() => *a as u64,
        _ => DEFAULT_ALIGNMENT,
    }
}

/// Everything before the data section, padded to the alignment, and each tensor's offset
/// relative to the data section.
pub(crate) fn header_bytes(
    metadata: &Metadata,
    tensors: &[TensorPlan],
    sizes: &[u64],
    align: u64,
) -> (Vec<u8>, Vec<u64>) {
    let mut out = Vec::new();
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    out.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
    for (k, v) in metadata.iter() {
        put_str(&mut out, k);
        out.extend_from_slice(&(v.value_type() as u32).to_le_bytes());
        put_value(&mut out, v);
    }
    let mut offset = 0u64;
    let mut offsets = Vec::with_capacity(tensors.len());
    for (t, &size) in tensors.iter().zip(sizes) {
        put_str(&mut out, &t.name);
        out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
        for d in &t.dims {
            out.extend_from_slice(&d.to_le_bytes());
        }
        out.extend_from_slice(&t.ty.id().to_le_bytes());
        out.extend_from_slice(&offset.to_le_bytes());
        offsets.push(offset);
        offset = (offset + size).div_ceil(align) * align;
    }
    pad_to(&mut out, align);
    (out, offsets)
}

fn split_runs(tensors: &[WriterTensor], n: usize) -> Vec<&[WriterTensor]> {
    let total: u64 = tensors.iter().map(|t| t.data.len() as u64).sum();
    let mut runs = Vec::with_capacity(n);
    let mut start = 0;
    let mut acc = 0u64;
    for k in 1..n {
        // End run k-1 once it reaches k/n of the bytes, leaving one tensor per later run.
        let target = total * k as u64 / n as u64;
        let mut end = start + 1;
        acc += tensors[start].data.len() as u64;
        while end < tensors.len() - (n - k) && acc < target {
            acc += tensors[end].data.len() as u64;
            end += 1;
        }
        runs.push(&tensors[start..end]);
        start = end;
    }
    runs.push(&tensors[start..]);
    runs
}

fn pad_to(out: &mut Vec<u8>, align: u64) {
    let len = (out.len() as u64).div_ceil(align) * align;
    out.resize(len as usize, 0);
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(*x as u8),
        Value::String(s) => put_str(out, s),
        Value::Array(a) => put_array(out, a),
    }
}

fn put_array(out: &mut Vec<u8>, a: &Array) {
    out.extend_from_slice(&(a.elem_type() as u32).to_le_bytes());
    out.extend_from_slice(&(a.len() as u64).to_le_bytes());
    macro_rules! each {
        ($v:expr) => {
            for x in $v {
                out.extend_from_slice(&x.to_le_bytes());
            }
        };
    }
    match a {
        Array::U8(v) => out.extend_from_slice(v),
        Array::I8(v) => out.extend(v.iter().map(|&x| x as u8)),
        Array::Bool(v) => out.extend(v.iter().map(|&x| x as u8)),
        Array::U16(v) => each!(v),
        Array::I16(v) => each!(v),
        Array::U32(v) => each!(v),
        Array::I32(v) => each!(v),
        Array::F32(v) => each!(v),
        Array::U64(v) => each!(v),
        Array::I64(v) => each!(v),
        Array::F64(v) => each!(v),
        Array::String(v) => v.iter().for_each(|s| put_str(out, s)),
        Array::Nested(v) => v.iter().for_each(|x| put_array(out, x)),
    }
}

// Keeps ValueType's discriminants the ones the format defines (the writer casts them).
const _: () = assert!(ValueType::F64 as u32 == 12 && ValueType::Array as u32 == 9);
