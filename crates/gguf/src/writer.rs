//! Writing GGUF v3 files: metadata of every value type, tensor infos, aligned data with
//! zero padding. Used by tests, `minfer synth` and split tools.

use crate::error::{Error, Result};
use crate::header::{Metadata, DEFAULT_ALIGNMENT, MAGIC};
use crate::types::GgmlType;
use crate::value::{Array, Value, ValueType};
use std::io::Write;
use std::path::Path;

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

    /// Adds a tensor; the byte length must match dims and type.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        dims: &[u64],
        ty: GgmlType,
        data: Vec<u8>,
    ) -> Result<&mut Self> {
        let name = name.into();
        let n: u64 = dims.iter().product();
        let want = ty.row_bytes(dims[0]).map(|rb| rb * (n / dims[0]));
        if want != Some(data.len() as u64) {
            return Err(Error::Invalid(format!(
                "tensor {name:?}: {} bytes do not match {ty} dims {dims:?} (want {want:?})",
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

    fn alignment(&self) -> u64 {
        match self.metadata.get("general.alignment") {
            Some(Value::U32(a)) if *a > 0 && a.is_power_of_two() => *a as u64,
            _ => DEFAULT_ALIGNMENT,
        }
    }

    /// The complete file as bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let align = self.alignment();
        let mut out = Vec::new();
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in self.metadata.iter() {
            put_str(&mut out, k);
            out.extend_from_slice(&(v.value_type() as u32).to_le_bytes());
            put_value(&mut out, v);
        }
        let mut offset = 0u64;
        let mut offsets = Vec::with_capacity(self.tensors.len());
        for t in &self.tensors {
            put_str(&mut out, &t.name);
            out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.ty.id().to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            offsets.push(offset);
            offset = (offset + t.data.len() as u64).div_ceil(align) * align;
        }
        pad_to(&mut out, align);
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
        let path = path.as_ref();
        let tmp = path.with_extension("gguf.partial");
        let io = |source| Error::Io {
            path: path.into(),
            source,
        };
        let mut f = std::fs::File::create(&tmp).map_err(io)?;
        f.write_all(&self.to_bytes()).map_err(io)?;
        f.sync_all().map_err(io)?;
        drop(f);
        std::fs::rename(&tmp, path).map_err(io)
    }
}

pub(crate) fn pad_to(out: &mut Vec<u8>, align: u64) {
    let len = (out.len() as u64).div_ceil(align) * align;
    out.resize(len as usize, 0);
}

pub(crate) fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

pub(crate) fn put_value(out: &mut Vec<u8>, v: &Value) {
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
