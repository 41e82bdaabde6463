//! Prompt lookup decoding (issue 31, first drafter): a sequence proposes, as the tokens that
//! follow its last sampled one, the continuation of the most recent earlier occurrence of its
//! last `n` tokens in its own prompt and output, and one forward verifies them all as
//! generation rows (the sampled token's row, then one per draft). A reply that copies its
//! input — a code edit — accepts long runs of drafts, so a token costs a fraction of a forward.
//!
//! Verification: every row is computed as a lone decode row would be (generation rows are
//! batch invariant) and its token comes from the sequence's own sampler chain on that row
//! (penalties over the kept history, the grammar's mask), by speculative sampling's rule
//! ([`crate::speculative`]): a draft holds with probability p(x) (its q is one-hot), and the
//! first one that fails is replaced by a draw from the residual; rows past it are dropped
//! from the KV. Greedy, that is equality with the plain pick, so greedy output is plain
//! decoding's token for token; sampled output is distributed as plain sampling's (not equal
//! to it draw for draw). Under a grammar a draft stops before its first refused token.
//!
//! The draft length adapts to what is accepted (doubling while every draft holds, back to the
//! accepted run otherwise), and after three drafts in a row with nothing accepted a sequence
//! drafts nothing for a while, so a reply that never copies decodes at nearly plain speed
//! ([`crate::adaptive`], shared with the draft models).

use crate::adaptive::{Adaptive, PAUSE};

/// The drafter's settings (`--lookup N`, `--draft-max`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LookupConfig {
    /// Longest n-gram matched (shorter ones are tried down to 1).
    pub ngram: usize,
    /// Most tokens drafted for one forward.
    pub draft_max: usize,
}

impl Default for LookupConfig {
    fn default() -> Self {
        LookupConfig {
            ngram: 3,
            draft_max: 8,
        }
    }
}

/// What speculation did over one generation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SpecStats {
    /// Tokens drafted and verified.
    pub drafted: usize,
    /// Drafts verification kept (equal to the greedy pick; kept by the rule when sampling).
    pub accepted: usize,
    /// Forwards that verified at least one draft.
    pub verify_forwards: usize,
}

impl SpecStats {
    pub fn acceptance(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            self.accepted as f64 / self.drafted as f64
        }
    }
}

/// A sequence's drafter.
#[derive(Clone, Debug)]
pub(crate) struct Lookup {
    cfg: LookupConfig,
    /// Draft length, pause and counts ([`Adaptive`]; lookup's pause never grows: its
    /// drafts cost nothing to make).
    adapt: Adaptive,
}

impl Lookup {
    pub(crate) fn new(cfg: LookupConfig) -> Lookup {
        Lookup {
            adapt: Adaptive::new(cfg.draft_max, 0, PAUSE),
            cfg,
        }
    }

    pub(crate) fn stats(&self) -> SpecStats {
        self.adapt.stats
    }

    /// The drafts for the row after `history` (prompt and sampled tokens, the last one not
    /// decoded yet): at most `limit` tokens, maybe none.
    pub(crate) fn draft(&self, history: &[u32], limit: usize) -> Vec<u32> {
        let want = self.adapt.want(limit);
        if want == 0 {
            return Vec::new();
        }
        for n in (1..=self.cfg.ngram.min(history.len().saturating_sub(1))).rev() {
            let tail = &history[history.len() - n..];
            // The most recent earlier occurrence whose continuation is known.
            let mut start = history.len() - n;
            while start > 0 {
                start -= 1;
                if &history[start..start + n] == tail {
                    let from = start + n;
                    let to = (from + want).min(history.len());
                    if to > from {
                        return history[from..to].to_vec();
                    }
                }
            }
        }
        Vec::new()
    }

    /// Counts a forward: `drafted` verified, `accepted` of them held.
    pub(crate) fn update(&mut self, drafted: usize, accepted: usize) {
        self.adapt.update(drafted, accepted);
    }
}

#[cfg(test)]
#[path = "lookup_tests.rs"]
mod verify_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_latest_longest_match_is_continued() {
        let l = Lookup::new(LookupConfig {
            ngram: 3,
            draft_max: 8,
        });
        // "1 2 3 4 5 ... 1 2 3" → 4 5 (k starts at 4, capped by what follows).
        let h = [1, 2, 3, 4, 5, 9, 1, 2, 3];
        assert_eq!(l.draft(&h, 10), vec![4, 5, 9, 1]);
        assert_eq!(l.draft(&h, 2), vec![4, 5]);
        // The more recent of two occurrences wins.
        let h = [7, 8, 1, 7, 8, 2, 7, 8];
        assert_eq!(l.draft(&h, 1), vec![2]);
        // No earlier occurrence of any suffix: nothing.
        assert!(l.draft(&[1, 2, 3], 4).is_empty());
        // Control: a 1-gram matches where a 3-gram does not.
        assert_eq!(l.draft(&[5, 6, 9, 9, 6], 1), vec![9]);
    }

    #[test]
    fn the_length_adapts_and_misses_pause_drafting() {
        let mut l = Lookup::new(LookupConfig {
            ngram: 2,
            draft_max: 16,
        });
        let h: Vec<u32> = (0..60).map(|i| i % 20).collect();
        assert_eq!(l.draft(&h, 99).len(), 4);
        l.update(4, 4);
        assert_eq!(l.draft(&h, 99).len(), 8);
        l.update(8, 2);
        assert_eq!(l.draft(&h, 99).len(), 3);
        for _ in 0..3 {
            l.update(1, 0);
        }
        assert!(l.draft(&h, 99).is_empty(), "three misses pause drafting");
        for _ in 0..PAUSE {
            l.update(0, 0);
        }
        assert_eq!(l.draft(&h, 99).len(), 1);
        assert_eq!(
            l.stats(),
            SpecStats {
                drafted: 15,
                accepted: 6,
                verify_forwards: 5
            }
        );
    }
}
