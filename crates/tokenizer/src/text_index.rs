//! Token text -> id lookup used while building the merge table: an open-addressing table of
//! `(id, hash tag)` slots over the vocabulary's contiguous text buffer. It is compact (2 MiB
//! for 152k tokens) and probes mostly cached memory, where a `HashMap<&str, u32>` chases a
//! pointer per probe; building Qwen's merge table is up to three lookups per merge.

use crate::bpe::FxHasher;
use std::hash::Hasher;

const EMPTY: u32 = u32::MAX;

pub struct TextIndex<'a> {
    bytes: &'a [u8],
    offsets: &'a [u32],
    /// `(id, upper hash bits)`; `id == EMPTY` marks a free slot.
    slots: Vec<(u32, u32)>,
    mask: usize,
}

#[inline]
fn hash(s: &[u8]) -> u64 {
    let mut h = FxHasher::default();
    h.write(s);
    h.finish()
}

impl<'a> TextIndex<'a> {
    /// Indexes every token `id` whose text is `bytes[offsets[id]..offsets[id + 1]]`; for
    /// duplicate texts the later id wins (as in llama.cpp's map).
    pub fn new(bytes: &'a [u8], offsets: &'a [u32]) -> TextIndex<'a> {
        let n = offsets.len().saturating_sub(1);
        // Load factor 0.5..0.6 for Qwen's 152k (2^18 slots, 2 MiB): short probes, small table.
        let cap = (n + n / 2).next_power_of_two().max(16);
        let mut index = TextIndex {
            bytes,
            offsets,
            slots: vec![(EMPTY, 0); cap],
            mask: cap - 1,
        };
        for id in 0..n as u32 {
            index.insert(id);
        }
        index
    }

    /// Whether token `id` exists and has text `s` (a cheap check of a guessed id).
    #[inline]
    pub fn is(&self, id: u32, s: &[u8]) -> bool {
        (id as usize) + 1 < self.offsets.len() && self.text(id) == s
    }

    #[inline]
    fn text(&self, id: u32) -> &'a [u8] {
        let i = id as usize;
        &self.bytes[self.offsets[i] as usize..self.offsets[i + 1] as usize]
    }

    fn insert(&mut self, id: u32) {
        let t = self.text(id);
        let h = hash(t);
        let tag = (h >> 32) as u32;
        let mut i = h as usize & self.mask;
        loop {
            let (sid, stag) = self.slots[i];
            if sid == EMPTY {
                self.slots[i] = (id, tag);
                return;
            }
            if stag == tag && self.text(sid) == t {
                self.slots[i] = (id, tag);
                return;
            }
            i = (i + 1) & self.mask;
        }
    }

    /// The id of the token whose text is `s`.
    #[inline]
    pub fn get(&self, s: &[u8]) -> Option<u32> {
        let h = hash(s);
        let tag = (h >> 32) as u32;
        let mut i = h as usize & self.mask;
        loop {
            let (sid, stag) = self.slots[i];
            if sid == EMPTY {
                return None;
            }
            if stag == tag && self.text(sid) == s {
                return Some(sid);
            }
            i = (i + 1) & self.mask;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_every_text_and_later_duplicates_win() {
        let texts = ["a", "bb", "", "a", "ccc", "Ġthe"];
        let mut bytes = Vec::new();
        let mut offsets = vec![0u32];
        for t in texts {
            bytes.extend_from_slice(t.as_bytes());
            offsets.push(bytes.len() as u32);
        }
        let idx = TextIndex::new(&bytes, &offsets);
        assert_eq!(idx.get(b"a"), Some(3));
        assert_eq!(idx.get(b"bb"), Some(1));
        assert_eq!(idx.get(b""), Some(2));
        assert_eq!(idx.get("Ġthe".as_bytes()), Some(5));
        assert_eq!(idx.get(b"zz"), None);
    }
}
