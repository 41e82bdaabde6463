//! Byte-level BPE merging over token ids.
//!
//! A word starts as one symbol per byte (the byte's token); the adjacent pair with the lowest
//! merge rank is merged, leftmost first on ties, until no pair has a rank, exactly as llama.cpp's
//! priority-queue loop does. Pairs are keyed by token ids rather than strings. A merge whose
//! result is not a vocabulary entry still happens in llama.cpp (it merges strings); its result
//! gets a "virtual" id here, and a virtual id left at the end falls back to byte tokens, as
//! llama.cpp falls back when a final symbol is not in the vocabulary.

use crate::vocab::NO_TOKEN;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

/// A small multiplicative hasher (FxHash's scheme) for integer pairs and short byte strings:
/// keys are not attacker-chosen in a way that matters here, and SipHash would dominate the
/// merge loop.
#[derive(Default, Clone, Copy)]
pub struct FxHasher {
    hash: u64,
}

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl FxHasher {
    #[inline]
    fn add(&mut self, w: u64) {
        self.hash = (self.hash.rotate_left(5) ^ w).wrapping_mul(SEED);
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.add(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(w) ^ ((rest.len() as u64) << 59));
        }
    }
    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(i as u64);
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(i as u64);
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    /// A final avalanche (splitmix64's): the multiply alone leaves the low bits, which pick
    /// the bucket, depending only on the low input bits (pair keys then collide by the
    /// thousand; measured 600 ms to build Qwen's merge table without it).
    #[inline]
    fn finish(&self) -> u64 {
        let mut z = self.hash;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

pub type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

#[inline]
fn pair_key(a: u32, b: u32) -> u64 {
    ((a as u64) << 32) | b as u64
}

/// Words longer than this (in bytes) merge with the heap; shorter ones with a linear scan,
/// which is faster for them.
const HEAP_THRESHOLD: usize = 64;

/// The merge table.
pub struct Bpe {
    /// Token of each byte.
    pub byte_ids: [u32; 256],
    /// `(left, right)` -> `(rank, merged id)`.
    merges: FxMap<u64, (u32, u32)>,
    /// Ids at and above this are virtual (merge results outside the vocabulary).
    n_vocab: u32,
    /// Bytes of each virtual id, in id order from `n_vocab`.
    virtual_bytes: Vec<Vec<u8>>,
}

impl Bpe {
    pub fn new(
        byte_ids: [u32; 256],
        merges: FxMap<u64, (u32, u32)>,
        n_vocab: u32,
        virtual_bytes: Vec<Vec<u8>>,
    ) -> Bpe {
        Bpe {
            byte_ids,
            merges,
            n_vocab,
            virtual_bytes,
        }
    }

    pub fn n_merges(&self) -> usize {
        self.merges.len()
    }

    pub fn n_virtual(&self) -> usize {
        self.virtual_bytes.len()
    }

    #[inline]
    fn rank(&self, a: u32, b: u32) -> Option<(u32, u32)> {
        self.merges.get(&pair_key(a, b)).copied()
    }

    /// Appends the tokens of one pre-tokenized word (raw bytes) to `out`.
    pub fn encode_word(&self, word: &[u8], out: &mut Vec<u32>) {
        match word.len() {
            0 => {}
            1 => self.emit(&[self.byte_ids[word[0] as usize]], out),
            n if n <= HEAP_THRESHOLD => self.merge_scan(word, out),
            _ => self.merge_heap(word, out),
        }
    }

    /// Quadratic merge for short words: keeps the rank of each adjacent pair in a vector.
    pub fn merge_scan(&self, word: &[u8], out: &mut Vec<u32>) {
        let mut ids: Vec<u32> = word.iter().map(|&b| self.byte_ids[b as usize]).collect();
        let mut ranks: Vec<(u32, u32)> = ids
            .windows(2)
            .map(|w| self.rank(w[0], w[1]).unwrap_or((u32::MAX, 0)))
            .collect();
        loop {
            let mut best = u32::MAX;
            let mut at = usize::MAX;
            for (i, &(r, _)) in ranks.iter().enumerate() {
                if r < best {
                    best = r;
                    at = i;
                }
            }
            if at == usize::MAX {
                break;
            }
            ids[at] = ranks[at].1;
            ids.remove(at + 1);
            ranks.remove(at);
            if at > 0 {
                ranks[at - 1] = self.rank(ids[at - 1], ids[at]).unwrap_or((u32::MAX, 0));
            }
            if at < ranks.len() {
                ranks[at] = self.rank(ids[at], ids[at + 1]).unwrap_or((u32::MAX, 0));
            }
        }
        self.emit(&ids, out);
    }

    /// Heap merge with a linked list of symbols (llama.cpp's algorithm), for long words.
    pub fn merge_heap(&self, word: &[u8], out: &mut Vec<u32>) {
        let n = word.len();
        if n < 2 {
            return self.merge_scan(word, out);
        }
        let mut ids: Vec<u32> = word.iter().map(|&b| self.byte_ids[b as usize]).collect();
        let mut alive = vec![true; n];
        let mut prev: Vec<usize> = (0..n).map(|i| i.wrapping_sub(1)).collect();
        let mut next: Vec<usize> = (1..=n).collect();
        // (rank, left index, left id, right id); stale entries are skipped on pop.
        let mut heap = BinaryHeap::new();
        for i in 0..n - 1 {
            if let Some((r, _)) = self.rank(ids[i], ids[i + 1]) {
                heap.push(Reverse((r, i, ids[i], ids[i + 1])));
            }
        }
        while let Some(Reverse((_, l, lid, rid))) = heap.pop() {
            if !alive[l] || ids[l] != lid {
                continue;
            }
            let r = next[l];
            if r >= n || ids[r] != rid {
                continue;
            }
            let Some((_, merged)) = self.rank(lid, rid) else {
                continue;
            };
            ids[l] = merged;
            alive[r] = false;
            next[l] = next[r];
            if next[r] < n {
                prev[next[r]] = l;
            }
            let p = prev[l];
            if p < n {
                if let Some((rk, _)) = self.rank(ids[p], ids[l]) {
                    heap.push(Reverse((rk, p, ids[p], ids[l])));
                }
            }
            let q = next[l];
            if q < n {
                if let Some((rk, _)) = self.rank(ids[l], ids[q]) {
                    heap.push(Reverse((rk, l, ids[l], ids[q])));
                }
            }
        }
        let mut final_ids = Vec::with_capacity(n);
        let mut i = 0;
        while i < n {
            final_ids.push(ids[i]);
            i = next[i];
        }
        self.emit(&final_ids, out);
    }

    /// Appends final symbols; bytes without a token ([`NO_TOKEN`]) are dropped, as llama.cpp
    /// drops them.
    fn emit(&self, ids: &[u32], out: &mut Vec<u32>) {
        for &id in ids {
            if id < self.n_vocab {
                out.push(id);
            } else if id != NO_TOKEN {
                let bytes = &self.virtual_bytes[(id - self.n_vocab) as usize];
                out.extend(
                    bytes
                        .iter()
                        .map(|&b| self.byte_ids[b as usize])
                        .filter(|&t| t != NO_TOKEN),
                );
            }
        }
    }
}
