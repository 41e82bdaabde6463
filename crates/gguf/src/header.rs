//! Parsing the GGUF header (magic, version, metadata, tensor infos) from a byte slice.
//!
//! The parser is a pure function of bytes so it can be fuzzed and mutation-tested; the
//! file layer maps the file and hands the mapping in. File contents are untrusted: every
//! count is bounded by the bytes that remain before anything is allocated, nesting depth
//! is capped, and every tensor's extent is checked against the data section.

use crate::error::{Error, Result};
pub use crate::metadata::Metadata;
use crate::string_array::StringArray;
use crate::types::{GgmlType, TypeId};
use crate::value::{Array, Value, ValueType};

pub const MAGIC: &[u8; 4] = b"GGUF";
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Most dimensions a tensor may have (ggml's GGML_MAX_DIMS).
pub const MAX_DIMS: u32 = 4;
/// Arrays of arrays deeper than this are refused: it bounds recursion on hostile input.
pub const MAX_NESTING: usize = 4;
/// The key that sets the data alignment (a u32 power of two).
pub const KEY_ALIGNMENT: &str = "general.alignment";

/// A tensor's entry in the index.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// Dimensions, innermost first (ggml order: `dims[0]` is the row length).
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Offset relative to the start of the data section.
    pub offset: u64,
    /// Bytes the tensor occupies.
    pub n_bytes: u64,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
    /// Row length (`dims[0]`) and number of rows (product of the rest).
    pub fn rows(&self) -> (u64, u64) {
        (self.dims[0], self.dims[1..].iter().product())
    }
}

/// Everything before the data section.
#[derive(Clone, Debug, PartialEq)]
pub struct Header {
    pub version: u32,
    pub metadata: Metadata,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    /// Absolute file offset of the data section.
    pub data_offset: u64,
    /// Bytes from `data_offset` to the end of the last tensor (the data section's used size).
    pub data_size: u64,
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn offset(&self) -> u64 {
        self.pos as u64
    }
    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }
    fn take(&mut self, n: u64, what: &'static str) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(Error::Truncated {
                offset: self.offset(),
                needed: n - self.remaining(),
                len: self.buf.len() as u64,
                what,
            });
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }
    fn arr<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N]> {
        Ok(self
            .take(N as u64, what)?
            .try_into()
            .expect("take returned N bytes"))
    }
    fn u32(&mut self, what: &'static str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.arr(what)?))
    }
    fn u64(&mut self, what: &'static str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.arr(what)?))
    }
    /// A count that will be followed by `count` items of at least `min_each` bytes.
    fn count(&mut self, what: &'static str, min_each: u64) -> Result<u64> {
        let offset = self.offset();
        let count = self.u64(what)?;
        let remaining = self.remaining();
        if count.checked_mul(min_each).is_none_or(|b| b > remaining) {
            return Err(Error::CountTooLarge {
                what,
                count,
                offset,
                remaining,
            });
        }
        Ok(count)
    }
    /// A length-prefixed UTF-8 string. `what` names the string ("metadata key") and
    /// `what_len` its length field ("metadata key length") for error messages.
    fn string(&mut self, what: &'static str, what_len: &'static str) -> Result<String> {
        let start = self.offset();
        let len = self.count(what_len, 1)?;
        let bytes = self.take(len, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(Error::BadUtf8 { offset: start }),
        }
    }
    fn value_type(&mut self) -> Result<ValueType> {
        let offset = self.offset();
        let t = self.u32("value type")?;
        ValueType::from_u32(t).ok_or(Error::BadValueType { type_id: t, offset })
    }

    // --- The structural walk: the same reads and checks as below, allocating nothing. ---

    fn skip_string(&mut self, what: &'static str, what_len: &'static str) -> Result<()> {
        let len = self.count(what_len, 1)?;
        self.take(len, what).map(drop)
    }

    fn skip_value(&mut self, ty: ValueType, depth: usize) -> Result<()> {
        match ty {
            ValueType::String => self.skip_string("string value", "string value length"),
            ValueType::Array => self.skip_array(depth + 1),
            _ => self
                .take(ty.min_encoded_size(), fixed_value_what(ty))
                .map(drop),
        }
    }

    fn skip_array(&mut self, depth: usize) -> Result<()> {
        let offset = self.offset();
        if depth > MAX_NESTING {
            return Err(Error::NestingTooDeep {
                offset,
                max: MAX_NESTING,
            });
        }
        let ty = self.value_type()?;
        let n = self.count("array element count", ty.min_encoded_size())?;
        match ty {
            ValueType::String => {
                for _ in 0..n {
                    self.skip_string("string array element", "string array element length")?;
                }
                Ok(())
            }
            ValueType::Array => {
                for _ in 0..n {
                    self.skip_array(depth + 1)?;
                }
                Ok(())
            }
            // Fixed-size elements: `count` checked that n * size fits.
            _ => self
                .take(n * ty.min_encoded_size(), fixed_array_what(ty))
                .map(drop),
        }
    }

    fn value(&mut self, ty: ValueType, depth: usize) -> Result<Value> {
        Ok(match ty {
            ValueType::U8 => Value::U8(self.arr::<1>("u8 value")?[0]),
            ValueType::I8 => Value::I8(self.arr::<1>("i8 value")?[0] as i8),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.arr("u16 value")?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.arr("i16 value")?)),
            ValueType::U32 => Value::U32(self.u32("u32 value")?),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.arr("i32 value")?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.arr("f32 value")?)),
            ValueType::U64 => Value::U64(self.u64("u64 value")?),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.arr("i64 value")?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.arr("f64 value")?)),
            ValueType::Bool => {
                let offset = self.offset();
                match self.arr::<1>("bool value")?[0] {
                    0 => Value::Bool(false),
                    1 => Value::Bool(true),
                    value => return Err(Error::BadBool { value, offset }),
                }
            }
            ValueType::String => Value::String(self.string("string value", "string value length")?),
            ValueType::Array => Value::Array(self.array(depth + 1)?),
        })
    }

    /// `n` strings into one buffer: their bytes are copied side by side and validated as
    /// UTF-8 in one pass. The concatenation is valid with every boundary a char boundary
    /// exactly when every string is valid, so per-string validation runs only to locate an
    /// error.
    fn string_array(&mut self, n: usize) -> Result<StringArray> {
        const WHAT: &str = "string array element";
        const WHAT_LEN: &str = "string array element length";
        let start = self.pos;
        let mut total = 0u64;
        for _ in 0..n {
            let len = self.count(WHAT_LEN, 1)?;
            self.take(len, WHAT)?;
            total += len;
        }
        self.pos = start;
        let mut buf = Vec::with_capacity(total as usize);
        let mut ends = Vec::with_capacity(n);
        for _ in 0..n {
            let len = self.count(WHAT_LEN, 1)?;
            buf.extend_from_slice(self.take(len, WHAT)?);
            ends.push(buf.len());
        }
        if let Ok(s) = String::from_utf8(buf) {
            if let Some(a) = StringArray::from_parts(s, ends) {
                return Ok(a);
            }
        }
        let end = self.pos;
        self.pos = start;
        for _ in 0..n {
            let offset = self.offset();
            let len = self.count(WHAT_LEN, 1)?;
            if std::str::from_utf8(self.take(len, WHAT)?).is_err() {
                return Err(Error::BadUtf8 { offset });
            }
        }
        // Unreachable by the argument above; still an error, never a panic.
        Err(Error::BadUtf8 { offset: end as u64 })
    }

    fn array(&mut self, depth: usize) -> Result<Array> {
        let offset = self.offset();
        if depth > MAX_NESTING {
            return Err(Error::NestingTooDeep {
                offset,
                max: MAX_NESTING,
            });
        }
        let ty = self.value_type()?;
        let n = self.count("array element count", ty.min_encoded_size())? as usize;
        macro_rules! prim {
            ($variant:ident, $t:ty, $what:literal) => {{
                let bytes = self.take((n * std::mem::size_of::<$t>()) as u64, $what)?;
                Array::$variant(
                    bytes
                        .chunks_exact(std::mem::size_of::<$t>())
                        .map(|c| <$t>::from_le_bytes(c.try_into().expect("chunk size")))
                        .collect(),
                )
            }};
        }
        Ok(match ty {
            ValueType::U8 => Array::U8(self.take(n as u64, "u8 array")?.to_vec()),
            ValueType::I8 => Array::I8(
                self.take(n as u64, "i8 array")?
                    .iter()
                    .map(|&b| b as i8)
                    .collect(),
            ),
            ValueType::U16 => prim!(U16, u16, "u16 array"),
            ValueType::I16 => prim!(I16, i16, "i16 array"),
            ValueType::U32 => prim!(U32, u32, "u32 array"),
            ValueType::I32 => prim!(I32, i32, "i32 array"),
            ValueType::F32 => prim!(F32, f32, "f32 array"),
            ValueType::U64 => prim!(U64, u64, "u64 array"),
            ValueType::I64 => prim!(I64, i64, "i64 array"),
            ValueType::F64 => prim!(F64, f64, "f64 array"),
            ValueType::Bool => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    match self.value(ValueType::Bool, depth)? {
                        Value::Bool(b) => v.push(b),
                        _ => unreachable!("bool value parses to Value::Bool"),
                    }
                }
                Array::Bool(v)
            }
            ValueType::String => Array::String(self.string_array(n)?),
            ValueType::Array => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.array(depth + 1)?);
                }
                Array::Nested(v)
            }
        })
    }
}

fn fixed_value_what(ty: ValueType) -> &'static str {
    match ty {
        ValueType::U8 => "u8 value",
        ValueType::I8 => "i8 value",
        ValueType::U16 => "u16 value",
        ValueType::I16 => "i16 value",
        ValueType::U32 => "u32 value",
        ValueType::I32 => "i32 value",
        ValueType::F32 => "f32 value",
        ValueType::Bool => "bool value",
        ValueType::U64 => "u64 value",
        ValueType::I64 => "i64 value",
        ValueType::F64 => "f64 value",
        ValueType::String | ValueType::Array => "value",
    }
}

fn fixed_array_what(ty: ValueType) -> &'static str {
    match ty {
        ValueType::U8 => "u8 array",
        ValueType::I8 => "i8 array",
        ValueType::U16 => "u16 array",
        ValueType::I16 => "i16 array",
        ValueType::U32 => "u32 array",
        ValueType::I32 => "i32 array",
        ValueType::F32 => "f32 array",
        ValueType::Bool => "bool array",
        ValueType::U64 => "u64 array",
        ValueType::I64 => "i64 array",
        ValueType::F64 => "f64 array",
        ValueType::String | ValueType::Array => "array",
    }
}

/// Smallest encoded tensor info: name length (8) + n_dims (4) + one dimension (8) + type (4)
/// + offset (8). Bounds the tensor count by the bytes left before anything is allocated.
const MIN_TENSOR_INFO: u64 = 32;
/// Smallest encoded metadata entry: key length (8) + value type (4) + a one-byte value.
const MIN_KV: u64 = 13;
/// File offset of the tensor count.
const N_TENSORS_OFFSET: u64 = 8;

/// Parses a GGUF header from `bytes` (the whole file, or at least its header; tensor extents
/// are checked against `file_len`, the length of the whole file).
///
/// Memory use is bounded by a small multiple of `bytes.len()` whatever the file claims
/// (`tests/mutation.rs` measures it), and no input makes it panic.
pub fn parse_header(bytes: &[u8], file_len: u64) -> Result<Header> {
    let mut c = Cursor { buf: bytes, pos: 0 };
    let magic: [u8; 4] = c.arr("magic")?;
    if &magic != MAGIC {
        return Err(Error::BadMagic { found: magic });
    }
    let version = c.u32("version")?;
    if version != 2 && version != 3 {
        return Err(Error::UnsupportedVersion { version });
    }
    let n_tensors = c.count("tensor count", MIN_TENSOR_INFO)?;
    let n_kv = c.count("metadata entry count", MIN_KV)?;

    // Walk the metadata once without allocating, so that every count the second pass
    // allocates for is known to be backed by real bytes (a lying count can then never
    // reserve memory), then parse it for real.
    let kv_start = c.pos;
    for _ in 0..n_kv {
        c.skip_string("metadata key", "metadata key length")?;
        let ty = c.value_type()?;
        c.skip_value(ty, 0)?;
    }
    c.pos = kv_start;
    let mut entries = Vec::with_capacity(n_kv as usize);
    let mut key_offsets = Vec::with_capacity(n_kv as usize);
    for _ in 0..n_kv {
        key_offsets.push(c.offset());
        let key = c.string("metadata key", "metadata key length")?;
        let ty = c.value_type()?;
        let value = c.value(ty, 0)?;
        entries.push((key, value));
    }
    let alignment_key_offset = entries
        .iter()
        .position(|(k, _)| k == KEY_ALIGNMENT)
        .map_or(0, |i| key_offsets[i]);
    let metadata = Metadata::from_entries(entries).map_err(|(key, i)| Error::DuplicateKey {
        key,
        offset: key_offsets[i],
    })?;
    // The tensor infos must fit in what the metadata left.
    let remaining = c.remaining();
    if n_tensors * MIN_TENSOR_INFO > remaining {
        return Err(Error::CountTooLarge {
            what: "tensor count",
            count: n_tensors,
            offset: N_TENSORS_OFFSET,
            remaining,
        });
    }

    let alignment = match metadata.get(KEY_ALIGNMENT) {
        None => DEFAULT_ALIGNMENT,
        Some(Value::U32(a)) if *a > 0 && a.is_power_of_two() => *a as u64,
        Some(v) => {
            return Err(Error::BadKey {
                key: KEY_ALIGNMENT.into(),
                offset: alignment_key_offset,
                problem: format!(
                    "must be a u32 power of two, found {} {v}",
                    v.value_type().name()
                ),
            })
        }
    };

    let mut tensors = Vec::with_capacity(n_tensors as usize);
    let mut info_offsets = Vec::with_capacity(n_tensors as usize);
    for _ in 0..n_tensors {
        let info_offset = c.offset();
        let t = tensor_info(&mut c, info_offset, alignment)?;
        tensors.push(t);
        info_offsets.push(info_offset);
    }
    let header_end = c.offset();

    // Duplicate names: sort indices by name (no second copy of the names), report the later one.
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_unstable_by(|&a, &b| tensors[a].name.cmp(&tensors[b].name).then(a.cmp(&b)));
    for w in order.windows(2) {
        if tensors[w[0]].name == tensors[w[1]].name {
            return Err(Error::DuplicateTensor {
                name: tensors[w[1]].name.clone(),
                offset: info_offsets[w[1]],
            });
        }
    }

    let data_offset = header_end.div_ceil(alignment) * alignment;
    let data_avail = file_len.saturating_sub(data_offset);
    let mut data_size = 0u64;
    for (t, &info_offset) in tensors.iter().zip(&info_offsets) {
        match t.offset.checked_add(t.n_bytes) {
            Some(end) if end <= data_avail => data_size = data_size.max(end),
            _ => {
                return Err(Error::BadTensor {
                    name: t.name.clone(),
                    offset: info_offset,
                    problem: format!(
                        "data {}..+{} runs past the end of the file (data section at offset {} has {} bytes)",
                        t.offset, t.n_bytes, data_offset, data_avail
                    ),
                })
            }
        }
    }
    order.sort_unstable_by_key(|&i| (tensors[i].offset, i));
    for w in order.windows(2) {
        let (a, b) = (&tensors[w[0]], &tensors[w[1]]);
        // Zero-byte tensors cannot exist (zero dimensions are refused), so any shared byte is
        // a real overlap.
        if a.offset + a.n_bytes > b.offset {
            return Err(Error::OverlappingTensors {
                a: a.name.clone(),
                b: b.name.clone(),
                a_start: data_offset + a.offset,
                a_end: data_offset + a.offset + a.n_bytes,
                b_start: data_offset + b.offset,
                b_end: data_offset + b.offset + b.n_bytes,
            });
        }
    }

    Ok(Header {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
        data_size,
    })
}

/// One tensor info, validated on its own (name uniqueness and extents are checked later).
fn tensor_info(c: &mut Cursor<'_>, info_offset: u64, alignment: u64) -> Result<TensorInfo> {
    let name = c.string("tensor name", "tensor name length")?;
    let bad = |problem: String| Error::BadTensor {
        name: name.clone(),
        offset: info_offset,
        problem,
    };
    let dims_offset = c.offset();
    let n_dims = c.u32("tensor dimension count")?;
    if n_dims == 0 || n_dims > MAX_DIMS {
        return Err(bad(format!(
            "has {n_dims} dimensions at offset {dims_offset} (1 to {MAX_DIMS} allowed)"
        )));
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for _ in 0..n_dims {
        dims.push(c.u64("tensor dimension")?);
    }
    let type_offset = c.offset();
    let type_id = c.u32("tensor type")?;
    let offset_offset = c.offset();
    let offset = c.u64("tensor offset")?;
    let ty = match TypeId::from_u32(type_id) {
        TypeId::Known(t) => t,
        other => {
            return Err(bad(format!(
                "has type id {type_id} at offset {type_offset}: {other}"
            )))
        }
    };
    if dims.contains(&0) {
        return Err(bad(format!(
            "has a zero dimension {dims:?} at offset {}",
            dims_offset + 4
        )));
    }
    let n_el = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n <= i64::MAX as u64)
        .ok_or_else(|| {
            bad(format!(
                "dimensions {dims:?} at offset {} overflow the element count",
                dims_offset + 4
            ))
        })?;
    if !dims[0].is_multiple_of(ty.block_size()) {
        return Err(bad(format!(
            "row length {} (offset {}) is not a multiple of the {} block size {}",
            dims[0],
            dims_offset + 4,
            ty,
            ty.block_size()
        )));
    }
    let n_bytes = (n_el / ty.block_size())
        .checked_mul(ty.type_size())
        .ok_or_else(|| bad(format!("dimensions {dims:?} overflow the byte size")))?;
    if !offset.is_multiple_of(alignment) {
        return Err(bad(format!(
            "data offset {offset} (field at offset {offset_offset}) is not a multiple of the alignment {alignment}"
        )));
    }
    Ok(TensorInfo {
        name,
        dims,
        ty,
        offset,
        n_bytes,
    })
}
