//! Reading safetensors checkpoints: an 8-byte little-endian header length, a JSON header
//! `{name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}`, then the
//! data. Tensors are read one at a time (a checkpoint can be far larger than memory), and
//! every header field is checked against the file before a byte is read.

use super::ConvertError;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// Largest header we accept: a checkpoint's index of tensors is a few megabytes at most.
const MAX_HEADER: u64 = 100 << 20;

/// Element types the converter reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    F32,
    F16,
    Bf16,
}

impl Dtype {
    fn size(self) -> u64 {
        match self {
            Dtype::F32 => 4,
            Dtype::F16 | Dtype::Bf16 => 2,
        }
    }
}

/// One tensor's entry in a file's header.
#[derive(Clone, Debug)]
pub struct StTensor {
    pub name: String,
    pub file: PathBuf,
    pub dtype: Dtype,
    /// Row-major (PyTorch order: the last dimension is contiguous).
    pub shape: Vec<u64>,
    /// Absolute file offset of the data.
    pub offset: u64,
    pub n_bytes: u64,
}

impl StTensor {
    /// The values widened to f32 (bf16 and f16 exactly).
    pub fn read_f32(&self) -> Result<Vec<f32>, ConvertError> {
        let io = |e| ConvertError::Io {
            path: self.file.clone(),
            source: e,
        };
        let mut f = File::open(&self.file).map_err(io)?;
        f.seek(SeekFrom::Start(self.offset)).map_err(io)?;
        let mut raw = vec![0u8; self.n_bytes as usize];
        f.read_exact(&mut raw).map_err(io)?;
        Ok(match self.dtype {
            Dtype::F32 => raw
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
                .collect(),
            Dtype::F16 => raw
                .chunks_exact(2)
                .map(|c| minfer_gguf::quants::f16_to_f32(u16::from_le_bytes([c[0], c[1]])))
                .collect(),
            Dtype::Bf16 => raw
                .chunks_exact(2)
                .map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16))
                .collect(),
        })
    }
}

/// The tensors of one safetensors file, sorted by name (the order Python's `safe_open`
/// lists them, which convert_hf_to_gguf.py follows).
pub fn read_header(path: &Path) -> Result<Vec<StTensor>, ConvertError> {
    let bad = |why: String| ConvertError::Safetensors {
        path: path.into(),
        why,
    };
    let io = |e| ConvertError::Io {
        path: path.into(),
        source: e,
    };
    let mut f = File::open(path).map_err(io)?;
    let len = f.metadata().map_err(io)?.len();
    let mut n = [0u8; 8];
    f.read_exact(&mut n)
        .map_err(|_| bad("shorter than the 8-byte header length".into()))?;
    let n = u64::from_le_bytes(n);
    if n > MAX_HEADER || 8 + n > len {
        return Err(bad(format!(
            "header length {n} does not fit the file ({len} bytes)"
        )));
    }
    let mut header = vec![0u8; n as usize];
    f.read_exact(&mut header).map_err(io)?;
    let json: serde_json::Value =
        serde_json::from_slice(&header).map_err(|e| bad(format!("header is not JSON: {e}")))?;
    let obj = json
        .as_object()
        .ok_or_else(|| bad("header is not a JSON object".into()))?;
    let data_start = 8 + n;
    let mut out = Vec::with_capacity(obj.len());
    for (name, t) in obj {
        if name == "__metadata__" {
            continue;
        }
        let dtype = match t.get("dtype").and_then(|d| d.as_str()) {
            Some("F32") => Dtype::F32,
            Some("F16") => Dtype::F16,
            Some("BF16") => Dtype::Bf16,
            other => {
                return Err(bad(format!(
                    "tensor {name}: dtype {other:?} is not supported (F32, F16, BF16)"
                )))
            }
        };
        let shape: Option<Vec<u64>> = t
            .get("shape")
            .and_then(|s| s.as_array())
            .and_then(|a| a.iter().map(|d| d.as_u64()).collect());
        let offs: Option<Vec<u64>> = t
            .get("data_offsets")
            .and_then(|s| s.as_array())
            .and_then(|a| a.iter().map(|d| d.as_u64()).collect());
        let (Some(shape), Some(offs)) = (shape, offs) else {
            return Err(bad(format!("tensor {name}: bad shape or data_offsets")));
        };
        let [begin, end] = offs[..] else {
            return Err(bad(format!(
                "tensor {name}: data_offsets must be [begin, end]"
            )));
        };
        let n_el = shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
        let want = n_el.and_then(|e| e.checked_mul(dtype.size()));
        if end < begin || Some(end - begin) != want || data_start + end > len {
            return Err(bad(format!(
                "tensor {name}: bytes {begin}..{end} do not hold {shape:?} {dtype:?} inside the file"
            )));
        }
        out.push(StTensor {
            name: name.clone(),
            file: path.into(),
            dtype,
            shape,
            offset: data_start + begin,
            n_bytes: end - begin,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}
