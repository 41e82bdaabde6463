//! Token text -> id lookup used while building the merge table: an open-addressing table whose
//! slots hold the id, the length and the first 8 bytes of the text, over the vocabulary's
//! contiguous text buffer. Most token texts fit in 8 bytes, so most probes touch one slot and
//! no text, where a `HashMap<&str, u32>` chases a pointer per probe; building Qwen's merge
//! table is up to three lookups per merge, and their cache misses are its cost.

use crate::bpe::FxHasher;
use std::hash::Hasher;

const EMPTY: u32 = u32::MAX;

pub struct TextIndex<'a> {
    bytes: &'a [u8],
    offsets: &'a [u32],
    slots: Vec<Slot>,
    mask: usize,
}

#[derive(Clone, Copy)]
struct Slot {
    /// `EMPTY` marks a free slot.
    id: u32,
    len: u32,
    /// The first 8 bytes, zero-padded.
    head: u64,
}

#[inline]
fn head(s: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    let n = s.len().min(8);
    w[..n].copy_from_slice(&s[..n]);
    u64::from_le_bytes(w)
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
            slots: vec![
                Slot {
                    id: EMPTY,
                    len: 0,
                    head: 0
                };
                cap
            ],
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

    #[inline]
    fn matches(&self, slot: Slot, s: &[u8], h: u64) -> bool {
        slot.len as usize == s.len()
            && slot.head == h
            && (s.len() <= 8 || self.text(slot.id)[8..] == s[8..])
    }

    fn insert(&mut self, id: u32) {
        let t = self.text(id);
        let hd = head(t);
        let mut i = hash(t) as usize & self.mask;
        loop {
            let slot = self.slots[i];
            if slot.id == EMPTY || self.matches(slot, t, hd) {
                self.slots[i] = Slot {
                    id,
                    len: t.len() as u32,
                    head: hd,
                };
                return;
            }
            i = (i + 1) & self.mask;
        }
    }

    /// The id of the token whose text is `s`.
    #[inline]
    pub fn get(&self, s: &[u8]) -> Option<u32> {
        let hd = head(s);
        let mut i = hash(s) as usize & self.mask;
        loop {
            let slot = self.slots[i];
            if slot.id == EMPTY {
                return None;
            }
            if self.matches(slot, s, hd) {
                return Some(slot.id);
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
        let texts = [
            "a",
            "bb",
            "",
            "a",
            "ccc",
            "Ġthe",
            "abcdefghij",
            "abcdefghik",
        ];
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
        assert_eq!(idx.get(b"abcdefghij"), Some(6));
        assert_eq!(idx.get(b"abcdefghik"), Some(7));
        assert_eq!(idx.get(b"abcdefghi"), None);
        assert_eq!(idx.get(b"abcdefghijk"), None);
    }
}
