//! The draft length every drafter adapts (issue 31): prompt lookup's and a draft model's.
//!
//! The length doubles (to `draft_max`) while every draft holds and falls to one more than
//! the accepted run (at least `draft_min`) otherwise. After three forwards in a row with nothing accepted
//! the sequence drafts nothing for a pause; the one parameter in which the drafters differ
//! is how the pause grows when the misses recur: lookup's stays at [`PAUSE`] forwards (its
//! drafts cost nothing to make), a draft model's doubles each time up to [`MODEL_PAUSE_MAX`]
//! (each of its drafts costs a draft forward), and an accepted draft resets it.

use crate::lookup::SpecStats;

/// Forwards a sequence drafts nothing after three misses in a row (the first pause).
pub(crate) const PAUSE: usize = 8;
/// The longest pause a draft model's sequence doubles up to.
pub(crate) const MODEL_PAUSE_MAX: usize = 256;

/// A sequence's adaptive draft length, pause and counts.
#[derive(Clone, Debug)]
pub(crate) struct Adaptive {
    draft_max: usize,
    draft_min: usize,
    /// The longest pause (`PAUSE`: it never grows).
    pause_max: usize,
    /// Draft length for the next forward.
    k: usize,
    /// Forwards in a row that had nothing accepted.
    misses: usize,
    /// Forwards left without drafting.
    pause: usize,
    /// The pause the next run of misses starts.
    next_pause: usize,
    pub(crate) stats: SpecStats,
}

impl Adaptive {
    /// `pause_max`: [`PAUSE`] for a pause that never grows, more for one that doubles.
    pub(crate) fn new(draft_max: usize, draft_min: usize, pause_max: usize) -> Adaptive {
        let max = draft_max.max(1);
        Adaptive {
            draft_max: max,
            draft_min,
            pause_max: pause_max.max(PAUSE),
            k: max.clamp(1, 4).max(draft_min).min(max),
            misses: 0,
            pause: 0,
            next_pause: PAUSE,
            stats: SpecStats::default(),
        }
    }

    /// At most how many drafts the next forward verifies (0 while paused).
    pub(crate) fn want(&self, limit: usize) -> usize {
        if self.pause > 0 {
            0
        } else {
            self.k.min(limit)
        }
    }

    /// A forward whose draft gained nothing; the third in a row starts a pause.
    pub(crate) fn miss(&mut self) {
        self.misses += 1;
        if self.misses >= 3 {
            self.misses = 0;
            self.pause = self.next_pause;
            self.next_pause = (self.next_pause * 2).min(self.pause_max);
        }
    }

    /// Counts a forward: `drafted` verified, `accepted` of them held (no drafts: a forward
    /// of the pause).
    pub(crate) fn update(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            self.pause = self.pause.saturating_sub(1);
            return;
        }
        self.stats.drafted += drafted;
        self.stats.accepted += accepted;
        self.stats.verify_forwards += 1;
        if accepted == drafted {
            self.k = (self.k * 2).min(self.draft_max);
        } else {
            self.k = (accepted + 1).max(self.draft_min).min(self.draft_max);
        }
        if accepted == 0 {
            self.miss();
        } else {
            self.misses = 0;
            self.next_pause = PAUSE;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three misses, then the pause's forwards; returns how long the pause was.
    fn pause_after_misses(a: &mut Adaptive) -> usize {
        for _ in 0..3 {
            assert!(a.want(99) > 0);
            a.update(1, 0);
        }
        let mut n = 0;
        while a.want(99) == 0 {
            a.update(0, 0);
            n += 1;
        }
        n
    }

    #[test]
    fn the_pause_is_fixed_for_lookup_and_doubles_for_a_model() {
        let mut lookup = Adaptive::new(8, 0, PAUSE);
        let mut model = Adaptive::new(8, 0, MODEL_PAUSE_MAX);
        let l: Vec<usize> = (0..6).map(|_| pause_after_misses(&mut lookup)).collect();
        let m: Vec<usize> = (0..7).map(|_| pause_after_misses(&mut model)).collect();
        assert_eq!(l, [8; 6]);
        assert_eq!(m, [8, 16, 32, 64, 128, 256, 256]);
        // An accepted draft resets the model's pause to the first one.
        model.update(2, 1);
        assert_eq!(pause_after_misses(&mut model), 8);
    }

    #[test]
    fn the_length_doubles_and_falls_to_the_accepted_run() {
        let mut a = Adaptive::new(16, 2, MODEL_PAUSE_MAX);
        assert_eq!(a.want(99), 4);
        assert_eq!(a.want(3), 3, "the limit bounds it");
        a.update(4, 4);
        assert_eq!(a.want(99), 8);
        a.update(8, 8);
        a.update(16, 16);
        assert_eq!(a.want(99), 16, "capped at draft_max");
        a.update(16, 5);
        assert_eq!(a.want(99), 6);
        a.update(6, 0);
        assert_eq!(a.want(99), 2, "draft_min bounds the fall");
        assert_eq!(
            a.stats,
            SpecStats {
                drafted: 50,
                accepted: 33,
                verify_forwards: 5
            }
        );
    }
}
