//! The steppable batch loop: sequences join and leave between forwards, and every
//! [`Batcher::step`] is one forward that advances all of them (continuous batching).
//!
//! A step holds one decode token per generating sequence first, then prompt chunks of the
//! sequences still prefilling, in the order they joined, while the step has room: at most
//! `chunk` prompt tokens and the model's batch size in all. A long prompt therefore reads
//! over several steps while running streams keep decoding. Each sequence's rows are computed
//! as they would be alone (batch invariance), so its tokens do not depend on the others or on
//! where its prompt was cut.

use crate::draft::{propose_all, DraftJob};
use crate::seq::{Failure, Planned, SeqGen, Step, TokenLogprob};
use crate::{GenerateError, LogitsModel, TokenBytes};
use minfer_engine::BatchEntry;
use std::collections::VecDeque;
use std::time::Instant;

/// What happened to one sequence in a step.
pub enum Event<'a> {
    /// A token was sampled; `text` is what became final with it (maybe empty, maybe more
    /// than the token's own bytes once a held stop-string prefix is released).
    Token {
        id: u32,
        text: &'a [u8],
        logprob: Option<&'a TokenLogprob>,
    },
    /// A prompt chunk was read (no token sampled yet).
    Prefilled { tokens: usize },
    /// The sequence finished (its `out` is complete) or failed ([`SeqGen::failure`]).
    Done,
}

/// A sequence's part of one forward.
#[derive(Clone, Copy)]
enum Part {
    /// Its last sampled token, then `drafts` drafted tokens to verify (prompt lookup).
    Decode { drafts: usize },
    /// Prompt tokens `start..start + len`.
    Prompt { start: usize, len: usize },
}

/// The running sequences, each with the caller's tag `T`.
pub struct Batcher<T> {
    seqs: Vec<(T, SeqGen)>,
    chunk: usize,
    /// Most prompt tokens the next step may read (cells left in the arena); None: `chunk`.
    prompt_cap: Option<usize>,
    /// The last step's decode rows and prompt tokens.
    last: (usize, usize),
    row: Vec<f32>,
}

/// A forward failed for some sequences: each is marked failed (and got its `Done` event);
/// the step's other sequences advanced as usual.
#[derive(Debug)]
pub struct StepFailed<E: std::error::Error + 'static> {
    /// The first failure's error.
    pub error: GenerateError<E>,
    /// How many sequences failed.
    pub sequences: usize,
}

impl<T> Batcher<T> {
    /// `chunk`: most prompt tokens one step reads (all sequences together).
    pub fn new(chunk: usize) -> Self {
        Batcher {
            seqs: Vec::new(),
            chunk: chunk.max(1),
            prompt_cap: None,
            last: (0, 0),
            row: Vec::new(),
        }
    }

    pub fn push(&mut self, tag: T, g: SeqGen) {
        self.seqs.push((tag, g));
    }

    pub fn len(&self) -> usize {
        self.seqs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &(T, SeqGen)> {
        self.seqs.iter()
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut (T, SeqGen)> {
        self.seqs.iter_mut()
    }

    /// Generation rows of the next step: one per decoding sequence plus its drafts (each
    /// row needs one new KV cell). `n_ctx`: the model's context.
    pub fn decode_rows(&self, n_ctx: usize) -> usize {
        self.seqs
            .iter()
            .filter(|(_, g)| !g.done && g.pending.is_some())
            .map(|(_, g)| 1 + g.draft_bound(n_ctx))
            .sum()
    }

    /// Prompt tokens still to read, over every sequence.
    pub fn prompt_backlog(&self) -> usize {
        self.seqs
            .iter()
            .filter(|(_, g)| !g.done)
            .map(|(_, g)| g.prompt.len() - g.fed)
            .sum()
    }

    /// The shape of the last step: decode rows and prompt tokens it read.
    pub fn last_step(&self) -> (usize, usize) {
        self.last
    }

    /// Limits the prompt tokens of the next step only (e.g. to the free KV cells).
    pub fn cap_next_prompt(&mut self, n: usize) {
        self.prompt_cap = Some(n);
    }

    /// Takes out every sequence `pred` selects (finished, failed, cancelled…), in order.
    pub fn take_where(&mut self, mut pred: impl FnMut(&T, &SeqGen) -> bool) -> Vec<(T, SeqGen)> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < self.seqs.len() {
            if pred(&self.seqs[i].0, &self.seqs[i].1) {
                out.push(self.seqs.remove(i));
            } else {
                i += 1;
            }
        }
        out
    }

    /// One forward over every sequence that has work (see the module docs). Returns false
    /// when none had any. `on_event` sees each sequence's events of this step in order.
    pub fn step<M: LogitsModel>(
        &mut self,
        model: &mut M,
        vocab: &dyn TokenBytes,
        mut on_event: impl FnMut(&mut T, &SeqGen, Event),
    ) -> Result<bool, StepFailed<M::Error>> {
        let n_ctx = model.context_len();
        let budget = model.max_batch().max(1);
        let mut plan: Vec<(usize, Part)> = Vec::new();
        let mut drafted: Vec<Vec<u32>> = Vec::new();
        let mut room = budget;
        // Each decoding sequence's drafts: lookup's are made here; a draft model's are asked
        // of its engine below, every sequence's at once (the draft's forwards batched across
        // them), with room kept for as many as asked.
        let mut planned: Vec<(usize, Planned)> = Vec::new();
        for (i, (_, g)) in self.seqs.iter_mut().enumerate() {
            if !g.done && g.pending.is_some() && room > 0 {
                let p = g.plan_drafts(room - 1, n_ctx);
                room -= 1 + match &p {
                    Planned::Ready(d) => d.len(),
                    Planned::Model(n) => *n,
                };
                planned.push((i, p));
            }
        }
        let mut proposed: Vec<Result<Vec<u32>, String>> = Vec::new();
        {
            let mut want = planned.iter().filter_map(|(i, p)| match p {
                Planned::Model(n) => Some((*i, *n)),
                Planned::Ready(_) => None,
            });
            let mut next = want.next();
            let mut jobs: Vec<DraftJob<'_>> = Vec::new();
            for (i, (_, g)) in self.seqs.iter_mut().enumerate() {
                let Some((j, n)) = next.filter(|&(j, _)| j == i) else {
                    continue;
                };
                debug_assert_eq!(j, i);
                next = want.next();
                if let Some(draft) = g.model_draft.as_mut() {
                    jobs.push(DraftJob {
                        draft,
                        history: &g.history,
                        n_prompt: g.prompt.len(),
                        want: n,
                        result: Ok(Vec::new()),
                    });
                }
            }
            propose_all(&mut jobs);
            proposed.extend(jobs.into_iter().map(|j| j.result));
        }
        let mut proposed = proposed.into_iter();
        room = budget;
        for (i, p) in planned {
            let (tag, g) = &mut self.seqs[i];
            let d = match p {
                Planned::Ready(d) => d,
                // A draft model's failure fails the sequence (never a silent fall back to
                // plain decoding).
                Planned::Model(_) => match proposed.next().expect("one result per job") {
                    Ok(d) => d,
                    Err(e) => {
                        g.fail(Failure::Forward(e));
                        on_event(tag, g, Event::Done);
                        continue;
                    }
                },
            };
            let d = g.cut_drafts(d);
            plan.push((i, Part::Decode { drafts: d.len() }));
            room -= 1 + d.len();
            drafted.push(d);
        }
        let cap = self.prompt_cap.take().unwrap_or(usize::MAX);
        let prompt_budget = self.chunk.min(room).min(cap);
        let mut prompt_room = prompt_budget;
        for (i, (_, g)) in self.seqs.iter().enumerate() {
            if g.done || g.fed >= g.prompt.len() || prompt_room == 0 {
                continue;
            }
            let len = (g.prompt.len() - g.fed).min(prompt_room);
            plan.push((i, Part::Prompt { start: g.fed, len }));
            prompt_room -= len;
        }
        let decodes = plan
            .iter()
            .map(|(_, p)| match p {
                Part::Decode { drafts } => 1 + drafts,
                Part::Prompt { .. } => 0,
            })
            .sum();
        self.last = (decodes, prompt_budget - prompt_room);
        if plan.is_empty() {
            return Ok(false);
        }
        // The entries' tokens, copied out of the sequences (a few hundred ids at most), so
        // the entries stay valid while the loop below updates the sequences between forwards.
        let mut drafted = drafted.into_iter();
        let tokens: Vec<Vec<u32>> = plan
            .iter()
            .map(|&(i, part)| {
                let g = &self.seqs[i].1;
                match part {
                    Part::Decode { .. } => {
                        let mut t = vec![g.pending.unwrap_or(0)];
                        t.extend(drafted.next().unwrap_or_default());
                        t
                    }
                    Part::Prompt { start, len } => g.prompt[start..start + len].to_vec(),
                }
            })
            .collect();
        let entries: Vec<BatchEntry> = plan
            .iter()
            .zip(&tokens)
            .map(|(&(i, part), toks)| {
                let g = &self.seqs[i].1;
                match part {
                    Part::Decode { .. } => {
                        BatchEntry::generated(g.seq, toks, g.base() + g.history.len() - 1)
                    }
                    // Only the prompt's last chunk samples the first reply token.
                    Part::Prompt { start, len } => BatchEntry::prompt(
                        g.seq,
                        toks,
                        g.base() + start,
                        usize::from(start + len == g.prompt.len()),
                    ),
                }
            })
            .collect();
        // Every planned entry runs: the whole plan in one forward, or, after a failure, in the
        // groups below. A group runs from the table as the last forward left it (a failed
        // forward puts the cells back), and each sequence's rows do not depend on what else
        // shares its forward, so a sequence that reruns gets the tokens it would have got.
        let mut groups: VecDeque<Vec<usize>> = VecDeque::from([(0..plan.len()).collect()]);
        let mut failed: Option<StepFailed<M::Error>> = None;
        let mut sub: Vec<BatchEntry> = Vec::new();
        while let Some(group) = groups.pop_front() {
            sub.clear();
            sub.extend(group.iter().map(|&j| entries[j]));
            let e = match model.forward_batch(&sub) {
                Ok(out) => {
                    for (k, &j) in group.iter().enumerate() {
                        let (i, part) = plan[j];
                        self.absorb(
                            i,
                            part,
                            sub[k].tokens,
                            out.logits(k),
                            vocab,
                            n_ctx,
                            &mut on_event,
                        );
                    }
                    // Drafted rows past the first rejected one are dropped from the KV, so no
                    // rejected token survives the step (the next entry would drop them too,
                    // but a finished sequence has no next entry).
                    let mut cut = Vec::new();
                    for &j in &group {
                        let (i, part) = plan[j];
                        if let Part::Decode { drafts } = part {
                            let g = &self.seqs[i].1;
                            if drafts > 0 && g.kv_len() < entries[j].pos0 + 1 + drafts {
                                cut.push((i, g.kv_len()));
                            }
                        }
                    }
                    for (i, len) in cut {
                        let seq = self.seqs[i].1.seq;
                        if let Err(e) = model.seq_truncate(seq, len) {
                            let (tag, g) = &mut self.seqs[i];
                            g.fail(Failure::Forward(e.to_string()));
                            on_event(tag, g, Event::Done);
                        }
                    }
                    continue;
                }
                Err(e) => e,
            };
            // Which sequence broke the forward. One alone is its own culprit; otherwise only
            // an error naming its entry says. An error that names none could come from any of
            // them (a device error, a full arena): failing them all would end requests that
            // are fine, so each reruns alone, and only those that fail alone fail. That costs
            // a forward per sequence, on a path that should not happen.
            let culprit = if group.len() == 1 {
                Some(0)
            } else {
                M::failed_entry(&e).filter(|&k| k < group.len())
            };
            match culprit {
                Some(k) => {
                    let (i, _) = plan[group[k]];
                    let (tag, g) = &mut self.seqs[i];
                    g.fail(Failure::Forward(e.to_string()));
                    on_event(tag, g, Event::Done);
                    let rest: Vec<usize> = group
                        .iter()
                        .enumerate()
                        .filter(|&(n, _)| n != k)
                        .map(|(_, &j)| j)
                        .collect();
                    if !rest.is_empty() {
                        groups.push_back(rest);
                    }
                    match &mut failed {
                        Some(f) => f.sequences += 1,
                        None => {
                            failed = Some(StepFailed {
                                error: GenerateError::Model(e),
                                sequences: 1,
                            })
                        }
                    }
                }
                None => groups.extend(group.into_iter().map(|j| vec![j])),
            }
        }
        match failed {
            Some(f) => Err(f),
            None => Ok(true),
        }
    }

    /// Takes one entry's forward result into its sequence: a prompt chunk read, or the
    /// logits rows its next tokens are sampled from (the pending token's row, then one per
    /// draft: each draft counts while verification keeps it; the first rejected one's row
    /// gives the token drawn in its place and ends the rows).
    #[allow(clippy::too_many_arguments)]
    fn absorb(
        &mut self,
        i: usize,
        part: Part,
        tokens: &[u32],
        logits: &[f32],
        vocab: &dyn TokenBytes,
        n_ctx: usize,
        on_event: &mut impl FnMut(&mut T, &SeqGen, Event),
    ) {
        let now = Instant::now();
        let Batcher { seqs, row, .. } = self;
        let (tag, g) = &mut seqs[i];
        let drafts: &[u32] = match part {
            Part::Decode { drafts } => &tokens[1..1 + drafts],
            Part::Prompt { len, .. } => {
                g.fed += len;
                if logits.is_empty() {
                    on_event(tag, g, Event::Prefilled { tokens: len });
                    return;
                }
                g.mark_prefilled(now);
                &[]
            }
        };
        if g.max_tokens_is_zero() {
            // Prefill only: nothing to sample.
            g.finish_timings(now);
            on_event(tag, g, Event::Done);
            return;
        }
        let rows = drafts.len() + 1;
        let width = logits.len() / rows;
        let mut accepted = 0;
        for r in 0..rows {
            row.clear();
            row.extend_from_slice(&logits[r * width..(r + 1) * width]);
            // Rows with a draft are verified (speculative sampling's rule); the row after
            // the last draft, reached only when every draft held, samples plainly.
            let draft = drafts.get(r).map(|&x| (r, x));
            let (text, done, held) = match g.accept(row, draft, vocab, n_ctx) {
                Ok((Step::Text(t), held)) => (t, false, held),
                Ok((Step::Done(t), held)) => (t, true, held),
                Err(e) => {
                    g.fail(Failure::Sampler(e));
                    on_event(tag, g, Event::Done);
                    break;
                }
            };
            g.out.text.extend_from_slice(&text);
            let id = *g.out.tokens.last().expect("accept pushed a token");
            {
                let g: &SeqGen = g;
                on_event(
                    tag,
                    g,
                    Event::Token {
                        id,
                        text: &text,
                        logprob: g.out.logprobs.last(),
                    },
                );
            }
            if held {
                accepted += 1;
                if !done {
                    continue;
                }
            }
            // The forward's verdict is in: count it before the sequence's output is final
            // (drafts past a row that ended the sequence were never verified).
            let verified = if done {
                (r + 1).min(drafts.len())
            } else {
                drafts.len()
            };
            g.drafts_verified(verified, accepted);
            if done {
                g.finish_timings(Instant::now());
                on_event(tag, g, Event::Done);
            }
            return;
        }
        // A sampler failure ended the rows early.
        g.drafts_verified(drafts.len(), accepted);
    }
}

#[cfg(test)]
#[path = "batcher_tests.rs"]
mod tests;
