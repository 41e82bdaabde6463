//! Weight residency: mmap'd GGUF parts wrapped zero-copy as device buffers, and each weight
//! resolved to (part buffer, byte offset) so kernels read it in place.

use std::collections::HashMap;

use crate::device::Device;
use crate::error::{Error, Result};

struct Weight {
    part: usize,
    offset: u64,
    bytes: u64,
}

/// Registered parts and weights of one model (names are the caller's, e.g. namespaced).
pub struct WeightRegistry<D: Device> {
    parts: Vec<(String, D::Buffer)>,
    weights: HashMap<String, Weight>,
}

impl<D: Device> Default for WeightRegistry<D> {
    fn default() -> Self {
        WeightRegistry {
            parts: Vec::new(),
            weights: HashMap::new(),
        }
    }
}

impl<D: Device> WeightRegistry<D> {
    /// Wraps one mapped part without copying; returns its index for [`Self::register_weight`].
    ///
    /// # Safety
    /// `ptr..ptr+len` must be a mapping (page-aligned, as mmap returns) that outlives the
    /// registry and every command that reads its weights.
    pub unsafe fn register_part(
        &mut self,
        dev: &D,
        name: &str,
        ptr: *mut u8,
        len: usize,
    ) -> Result<usize> {
        // SAFETY: forwarded to the caller's contract.
        let buf = unsafe { dev.wrap_host(ptr, len)? };
        self.parts.push((name.to_string(), buf));
        Ok(self.parts.len() - 1)
    }

    /// Records weight `name` at `offset..offset+bytes` of part `part`.
    pub fn register_weight(
        &mut self,
        dev: &D,
        name: &str,
        part: usize,
        offset: u64,
        bytes: u64,
    ) -> Result<()> {
        let (pname, buf) = self.parts.get(part).ok_or_else(|| Error::Shape {
            op: "register_weight",
            reason: format!("{name}: no part {part} (have {})", self.parts.len()),
        })?;
        let size = dev.buffer_len(buf) as u64;
        if offset.checked_add(bytes).is_none_or(|end| end > size) {
            return Err(Error::Shape {
                op: "register_weight",
                reason: format!(
                    "{name}: bytes {offset}..{} outside part {pname} of {size} bytes",
                    offset + bytes
                ),
            });
        }
        self.weights.insert(
            name.to_string(),
            Weight {
                part,
                offset,
                bytes,
            },
        );
        Ok(())
    }

    /// The buffer and byte offset of a registered weight.
    pub fn weight_buf(&self, name: &str) -> Option<(&D::Buffer, u64)> {
        self.weights
            .get(name)
            .map(|w| (&self.parts[w.part].1, w.offset))
    }

    pub fn has_weight(&self, name: &str) -> bool {
        self.weights.contains_key(name)
    }

    /// Bytes of all registered weights (each weight's own extent), for memory budgets.
    pub fn weights_bytes(&self) -> u64 {
        self.weights.values().map(|w| w.bytes).sum()
    }
}
