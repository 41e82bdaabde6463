//! The batcher's failure handling on a fake model: a forward that fails while it holds one
//! sequence fails that sequence only, whether the error names its entry or not, and the
//! others produce the tokens they produce without it.
//!
//! Control (tried by hand once, then reverted): failing every sequence of a failed forward
//! (the batcher before issue 34) fails both tests at the batch-mates' failure.

use super::*;
use crate::test_support::{greedy, Letters};
use minfer_engine::{BatchLogits, SeqId};

#[derive(Debug)]
struct Broke {
    entry: Option<usize>,
}

impl std::fmt::Display for Broke {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "broke at {:?}", self.entry)
    }
}

impl std::error::Error for Broke {}

/// Next token (last + 1) mod 26, greedily; any forward holding `poison` fails.
struct Flaky {
    poison: Option<SeqId>,
    names_entry: bool,
    logits: BatchLogits,
    forwards: usize,
}

impl LogitsModel for Flaky {
    type Error = Broke;
    fn forward_batch(&mut self, entries: &[BatchEntry]) -> Result<&BatchLogits, Broke> {
        self.forwards += 1;
        if let Some(k) = entries.iter().position(|e| Some(e.seq) == self.poison) {
            return Err(Broke {
                entry: self.names_entry.then_some(k),
            });
        }
        let mut data = Vec::new();
        let mut rows = Vec::new();
        for e in entries {
            rows.push((data.len() / 26, e.logits));
            if e.logits == 1 {
                let mut l = vec![0.0; 26];
                l[(*e.tokens.last().unwrap() as usize + 1) % 26] = 10.0;
                data.extend(l);
            }
        }
        self.logits = BatchLogits::from_rows(data, rows, 26);
        Ok(&self.logits)
    }
    fn context_len(&self) -> usize {
        100
    }
    fn max_batch(&self) -> usize {
        512
    }
    fn default_seq(&self) -> SeqId {
        SeqId(0)
    }
    fn seq_truncate(&mut self, _: SeqId, _: usize) -> Result<(), Broke> {
        Ok(())
    }
    fn failed_entry(e: &Broke) -> Option<usize> {
        e.entry
    }
}

/// Three sequences to the end; `poison` (after `after` steps) breaks every forward that
/// holds it. Returns each one's tokens, or None when it failed, and the steps that failed.
fn run(poison: Option<SeqId>, names_entry: bool, after: usize) -> (Vec<Option<Vec<u32>>>, usize) {
    let mut m = Flaky {
        poison: None,
        names_entry,
        logits: BatchLogits::default(),
        forwards: 0,
    };
    let mut b = Batcher::new(512);
    for (i, p) in [vec![0, 1], vec![5], vec![9, 9, 9]].into_iter().enumerate() {
        b.push(
            i,
            SeqGen::new::<Broke>(SeqId(i as u32 + 1), &greedy(p, 6), 100).unwrap(),
        );
    }
    let mut failed_steps = 0;
    for step in 0.. {
        if step == after {
            m.poison = poison;
        }
        match b.step(&mut m, &Letters, |_, _, _| {}) {
            Ok(false) => break,
            Ok(true) => {}
            Err(f) => {
                assert_eq!(f.sequences, 1, "one sequence failed");
                failed_steps += 1;
            }
        }
        b.take_where(|_, g| g.is_done() && g.failure().is_some());
        if b.iter().all(|(_, g)| g.is_done()) {
            break;
        }
    }
    let mut out = vec![None; 3];
    for (i, g) in b.take_where(|_, _| true) {
        out[i] = Some(g.out.tokens.clone());
    }
    (out, failed_steps)
}

#[test]
fn a_forward_failing_on_one_sequence_fails_only_it_whether_or_not_the_error_names_it() {
    let (reference, none_failed) = run(None, false, 0);
    assert_eq!(none_failed, 0);
    assert!(reference
        .iter()
        .all(|t| t.as_ref().is_some_and(|t| t.len() == 6)));
    for names_entry in [true, false] {
        let (got, failed) = run(Some(SeqId(2)), names_entry, 3);
        assert_eq!(failed, 1, "names_entry {names_entry}");
        assert_eq!(got[1], None, "the poisoned sequence failed");
        assert_eq!(got[0], reference[0], "names_entry {names_entry}");
        assert_eq!(got[2], reference[2], "names_entry {names_entry}");
    }
}
