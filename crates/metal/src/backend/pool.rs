//! The executor's buffer pool (seed §4.1): shared buffers handed out under graph `BufId`s,
//! reused only at their exact byte length and never released while the backend lives, so a
//! persistent KV region keeps its memory across graph rebuilds.

use std::collections::HashMap;

use crate::device::Device;
use crate::error::Result;

pub(crate) struct Pool<D: Device> {
    /// Every buffer ever made, by id.
    bufs: Vec<D::Buffer>,
    /// Bytes of every buffer in `bufs` (they are never released while the pool lives).
    held: usize,
    /// Whether an id is handed out.
    live: Vec<bool>,
    /// Free ids by exact byte length.
    free: HashMap<usize, Vec<u32>>,
}

impl<D: Device> Default for Pool<D> {
    fn default() -> Self {
        Pool {
            bufs: Vec::new(),
            held: 0,
            live: Vec::new(),
            free: HashMap::new(),
        }
    }
}

impl<D: Device> Pool<D> {
    /// A buffer of exactly `bytes`: a free one of that length, else a new one. The returned
    /// flag says it was reused (the caller zeroes it: `alloc` promises zeroed memory).
    pub fn take(&mut self, dev: &D, bytes: usize) -> Result<(u32, bool)> {
        if let Some(id) = self.free.get_mut(&bytes).and_then(|v| v.pop()) {
            self.live[id as usize] = true;
            return Ok((id, true));
        }
        let buf = dev.new_buffer(bytes.max(4))?;
        self.held += dev.buffer_len(&buf);
        self.bufs.push(buf);
        self.live.push(true);
        Ok(((self.bufs.len() - 1) as u32, false))
    }

    /// Returns an id to the free list of its length; the memory stays allocated.
    pub fn give_back(&mut self, dev: &D, id: u32) {
        let i = id as usize;
        if self.live.get(i).copied() == Some(true) {
            self.live[i] = false;
            let len = dev.buffer_len(&self.bufs[i]);
            self.free.entry(len).or_default().push(id);
        }
    }

    /// The live buffer of an id.
    pub fn get(&self, id: u32) -> Option<&D::Buffer> {
        let i = id as usize;
        (self.live.get(i).copied() == Some(true)).then(|| &self.bufs[i])
    }

    /// Bytes of every buffer the pool holds (live or free).
    pub fn held_bytes(&self) -> usize {
        self.held
    }
}
