//! The prefix cache: finished sequences kept in the KV arena with the tokens their cells
//! hold, so a later prompt that starts the same way shares those cells in place.
//!
//! Lookup compares a prompt with every cached entry and every running sequence (the caller
//! passes those) and picks the longest common prefix. Entries are evicted least recently
//! used first when the arena needs cells, and when there are more than `max_entries`.

use minfer_engine::SeqId;

pub struct Cached {
    pub seq: SeqId,
    pub tokens: Vec<u32>,
    last_used: u64,
}

pub struct PrefixCache {
    entries: Vec<Cached>,
    max_entries: usize,
    clock: u64,
}

/// The length of the common prefix of two token lists.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl PrefixCache {
    pub fn new(max_entries: usize) -> Self {
        PrefixCache {
            entries: Vec::new(),
            max_entries,
            clock: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// The cached entry sharing the longest prefix with `prompt`, marked used.
    pub fn best(&mut self, prompt: &[u32]) -> Option<(SeqId, usize)> {
        let (i, n) = self
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| (i, common_prefix(&e.tokens, prompt)))
            .max_by_key(|&(i, n)| (n, std::cmp::Reverse(i)))?;
        if n == 0 {
            return None;
        }
        let t = self.tick();
        self.entries[i].last_used = t;
        Some((self.entries[i].seq, n))
    }

    /// Keeps a finished sequence. Returns the sequences to release: the new one when an
    /// entry already covers its tokens, entries it covers, and the least recently used
    /// ones past `max_entries`.
    pub fn insert(&mut self, seq: SeqId, tokens: Vec<u32>) -> Vec<SeqId> {
        let mut release = Vec::new();
        if tokens.is_empty() || self.max_entries == 0 {
            release.push(seq);
            return release;
        }
        if self.entries.iter().any(|e| e.tokens.starts_with(&tokens)) {
            release.push(seq);
            return release;
        }
        self.entries.retain(|e| {
            let covered = tokens.starts_with(&e.tokens);
            if covered {
                release.push(e.seq);
            }
            !covered
        });
        let t = self.tick();
        self.entries.push(Cached {
            seq,
            tokens,
            last_used: t,
        });
        while self.entries.len() > self.max_entries {
            release.extend(self.evict_lru());
        }
        release
    }

    /// Removes the least recently used entry.
    pub fn evict_lru(&mut self) -> Option<SeqId> {
        let i = self
            .entries
            .iter()
            .enumerate()
            .min_by_key(|(_, e)| e.last_used)?
            .0;
        Some(self.entries.remove(i).seq)
    }

    /// Forgets every entry (a failed forward: what the cells hold is not trusted).
    pub fn clear(&mut self) -> Vec<SeqId> {
        self.entries.drain(..).map(|e| e.seq).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longest_prefix_wins_and_lru_goes_first() {
        let mut c = PrefixCache::new(2);
        assert!(c.insert(SeqId(1), vec![1, 2, 3]).is_empty());
        assert!(c.insert(SeqId(2), vec![1, 2, 9, 9]).is_empty());
        assert_eq!(c.best(&[1, 2, 9, 5]), Some((SeqId(2), 3)));
        assert_eq!(c.best(&[7]), None);
        // Entry 1 is now the least recently used: a third entry pushes it out.
        assert_eq!(c.insert(SeqId(3), vec![4, 5]), vec![SeqId(1)]);
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn covered_entries_are_not_kept_twice() {
        let mut c = PrefixCache::new(8);
        c.insert(SeqId(1), vec![1, 2]);
        // A longer one covers the shorter: the shorter is released.
        assert_eq!(c.insert(SeqId(2), vec![1, 2, 3]), vec![SeqId(1)]);
        // A shorter one is covered: released at once.
        assert_eq!(c.insert(SeqId(3), vec![1]), vec![SeqId(3)]);
        assert_eq!(c.len(), 1);
    }
}
