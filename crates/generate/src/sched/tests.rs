//! The scheduler over a fake host (no model): admission, prefix sharing, the KV budget,
//! parking of equal prompts, cancellation and the end of everything. Each test's control is
//! the same scenario with the property's input turned off (no cache, room enough, …), which
//! must give the other answer.

use super::*;
use crate::test_support::{greedy, Letters};
use minfer_engine::{BatchEntry, BatchLogits, LogitsModel};
use std::collections::HashMap;

/// Next token (last + 1) mod 26, greedily; a KV of `n_cells` cells where a shared prefix
/// costs nothing and every token a forward writes costs one cell.
struct Fake {
    n_cells: usize,
    next_seq: u32,
    /// Per sequence: (positions shared from another, positions of its own).
    seqs: HashMap<SeqId, (usize, usize)>,
    released: Vec<SeqId>,
    shares: Vec<(SeqId, SeqId, usize)>,
    /// Sequences and token counts of every forward.
    forwards: Vec<Vec<(SeqId, usize)>>,
    logits: BatchLogits,
}

impl Fake {
    fn new(n_cells: usize) -> Fake {
        Fake {
            n_cells,
            next_seq: 1,
            seqs: HashMap::new(),
            released: Vec::new(),
            shares: Vec::new(),
            forwards: Vec::new(),
            logits: BatchLogits::default(),
        }
    }
}

impl LogitsModel for Fake {
    type Error = std::io::Error;
    fn forward_batch(&mut self, entries: &[BatchEntry]) -> Result<&BatchLogits, Self::Error> {
        let mut data = Vec::new();
        let mut rows = Vec::new();
        let mut at = 0;
        for e in entries {
            let s = self.seqs.get_mut(&e.seq).expect("a created sequence");
            assert_eq!(s.0 + s.1, e.pos0, "entries continue their sequence");
            s.1 += e.tokens.len();
            rows.push((at, e.logits));
            at += e.logits;
            if e.logits == 1 {
                let mut l = vec![0.0; 26];
                l[(*e.tokens.last().unwrap() as usize + 1) % 26] = 10.0;
                data.extend(l);
            }
        }
        let used: usize = self.seqs.values().map(|s| s.1).sum();
        assert!(used <= self.n_cells, "the scheduler overfilled the KV");
        self.forwards
            .push(entries.iter().map(|e| (e.seq, e.tokens.len())).collect());
        self.logits = BatchLogits::from_rows(data, rows, 26);
        Ok(&self.logits)
    }
    fn context_len(&self) -> usize {
        self.n_cells
    }
    fn max_batch(&self) -> usize {
        64
    }
    fn default_seq(&self) -> SeqId {
        SeqId(0)
    }
    fn seq_truncate(&mut self, seq: SeqId, len: usize) -> Result<(), Self::Error> {
        let s = self.seqs.get_mut(&seq).expect("a created sequence");
        s.1 = len - s.0;
        Ok(())
    }
}

impl SeqHost for Fake {
    fn seq_create(&mut self) -> SeqId {
        let s = SeqId(self.next_seq);
        self.next_seq += 1;
        self.seqs.insert(s, (0, 0));
        s
    }
    fn seq_release(&mut self, seq: SeqId) {
        self.seqs.remove(&seq);
        self.released.push(seq);
    }
    fn seq_share_prefix(&mut self, dst: SeqId, src: SeqId, n: usize) -> bool {
        self.shares.push((dst, src, n));
        self.seqs.insert(dst, (n, 0));
        true
    }
    fn shareable_prefix(&self, _: SeqId) -> usize {
        usize::MAX
    }
    fn free_cells(&self) -> usize {
        self.n_cells - self.seqs.values().map(|s| s.1).sum::<usize>()
    }
}

/// What the tests record per tag (the tag is a request number).
#[derive(Default, Debug)]
struct Log {
    started: Vec<(usize, usize)>,
    text: HashMap<usize, Vec<u8>>,
    done: Vec<(usize, FinishReason)>,
    failed: Vec<(usize, String)>,
}

fn run(sched: &mut Scheduler<usize>, host: &mut Fake, log: &mut Log) {
    for _ in 0..1000 {
        if sched.is_idle() {
            return;
        }
        step(sched, host, log);
    }
    panic!("the scheduler never went idle");
}

fn step(sched: &mut Scheduler<usize>, host: &mut Fake, log: &mut Log) {
    let _ = sched.step(host, &Letters, |&mut t, ev| record(log, t, ev));
}

fn record(log: &mut Log, t: usize, ev: SchedEvent) {
    match ev {
        SchedEvent::Started { cached, .. } => log.started.push((t, cached)),
        SchedEvent::Token { text, .. } | SchedEvent::Text(text) => {
            log.text.entry(t).or_default().extend_from_slice(text)
        }
        SchedEvent::Done { gen, .. } => log.done.push((t, gen.out.finish)),
        SchedEvent::Failed { message, .. } => log.failed.push((t, message)),
        SchedEvent::Admitted => {}
    }
}

fn cfg(parallel: usize, chunk: usize, cache_entries: usize) -> SchedConfig {
    SchedConfig {
        parallel,
        chunk,
        cache_entries,
    }
}

#[test]
fn admission_waits_for_a_free_place() {
    let mut host = Fake::new(1000);
    let mut s = Scheduler::new(cfg(2, 64, 0));
    for t in 0..3 {
        s.submit(vec![(t, greedy(vec![t as u32, 1, 2], 4))]);
    }
    let mut log = Log::default();
    step(&mut s, &mut host, &mut log);
    assert_eq!(s.last_step().running, 2);
    assert_eq!(s.waiting_jobs(), 1);
    run(&mut s, &mut host, &mut log);
    // The third started only after one of the first two finished.
    assert_eq!(
        log.started.iter().map(|s| s.0).collect::<Vec<_>>(),
        [0, 1, 2]
    );
    let first_done = host
        .forwards
        .iter()
        .position(|f| f.iter().any(|(seq, _)| *seq == SeqId(3)))
        .unwrap();
    assert!(first_done >= 4, "request 2 ran before a place was free");
    assert_eq!(log.done.len(), 3);
    assert_eq!(log.text[&2], b"defg");
    // Control: room for all three runs them together from the first forward.
    let mut host = Fake::new(1000);
    let mut s = Scheduler::new(cfg(3, 64, 0));
    for t in 0..3 {
        s.submit(vec![(t, greedy(vec![t as u32, 1, 2], 4))]);
    }
    step(&mut s, &mut host, &mut Log::default());
    assert_eq!(s.last_step().running, 3);
}

#[test]
fn a_later_prompt_shares_the_cached_prefix() {
    for cache in [4, 0] {
        let mut host = Fake::new(1000);
        let mut s = Scheduler::new(cfg(4, 64, cache));
        let mut log = Log::default();
        s.submit(vec![(0, greedy(vec![5, 6, 7, 8], 2))]);
        run(&mut s, &mut host, &mut log);
        s.submit(vec![(1, greedy(vec![5, 6, 7, 9, 9], 2))]);
        run(&mut s, &mut host, &mut log);
        if cache > 0 {
            // The first sequence's cells hold 5 6 7 8 9 (its prompt and first reply token).
            assert_eq!(log.started[1], (1, 3));
            assert_eq!(host.shares, vec![(SeqId(2), SeqId(1), 3)]);
            assert_eq!(host.forwards.last().unwrap(), &vec![(SeqId(2), 1)]);
            assert_eq!(s.cached_prefixes(), 2);
        } else {
            // Control: nothing cached, nothing shared, the whole prompt computed.
            assert_eq!(log.started[1], (1, 0));
            assert!(host.shares.is_empty());
            assert_eq!(host.released, vec![SeqId(1), SeqId(2)]);
        }
        assert_eq!(log.text[&1], b"kl");
    }
}

#[test]
fn prompts_read_what_the_kv_has_left_and_a_full_context_ends_one() {
    // Two sequences of 6-token prompts in a KV of 10 cells: the prompts read in the room
    // left, and when the decodes no longer fit the longest sequence ends with `context`.
    let mut host = Fake::new(10);
    let mut s = Scheduler::new(cfg(2, 64, 0));
    let mut log = Log::default();
    s.submit(vec![(0, greedy(vec![0; 6], 8))]);
    s.submit(vec![(1, greedy(vec![1; 6], 8))]);
    run(&mut s, &mut host, &mut log);
    let total: usize = host.forwards[0].iter().map(|e| e.1).sum();
    assert_eq!(total, 10, "the first forward reads what the KV holds");
    assert!(log.done.contains(&(0, FinishReason::Context)));
    assert!(log.failed.is_empty());
    // Control: a KV large enough ends both by their token limit.
    let mut host = Fake::new(100);
    let mut s = Scheduler::new(cfg(2, 64, 0));
    let mut log = Log::default();
    s.submit(vec![(0, greedy(vec![0; 6], 8))]);
    s.submit(vec![(1, greedy(vec![1; 6], 8))]);
    run(&mut s, &mut host, &mut log);
    assert_eq!(host.forwards[0].iter().map(|e| e.1).sum::<usize>(), 12);
    assert!(log.done.iter().all(|d| d.1 == FinishReason::Length));
}

#[test]
fn equal_prompts_of_a_job_share_the_first_ones_cells() {
    let mut host = Fake::new(1000);
    let mut s = Scheduler::new(cfg(4, 64, 0));
    let mut log = Log::default();
    let p = vec![3, 4, 5, 6];
    s.submit(vec![(0, greedy(p.clone(), 2)), (1, greedy(p, 2))]);
    run(&mut s, &mut host, &mut log);
    assert_eq!(log.started, vec![(0, 0), (1, 3)]);
    assert_eq!(log.text[&0], log.text[&1]);
    // Control: different prompts start together and share nothing.
    let mut host = Fake::new(1000);
    let mut s = Scheduler::new(cfg(4, 64, 0));
    let mut log = Log::default();
    s.submit(vec![
        (0, greedy(vec![3, 4, 5, 6], 2)),
        (1, greedy(vec![9, 4, 5, 6], 2)),
    ]);
    run(&mut s, &mut host, &mut log);
    assert_eq!(log.started, vec![(0, 0), (1, 0)]);
}

#[test]
fn cancelled_sequences_free_their_cells_and_say_where_they_stood() {
    let mut host = Fake::new(1000);
    let mut s = Scheduler::new(cfg(1, 64, 0));
    let mut log = Log::default();
    s.submit(vec![(0, greedy(vec![1, 2, 3], 50))]);
    s.submit(vec![(1, greedy(vec![4, 5, 6], 50))]);
    s.submit(vec![(2, greedy(vec![7, 8, 9], 50))]);
    step(&mut s, &mut host, &mut log);
    step(&mut s, &mut host, &mut log);
    let gone = s.cancel_where(&mut host, |&t| t != 2);
    assert_eq!(gone, vec![(1, Stage::Waiting), (0, Stage::Running)]);
    assert_eq!(host.released, vec![SeqId(1)]);
    assert!(host.seqs.is_empty());
    run(&mut s, &mut host, &mut log);
    assert_eq!(log.done, vec![(2, FinishReason::Length)]);
    // Control: cancelling nothing changes nothing.
    assert!(s.cancel_where(&mut host, |_| true).is_empty());
}

#[test]
fn finishing_all_fails_the_queue_and_ends_the_running() {
    let mut host = Fake::new(1000);
    let mut s = Scheduler::new(cfg(1, 64, 0));
    let mut log = Log::default();
    s.submit(vec![(0, greedy(vec![1, 2, 3], 50))]);
    s.submit(vec![(1, greedy(vec![4, 5, 6], 50))]);
    step(&mut s, &mut host, &mut log);
    let jobs = s.finish_all(&mut host, FinishReason::Length, "bye", |&mut t, ev| {
        record(&mut log, t, ev)
    });
    assert_eq!(jobs, 1);
    assert_eq!(log.failed, vec![(1, "bye".to_string())]);
    assert_eq!(log.done, vec![(0, FinishReason::Length)]);
    assert_eq!(log.text[&0], b"e");
    assert!(s.is_idle());
}

#[test]
fn a_started_sequence_stays_the_callers() {
    // A caller's own sequence (run, chat) continues from its base position and is neither
    // cached nor released when it finishes.
    let mut host = Fake::new(100);
    let seq = host.seq_create();
    host.seqs.insert(seq, (0, 5));
    let mut s = Scheduler::new(cfg(1, 64, 4));
    let mut log = Log::default();
    s.start(
        0,
        SeqGen::resume::<std::io::Error>(seq, 5, &greedy(vec![1, 2], 3), 100).unwrap(),
    );
    run(&mut s, &mut host, &mut log);
    assert_eq!(log.text[&0], b"def");
    assert!(host.released.is_empty());
    assert_eq!(s.cached_prefixes(), 0);
    assert_eq!(host.seqs[&seq], (0, 5 + 2 + 2));
    // Control: the same request submitted runs on a sequence of the scheduler's, which
    // becomes a cached prefix.
    s.submit(vec![(1, greedy(vec![1, 2], 3))]);
    run(&mut s, &mut host, &mut log);
    assert_eq!(s.cached_prefixes(), 1);
}
