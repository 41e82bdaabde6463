//! Model drafters through the generation loop on fake models: a draft equal to the target
//! (every draft accepted) and a wrong one (every draft rejected) give plain decoding's
//! tokens; the wrong one's drafting pauses so it runs few draft forwards; neither the
//! target's KV nor the draft's ever holds a row past what its owner knows (the fakes assert
//! every entry starts where the sequence's KV ends); `p_min` and `draft_min` cut proposals.

use super::*;
use crate::test_support::greedy;
use crate::{generate, GenerateRequest, TokenBytes};
use minfer_engine::BatchLogits;
use minfer_engine::{BatchEntry, LogitsModel, SeqId};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

const VOCAB: usize = 32;

/// Greedy next token = (t · mul + add) mod VOCAB of the row's own token, with `peak` the
/// winning logit over zeros (the draft's confidence).
struct Affine {
    mul: u32,
    add: u32,
    peak: f32,
    len: HashMap<SeqId, usize>,
    forwards: Arc<AtomicUsize>,
    /// Most entries one forward held.
    widest: Arc<AtomicUsize>,
    created: u32,
    /// The free cells it reports as a SeqHost.
    free: usize,
    logits: BatchLogits,
}

fn affine(mul: u32, add: u32) -> Affine {
    Affine {
        mul,
        add,
        peak: 10.0,
        len: HashMap::new(),
        forwards: Arc::default(),
        widest: Arc::default(),
        created: 100,
        free: 4096,
        logits: BatchLogits::default(),
    }
}

impl LogitsModel for Affine {
    type Error = std::io::Error;
    fn forward_batch(&mut self, entries: &[BatchEntry]) -> Result<&BatchLogits, Self::Error> {
        self.forwards.fetch_add(1, Ordering::Relaxed);
        self.widest.fetch_max(entries.len(), Ordering::Relaxed);
        let mut data = Vec::new();
        let mut rows = Vec::new();
        for e in entries {
            let len = self.len.entry(e.seq).or_default();
            assert_eq!(e.pos0, *len, "an entry must start where the KV ends");
            *len += e.tokens.len();
            rows.push((data.len() / VOCAB, e.logits));
            for &t in &e.tokens[e.tokens.len() - e.logits..] {
                let mut l = vec![0.0; VOCAB];
                l[((t * self.mul + self.add) % VOCAB as u32) as usize] = self.peak;
                data.extend(l);
            }
        }
        self.logits = BatchLogits::from_rows(data, rows, VOCAB);
        Ok(&self.logits)
    }
    fn context_len(&self) -> usize {
        4096
    }
    fn max_batch(&self) -> usize {
        512
    }
    fn default_seq(&self) -> SeqId {
        SeqId(0)
    }
    fn seq_truncate(&mut self, seq: SeqId, len: usize) -> Result<(), Self::Error> {
        let l = self.len.entry(seq).or_default();
        assert!(len <= *l, "truncate to {len} past the end {l}");
        *l = len;
        Ok(())
    }
}

impl crate::sched::SeqHost for Affine {
    fn seq_create(&mut self) -> SeqId {
        self.created += 1;
        self.len.insert(SeqId(self.created), 0);
        SeqId(self.created)
    }
    fn seq_release(&mut self, seq: SeqId) {
        assert!(
            self.len.remove(&seq).is_some(),
            "release of an unknown {seq:?}"
        );
    }
    fn seq_share_prefix(&mut self, _: SeqId, _: SeqId, _: usize) -> bool {
        false
    }
    fn shareable_prefix(&self, _: SeqId) -> usize {
        0
    }
    fn free_cells(&self) -> usize {
        self.free
    }
}

struct Ids;
impl TokenBytes for Ids {
    fn token_bytes(&self, id: u32) -> Vec<u8> {
        vec![b'A' + id as u8]
    }
}

fn with_draft(prompt: Vec<u32>, n: usize, d: Option<DraftHandle>) -> GenerateRequest {
    GenerateRequest {
        draft: d,
        ..greedy(prompt, n)
    }
}

fn cfg(draft_max: usize) -> DraftConfig {
    DraftConfig {
        draft_max,
        draft_min: 0,
        p_min: 0.0,
    }
}

#[test]
fn a_draft_equal_to_the_target_is_always_accepted() {
    let prompt = vec![3, 9, 4];
    for (n, max) in [(60, 8), (13, 3), (1, 8)] {
        let mut plain = affine(7, 3);
        let a = generate(
            &mut plain,
            &Ids,
            &with_draft(prompt.clone(), n, None),
            |_| {},
        )
        .unwrap();
        let mut target = affine(7, 3);
        let draft = affine(7, 3);
        let draft_forwards = Arc::clone(&draft.forwards);
        let h = DraftHandle::new(EngineDraft::new(draft), cfg(max));
        let b = generate(
            &mut target,
            &Ids,
            &with_draft(prompt.clone(), n, Some(h)),
            |_| {},
        )
        .unwrap();
        assert_eq!(a.tokens, b.tokens, "n {n} max {max}");
        assert_eq!(a.text, b.text);
        let s = b.speculative.expect("stats");
        assert_eq!(s.accepted, s.drafted, "n {n}: every draft holds");
        if n > 2 {
            // Control: drafts really ran and saved target forwards.
            assert!(s.drafted > 0);
            let (fa, fb) = (
                plain.forwards.load(Ordering::Relaxed),
                target.forwards.load(Ordering::Relaxed),
            );
            assert!(fb < fa, "n {n}: {fb} forwards with drafts, {fa} plain");
            assert!(draft_forwards.load(Ordering::Relaxed) > 0);
        }
    }
}

#[test]
fn a_wrong_draft_gives_plain_tokens_and_pauses() {
    let prompt = vec![5, 1];
    let n = 300;
    let mut plain = affine(7, 3);
    let a = generate(
        &mut plain,
        &Ids,
        &with_draft(prompt.clone(), n, None),
        |_| {},
    )
    .unwrap();
    let mut target = affine(7, 3);
    let draft = affine(5, 1);
    let draft_forwards = Arc::clone(&draft.forwards);
    let h = DraftHandle::new(EngineDraft::new(draft), cfg(8));
    let b = generate(&mut target, &Ids, &with_draft(prompt, n, Some(h)), |_| {}).unwrap();
    assert_eq!(a.tokens, b.tokens);
    let s = b.speculative.unwrap();
    assert!(s.drafted > 0, "control: the draft ran");
    assert!(s.accepted * 4 < s.drafted, "{s:?}: the draft is wrong");
    // The pause doubles (8, 16, 32, 64, 128): few forwards of 300 verify a draft.
    assert!(s.verify_forwards <= 20, "{s:?}");
    let df = draft_forwards.load(Ordering::Relaxed);
    assert!(df <= 40, "{df} draft forwards for {n} tokens");
}

#[test]
fn p_min_and_draft_min_cut_proposals() {
    let prompt = vec![3, 9, 4];
    // An unsure draft (peak 1 over 31 zeros: top probability ~0.08) proposes nothing under
    // p_min 0.5 and everything under 0.
    for (p_min, none) in [(0.5, true), (0.0, false)] {
        let mut target = affine(7, 3);
        let mut draft = affine(7, 3);
        draft.peak = 1.0;
        let c = DraftConfig { p_min, ..cfg(8) };
        let h = DraftHandle::new(EngineDraft::new(draft), c);
        let b = generate(
            &mut target,
            &Ids,
            &with_draft(prompt.clone(), 30, Some(h)),
            |_| {},
        )
        .unwrap();
        assert_eq!(b.speculative.unwrap().drafted == 0, none, "p_min {p_min}");
    }
    // draft_min above draft_max: no proposal is long enough.
    let mut target = affine(7, 3);
    let c = DraftConfig {
        draft_min: 9,
        ..cfg(8)
    };
    let h = DraftHandle::new(EngineDraft::new(affine(7, 3)), c);
    let b = generate(&mut target, &Ids, &with_draft(prompt, 30, Some(h)), |_| {}).unwrap();
    assert_eq!(b.speculative.unwrap().drafted, 0);
}

#[test]
fn the_draft_kv_follows_the_history_across_generations() {
    // Two generations through one draft engine (a chat's turns, or requests in turn): the
    // second keeps the common prefix and drops the rest (the fake asserts the positions).
    let draft = EngineDraft::new(affine(7, 3));
    let h = DraftHandle::new(draft, cfg(4));
    for prompt in [vec![3, 9, 4], vec![3, 9, 6, 2], vec![8]] {
        let mut plain = affine(7, 3);
        let a = generate(
            &mut plain,
            &Ids,
            &with_draft(prompt.clone(), 20, None),
            |_| {},
        )
        .unwrap();
        let mut target = affine(7, 3);
        let b = generate(
            &mut target,
            &Ids,
            &with_draft(prompt, 20, Some(h.clone())),
            |_| {},
        )
        .unwrap();
        assert_eq!(a.tokens, b.tokens);
        assert!(b.speculative.unwrap().accepted > 0);
    }
}

#[test]
fn sampled_drafts_carry_their_q_and_repeat_by_seed() {
    let prompt = vec![3, 9, 4];
    let run = |seed: u64| {
        let mut target = affine(7, 3);
        target.peak = 2.0;
        let mut draft = affine(7, 3);
        draft.peak = 1.0;
        let h = DraftHandle::new(EngineDraft::new(draft), cfg(4));
        let mut req = with_draft(prompt.clone(), 40, Some(h));
        req.sampler.temperature = 1.0;
        req.sampler.seed = seed;
        generate(&mut target, &Ids, &req, |_| {}).unwrap()
    };
    let (a, b, c) = (run(1), run(1), run(2));
    assert_eq!(a.tokens, b.tokens, "the same seed repeats");
    assert_ne!(
        a.tokens, c.tokens,
        "control: another seed draws differently"
    );
    let s = a.speculative.unwrap();
    assert!(s.drafted > 0 && s.accepted < s.drafted, "{s:?}");
}

#[test]
fn pick_is_greedy_or_a_draw_from_a_normalised_top() {
    let logits: Vec<f32> = (0..40).map(|i| (i % 7) as f32).collect();
    let mut rng = Rng::new(3);
    let greedy = DraftHow {
        temperature: 0.0,
        p_min: 0.0,
    };
    let (t, top, q) = pick(&logits, greedy, &mut rng).unwrap();
    assert_eq!((t, q), (6, None), "the first of the best (ties by id)");
    let z: f64 = logits.iter().map(|&l| ((l - 6.0) as f64).exp()).sum();
    assert!((top as f64 - 1.0 / z).abs() < 1e-6);
    let sampled = DraftHow {
        temperature: 0.7,
        p_min: 0.0,
    };
    let (t, _, q) = pick(&logits, sampled, &mut rng).unwrap();
    let q = q.unwrap();
    assert_eq!(q.len(), Q_TOP);
    assert!((q.iter().map(|e| e.1).sum::<f64>() - 1.0).abs() < 1e-12);
    assert!(q.iter().any(|e| e.0 == t));
    assert!(pick(&[f32::NAN, 1.0], greedy, &mut rng).is_err());
}

/// Three sequences decoding at once in one Batcher, each drafting through one shared engine.
fn three_at_once(h: &DraftHandle) -> Vec<(usize, crate::SeqGen)> {
    let mut target = affine(7, 3);
    let mut b = crate::Batcher::new(512);
    for (i, p) in [vec![3, 9, 4], vec![1], vec![7, 7, 2, 5]]
        .into_iter()
        .enumerate()
    {
        let req = with_draft(p, 40, Some(h.clone()));
        let g = crate::SeqGen::new::<std::io::Error>(SeqId(i as u32 + 1), &req, 4096).unwrap();
        b.push(i, g);
    }
    while b.step(&mut target, &Ids, |_, _, _| {}).unwrap() {
        if b.iter().all(|(_, g)| g.is_done()) {
            break;
        }
    }
    b.take_where(|_, _| true)
}

#[test]
fn several_sequences_draft_at_once_in_shared_forwards_and_close_their_sequences() {
    let plain: Vec<Vec<u32>> = [vec![3, 9, 4], vec![1], vec![7, 7, 2, 5]]
        .into_iter()
        .map(|p| {
            let r = with_draft(p, 40, None);
            generate(&mut affine(7, 3), &Ids, &r, |_| {})
                .unwrap()
                .tokens
        })
        .collect();
    let draft = affine(7, 3);
    let (forwards, widest) = (Arc::clone(&draft.forwards), Arc::clone(&draft.widest));
    let h = DraftHandle::new(EngineDraft::multi(draft), cfg(4));
    let out = three_at_once(&h);
    assert_eq!(
        h.open_seqs(),
        3,
        "each live sequence holds its own draft sequence"
    );
    let mut drafted = 0;
    for (i, g) in &out {
        assert!(g.failure().is_none());
        assert_eq!(g.out.tokens, plain[*i], "sequence {i}");
        let s = g.out.speculative.unwrap();
        assert!(s.accepted > 0 && s.accepted == s.drafted, "{s:?}");
        drafted += s.drafted;
    }
    drop(out);
    assert_eq!(
        h.open_seqs(),
        0,
        "a dropped sequence closes its draft sequence"
    );
    // Batched: a draft forward held a row of every sequence, and the draft ran fewer
    // forwards than the tokens it drafted (one sequence at a time, it would run at least
    // one per drafted token).
    assert_eq!(widest.load(Ordering::Relaxed), 3);
    let f = forwards.load(Ordering::Relaxed);
    assert!(f < drafted, "{f} draft forwards for {drafted} drafts");
}

#[test]
fn a_one_sequence_draft_engine_refuses_a_second_sequence_by_failing_it() {
    let h = DraftHandle::new(EngineDraft::new(affine(7, 3)), cfg(4));
    let out = three_at_once(&h);
    let failed: Vec<String> = out
        .iter()
        .filter_map(|(_, g)| g.failure().map(|f| format!("{f:?}")))
        .collect();
    assert_eq!(failed.len(), 2, "{failed:?}");
    assert!(failed[0].contains("one sequence at a time"), "{failed:?}");
    // Control: the sequence that holds the default sequence drafted and finished.
    let ok: Vec<_> = out.iter().filter(|(_, g)| g.failure().is_none()).collect();
    assert_eq!(ok.len(), 1);
    assert!(ok[0].1.out.speculative.unwrap().accepted > 0);
}

#[test]
fn a_draft_without_free_cells_proposes_nothing_and_the_tokens_stay_plain() {
    let prompt = vec![3, 9, 4];
    let mut plain = affine(7, 3);
    let a = generate(
        &mut plain,
        &Ids,
        &with_draft(prompt.clone(), 30, None),
        |_| {},
    )
    .unwrap();
    for (free, drafts) in [(3, false), (4096, true)] {
        let mut draft = affine(7, 3);
        draft.free = free;
        let h = DraftHandle::new(EngineDraft::multi(draft), cfg(4));
        let mut target = affine(7, 3);
        let b = generate(
            &mut target,
            &Ids,
            &with_draft(prompt.clone(), 30, Some(h)),
            |_| {},
        )
        .unwrap();
        assert_eq!(a.tokens, b.tokens, "free {free}");
        // Control: with cells to spare the same draft drafts.
        assert_eq!(b.speculative.unwrap().drafted > 0, drafts, "free {free}");
    }
}
