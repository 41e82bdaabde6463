//! Writing GGUF v3 files whose tensor bytes are produced on demand, one tensor at a time,
//! so a file far larger than memory (a 7B-class synthesized model) can be written. Byte for
//! byte the same layout as [`GgufWriter::to_bytes`](crate::GgufWriter::to_bytes).

use crate::error::{Error, Result};
use crate::header::{Metadata, DEFAULT_ALIGNMENT, MAGIC};
use crate::types::GgmlType;
use crate::value::Value;
use crate::writer::{pad_to, put_str, put_value};
use std::io::Write;
use std::path::{Path, PathBuf};

/// A tensor's entry without its bytes: what the header needs up front.
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
        let rows = self
            .dims
            .get(1..)
            .and_then(|r| r.iter().try_fold(1u64, |a, &d| a.checked_mul(d)));
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

/// `<path>.partial`: where a file is assembled before it is renamed into place.
pub fn partial_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".partial");
    PathBuf::from(s)
}

/// Writes a GGUF v3 file: the header is computed from `tensors` first, then `produce(i, out)`
/// must write exactly `tensors[i].n_bytes()` bytes to `out` (checked). The file is written
/// to `<path>.partial` and renamed into place only when complete; on any failure the
/// partial file is removed, so nothing under `path` can be mistaken for a whole file.
pub fn write_streaming<E, F>(
    metadata: &Metadata,
    tensors: &[TensorPlan],
    path: &Path,
    mut produce: F,
) -> std::result::Result<(), E>
where
    E: From<Error>,
    F: FnMut(usize, &mut dyn Write) -> std::result::Result<(), E>,
{
    let tmp = partial_path(path);
    let result = (|| -> std::result::Result<(), E> {
        let io = |source| Error::Io {
            path: tmp.clone(),
            source,
        };
        let align = alignment(metadata);
        let sizes = tensors
            .iter()
            .map(TensorPlan::n_bytes)
            .collect::<Result<Vec<u64>>>()?;
        let (header, offsets) = header_bytes(metadata, tensors, &sizes, align);
        let file = std::fs::File::create(&tmp).map_err(io)?;
        let mut out = CountingWriter {
            inner: std::io::BufWriter::with_capacity(1 << 20, file),
            written: 0,
        };
        out.write_all(&header).map_err(io)?;
        let base = header.len() as u64;
        for (i, (t, &off)) in tensors.iter().zip(&offsets).enumerate() {
            let pad = base + off - out.written;
            out.write_all(&vec![0u8; pad as usize]).map_err(io)?;
            let start = out.written;
            produce(i, &mut out)?;
            let got = out.written - start;
            if got != sizes[i] {
                return Err(Error::Invalid(format!(
                    "tensor {:?}: producer wrote {got} bytes, {} {:?} needs {}",
                    t.name, t.ty, t.dims, sizes[i]
                ))
                .into());
            }
        }
        let end = out.written.div_ceil(align) * align;
        out.write_all(&vec![0u8; (end - out.written) as usize])
            .map_err(io)?;
        let file = out.inner.into_inner().map_err(|e| io(e.into_error()))?;
        file.sync_all().map_err(io)?;
        drop(file);
        std::fs::rename(&tmp, path).map_err(|source| Error::Io {
            path: path.into(),
            source,
        })?;
        Ok(())
    })();
    if result.is_err() {
        // Removing may fail only when the file is already gone; the error that matters is
        // the one being returned.
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

struct CountingWriter<W> {
    inner: W,
    written: u64,
}

impl<W: Write> Write for CountingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

fn alignment(metadata: &Metadata) -> u64 {
    match metadata.get("general.alignment") {
        Some(Value::U32(a)) if *a > 0 && a.is_power_of_two() => *a as u64,
        _ => DEFAULT_ALIGNMENT,
    }
}

/// Everything before the data section, padded to the alignment, and each tensor's offset
/// relative to the data section.
fn header_bytes(
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
