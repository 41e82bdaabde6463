//! Weights resident on the device (seed §2.3, §4.6): matrices addressed in place inside
//! zero-copy wraps of the mmap'd GGUF parts (or copied with `MINFER_WEIGHT_COPY=1`), norm
//! gains and biases converted once to f32 vectors. Indexed by `WeightId`: the hot path never
//! looks a weight up by name.

use minfer_gguf::{quants, GgmlType};
use minfer_graph::{WeightId, WeightSource};

use crate::device::Device;
use crate::error::{Error, Result};

/// A matrix weight: its bytes at `offset` of `buffers[buf]`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Matrix {
    pub ty: GgmlType,
    pub ne0: usize,
    pub ne1: usize,
    pub buf: usize,
    pub offset: u64,
}

pub(crate) enum Resident<D: Device> {
    Matrix(Matrix),
    /// A one-row weight (norm gain, bias) as f32.
    Vector {
        buf: D::Buffer,
        len: usize,
    },
}

pub(crate) struct Residency<D: Device> {
    pub by_id: Vec<Option<Resident<D>>>,
    /// Part wraps and per-weight copies.
    pub buffers: Vec<D::Buffer>,
    /// Bytes of every resident weight (each weight's own extent).
    pub bytes: usize,
    /// Whether weights were copied rather than wrapped.
    pub copied: bool,
    /// Concatenated matrices (rows of a group appended) by the group's first weight.
    pub concats: Vec<Option<(Vec<WeightId>, Matrix)>>,
    /// Concatenations addressed in place (the group lies contiguous in one buffer) and copied.
    pub concat_views: usize,
    pub concat_copies: usize,
}

/// A handle copy: the same device buffers (wraps of the mapping, vectors, concatenations),
/// never their bytes (what a sibling backend reads).
impl<D: Device> Clone for Resident<D>
where
    D::Buffer: Clone,
{
    fn clone(&self) -> Self {
        match self {
            Resident::Matrix(m) => Resident::Matrix(*m),
            Resident::Vector { buf, len } => Resident::Vector {
                buf: buf.clone(),
                len: *len,
            },
        }
    }
}

impl<D: Device> Clone for Residency<D>
where
    D::Buffer: Clone,
{
    fn clone(&self) -> Self {
        Residency {
            by_id: self.by_id.clone(),
            buffers: self.buffers.clone(),
            bytes: self.bytes,
            copied: self.copied,
            concats: self.concats.clone(),
            concat_views: self.concat_views,
            concat_copies: self.concat_copies,
        }
    }
}

impl<D: Device> Default for Residency<D> {
    fn default() -> Self {
        Residency {
            by_id: Vec::new(),
            buffers: Vec::new(),
            bytes: 0,
            copied: false,
            concats: Vec::new(),
            concat_views: 0,
            concat_copies: 0,
        }
    }
}

fn err(what: String) -> Error {
    Error::Shape {
        op: "prepare_weights",
        reason: what,
    }
}

impl<D: Device> Residency<D> {
    /// Makes `ids` resident: parts wrapped once each, page-aligned as mmap returns them.
    pub fn load(dev: &D, weights: &dyn WeightSource, ids: &[WeightId], copy: bool) -> Result<Self> {
        let mut r = Residency {
            by_id: (0..weights.len()).map(|_| None).collect(),
            copied: copy,
            ..Default::default()
        };
        // part index -> buffer index
        let mut wrapped: Vec<Option<usize>> = Vec::new();
        for &id in ids {
            let name = weights.name(id);
            let w = weights
                .weight(id)
                .ok_or_else(|| err(format!("weight {name} is not in the model")))?;
            if w.ne1 == 1 {
                let mut v = vec![0f32; w.ne0];
                quants::dequantize_row(w.ty, w.bytes, &mut v)
                    .map_err(|e| err(format!("weight {name}: {e}")))?;
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                r.by_id[id.index()] = Some(Resident::Vector {
                    buf: dev.buffer_from(&bytes)?,
                    len: w.ne0,
                });
                r.bytes += bytes.len();
                continue;
            }
            let part = (!copy).then(|| weights.part(id)).flatten();
            let (buf, offset) = match part {
                Some((p, mapping)) => {
                    if wrapped.len() <= p {
                        wrapped.resize(p + 1, None);
                    }
                    let b = match wrapped[p] {
                        Some(b) => b,
                        None => {
                            // SAFETY: `mapping` is the engine's read-only mmap of the part;
                            // the engine drops its backends before the model (field order),
                            // so the wrap never outlives it, and kernels only read weights.
                            let buf = unsafe {
                                dev.wrap_host(mapping.as_ptr() as *mut u8, mapping.len())?
                            };
                            r.buffers.push(buf);
                            wrapped[p] = Some(r.buffers.len() - 1);
                            r.buffers.len() - 1
                        }
                    };
                    let off = (w.bytes.as_ptr() as usize).checked_sub(mapping.as_ptr() as usize);
                    match off {
                        Some(o) if o + w.bytes.len() <= mapping.len() => (b, o as u64),
                        _ => return Err(err(format!("weight {name} lies outside its part"))),
                    }
                }
                None => {
                    r.buffers.push(dev.buffer_from(w.bytes)?);
                    (r.buffers.len() - 1, 0)
                }
            };
            r.bytes += w.bytes.len();
            r.by_id[id.index()] = Some(Resident::Matrix(Matrix {
                ty: w.ty,
                ne0: w.ne0,
                ne1: w.ne1,
                buf,
                offset,
            }));
        }
        r.warm_up(weights, ids);
        Ok(r)
    }

    /// Touches one byte per page of every wrapped weight, so the first forward does not pay
    /// the first-touch page cost of the mapping (seed §2.3's load-time warm-up read).
    fn warm_up(&self, weights: &dyn WeightSource, ids: &[WeightId]) {
        let mut sum = 0u8;
        for &id in ids {
            if let Some(w) = weights.weight(id) {
                for b in w.bytes.iter().step_by(4096) {
                    sum = sum.wrapping_add(*b);
                }
            }
        }
        std::hint::black_box(sum);
    }

    pub fn matrix(&self, id: WeightId) -> Option<(&D::Buffer, Matrix)> {
        match self.by_id.get(id.index())? {
            Some(Resident::Matrix(m)) => Some((&self.buffers[m.buf], *m)),
            _ => None,
        }
    }

    /// Makes the concatenation of `group`'s resident matrices (same type and row length,
    /// rows appended in order) resident, once: in place when the matrices follow each other
    /// in one buffer (a GGUF part usually stores a layer's q, k, v so), else as one copy
    /// charged in `bytes`.
    pub fn concat(
        &mut self,
        dev: &D,
        weights: &dyn WeightSource,
        group: &[WeightId],
    ) -> Result<()> {
        let names = || {
            group
                .iter()
                .map(|&id| weights.name(id))
                .collect::<Vec<_>>()
                .join("|")
        };
        let mut ms = Vec::with_capacity(group.len());
        for &id in group {
            let (_, m) = self.matrix(id).ok_or_else(|| {
                err(format!(
                    "concat {}: {} is not resident as a matrix",
                    names(),
                    weights.name(id)
                ))
            })?;
            ms.push(m);
        }
        let Some(&first) = ms.first() else {
            return Ok(());
        };
        if ms.iter().any(|m| m.ty != first.ty || m.ne0 != first.ne0) {
            return Err(err(format!(
                "concat {}: the matrices differ in type or row length",
                names()
            )));
        }
        let row = first
            .ty
            .row_bytes(first.ne0 as u64)
            .ok_or_else(|| err(format!("concat {}: rows are not whole blocks", names())))?
            as usize;
        let ne1: usize = ms.iter().map(|m| m.ne1).sum();
        let contiguous = ms
            .windows(2)
            .all(|w| w[1].buf == w[0].buf && w[1].offset == w[0].offset + (w[0].ne1 * row) as u64);
        let m = if contiguous {
            self.concat_views += 1;
            Matrix { ne1, ..first }
        } else {
            let mut bytes = Vec::with_capacity(ne1 * row);
            for &id in group {
                let w = weights.weight(id).ok_or_else(|| {
                    err(format!("weight {} is not in the model", weights.name(id)))
                })?;
                bytes.extend_from_slice(w.bytes);
            }
            self.buffers.push(dev.buffer_from(&bytes)?);
            self.bytes += bytes.len();
            self.concat_copies += 1;
            Matrix {
                ne1,
                buf: self.buffers.len() - 1,
                offset: 0,
                ..first
            }
        };
        let at = group[0].index();
        if self.concats.len() <= at {
            self.concats.resize_with(at + 1, || None);
        }
        self.concats[at] = Some((group.to_vec(), m));
        Ok(())
    }

    /// The concatenation of `group` made by [`Residency::concat`].
    pub fn concat_of(&self, group: &[WeightId]) -> Option<(&D::Buffer, Matrix)> {
        match self.concats.get(group.first()?.index())? {
            Some((g, m)) if g == group => Some((&self.buffers[m.buf], *m)),
            _ => None,
        }
    }

    pub fn vector(&self, id: WeightId) -> Option<(&D::Buffer, usize)> {
        match self.by_id.get(id.index())? {
            Some(Resident::Vector { buf, len }) => Some((buf, *len)),
            _ => None,
        }
    }
}
