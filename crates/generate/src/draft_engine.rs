//! A [`LogitsModel`] (an engine) as a draft: [`EngineDraft`].
//!
//! Each target sequence that drafts holds a sequence of the draft's own (its KV cells and
//! the list of tokens they hold, by position). Over one engine, [`EngineDraft::new`] drafts
//! for one sequence at a time on the model's default sequence (`run`, `chat`: a chat's next
//! turn keeps the common prefix the last one left); [`EngineDraft::multi`] creates and
//! releases a sequence per target sequence (`serve`: several sequences draft at once).
//!
//! A proposal for several sequences batches the draft's forwards across them: first every
//! sequence's catch-up (the history the draft has not seen: a new prompt, the tokens kept
//! since, after truncating what a rejected draft left) as entries of shared forwards, each
//! within the model's batch; then one forward per drafted position holding one row for every
//! sequence still drafting. So k drafts for s sequences cost k draft forwards of s rows,
//! not s·k forwards of one.

use super::{pick, Ask, DraftModel, DraftSeq, Proposal};
use crate::sched::SeqHost;
use minfer_engine::{BatchEntry, LogitsModel, SeqId};
use std::collections::{HashMap, VecDeque};

/// Creates, releases and counts the free cells of a model's sequences ([`EngineDraft::multi`]).
struct Host<M> {
    create: fn(&mut M) -> SeqId,
    release: fn(&mut M, SeqId),
    free: fn(&M) -> usize,
}

/// One draft sequence: its KV sequence and the tokens it holds, by position.
struct Slot {
    seq: SeqId,
    fed: Vec<u32>,
    open: bool,
}

/// A [`LogitsModel`] (an engine) as a draft (see the module docs).
pub struct EngineDraft<M: LogitsModel> {
    model: M,
    host: Option<Host<M>>,
    slots: HashMap<usize, Slot>,
    next: usize,
    /// Draft forwards run.
    pub forwards: usize,
    /// Ids the draft reads (its vocabulary) and may propose (the target's): a history with
    /// an id the draft lacks gets no proposal, and a proposal stops before an id the target
    /// lacks (the vocabulary check allows sizes 128 apart).
    draft_vocab: usize,
    target_vocab: usize,
}

/// One ask's progress through a batched proposal.
struct Run {
    /// The ask's index.
    ask: usize,
    slot: usize,
    max: usize,
    /// Catch-up parts still to feed: tokens, prompt rows or not.
    parts: VecDeque<(Vec<u32>, bool)>,
    /// The row after the last fed token, once the catch-up is fed.
    logits: Option<Vec<f32>>,
    proposal: Proposal,
}

impl<M: LogitsModel> EngineDraft<M> {
    /// Drafts for one sequence at a time, on the model's default sequence.
    pub fn new(model: M) -> EngineDraft<M> {
        let seq = model.default_seq();
        let mut slots = HashMap::new();
        slots.insert(
            0,
            Slot {
                seq,
                fed: Vec::new(),
                open: false,
            },
        );
        EngineDraft {
            model,
            host: None,
            slots,
            next: 1,
            forwards: 0,
            draft_vocab: usize::MAX,
            target_vocab: usize::MAX,
        }
    }

    /// Bounds the ids read and proposed (see the fields).
    pub fn with_vocab(mut self, draft: usize, target: usize) -> EngineDraft<M> {
        self.draft_vocab = draft;
        self.target_vocab = target;
        self
    }

    /// Runs one forward of `entries` (slot, tokens, prompt rows, wants logits); the last
    /// row's logits of each entry that wants them. A failure resets the slots it touched
    /// (what the forward wrote is not known to be whole).
    fn forward(
        &mut self,
        entries: &[(usize, &[u32], bool, bool)],
    ) -> Result<Vec<Option<Vec<f32>>>, String> {
        let batch: Vec<BatchEntry> = entries
            .iter()
            .map(|&(slot, tokens, prompt, logits)| {
                let s = &self.slots[&slot];
                if prompt {
                    BatchEntry::prompt(s.seq, tokens, s.fed.len(), usize::from(logits))
                } else {
                    BatchEntry::generated(s.seq, tokens, s.fed.len())
                }
            })
            .collect();
        self.forwards += 1;
        let res = match self.model.forward_batch(&batch) {
            Ok(l) => Ok(entries
                .iter()
                .enumerate()
                .map(|(k, e)| {
                    e.3.then(|| {
                        let rows = l.logits(k);
                        rows[rows.len() - l.vocab()..].to_vec()
                    })
                })
                .collect::<Vec<_>>()),
            Err(e) => Err(format!("draft model forward failed: {e}")),
        };
        drop(batch);
        match res {
            Ok(out) => {
                for &(slot, tokens, _, _) in entries {
                    let s = self.slots.get_mut(&slot).expect("a slot of this proposal");
                    s.fed.extend_from_slice(tokens);
                }
                Ok(out)
            }
            Err(e) => {
                for &(slot, ..) in entries {
                    let s = self.slots.get_mut(&slot).expect("a slot of this proposal");
                    let _ = self.model.seq_truncate(s.seq, 0);
                    s.fed.clear();
                }
                Err(e)
            }
        }
    }

    /// Prepares an ask: truncates its slot to the common prefix with the history and queues
    /// the catch-up. None: the ask gets an empty proposal (nothing to draft, an id the
    /// draft lacks, no room in the draft's KV).
    fn prepare(&mut self, i: usize, a: &Ask<'_>, free: &mut usize) -> Result<Option<Run>, String> {
        let slot = a.seq.0;
        let fed = match self.slots.get(&slot) {
            Some(s) if s.open => &s.fed,
            _ => return Err(format!("draft sequence {slot} is not open")),
        };
        let h = a.history;
        // The history and every draft but the last are fed: they must fit the draft's context.
        let max = a
            .max
            .min((self.model.context_len() + 1).saturating_sub(h.len()));
        if max == 0 || h.is_empty() {
            return Ok(None);
        }
        // Keep what the KV shares with the history (at least the last token is fed again:
        // its row gives the first draft).
        let common = fed
            .iter()
            .zip(h)
            .take_while(|(x, y)| x == y)
            .count()
            .min(h.len() - 1);
        if h[common..].iter().any(|&t| t as usize >= self.draft_vocab) {
            return Ok(None);
        }
        if self.host.is_some() {
            // Cells this ask may take: its catch-up and every draft but the last (the cells
            // past `common` it holds now come back when it is truncated).
            let back = fed.len() - common;
            let need = (h.len() - common + max - 1).saturating_sub(back);
            if need > *free {
                return Ok(None);
            }
            *free -= need;
        }
        let s = self.slots.get_mut(&slot).expect("checked above");
        if common < s.fed.len() {
            self.model
                .seq_truncate(s.seq, common)
                .map_err(|e| format!("draft model KV truncate failed: {e}"))?;
            s.fed.truncate(common);
        }
        // Prompt rows below the prompt's length, generation rows after it, as the target
        // computed them (ADR 0011's row classes), so a draft that is the target itself
        // proposes exactly the target's picks; chunks of the model's batch.
        let chunk = self.model.max_batch().max(1);
        let rest = &h[common..];
        let split = a.n_prompt.saturating_sub(common).min(rest.len());
        let (prompt, generated) = rest.split_at(split);
        let mut parts: VecDeque<(Vec<u32>, bool)> =
            prompt.chunks(chunk).map(|c| (c.to_vec(), true)).collect();
        parts.extend(generated.chunks(chunk).map(|c| (c.to_vec(), false)));
        Ok(Some(Run {
            ask: i,
            slot,
            max,
            parts,
            logits: None,
            proposal: Proposal::default(),
        }))
    }
}

impl<M: SeqHost> EngineDraft<M> {
    /// Drafts for any number of sequences at once, one sequence of `model`'s own for each
    /// (created at `open`, released at `close`); an ask that would not fit the free cells
    /// gets no proposal.
    pub fn multi(model: M) -> EngineDraft<M> {
        let mut d = EngineDraft::new(model);
        d.slots.clear();
        d.host = Some(Host {
            create: |m| m.seq_create(),
            release: |m, s| m.seq_release(s),
            free: |m| m.free_cells(),
        });
        d
    }
}

impl<M: LogitsModel + Send> DraftModel for EngineDraft<M> {
    fn open(&mut self) -> Result<DraftSeq, String> {
        match &self.host {
            None => {
                let s = self.slots.get_mut(&0).expect("the default sequence's slot");
                if s.open {
                    return Err(
                        "this draft engine drafts for one sequence at a time (its default sequence)"
                            .into(),
                    );
                }
                s.open = true;
                Ok(DraftSeq(0))
            }
            Some(h) => {
                let seq = (h.create)(&mut self.model);
                let id = self.next;
                self.next += 1;
                self.slots.insert(
                    id,
                    Slot {
                        seq,
                        fed: Vec::new(),
                        open: true,
                    },
                );
                Ok(DraftSeq(id))
            }
        }
    }

    fn close(&mut self, seq: DraftSeq) {
        match &self.host {
            // The default sequence keeps its tokens: the next generation keeps the prefix
            // it shares with them.
            None => {
                if let Some(s) = self.slots.get_mut(&seq.0) {
                    s.open = false;
                }
            }
            Some(h) => {
                if let Some(s) = self.slots.remove(&seq.0) {
                    (h.release)(&mut self.model, s.seq);
                }
            }
        }
    }

    fn open_seqs(&self) -> usize {
        self.slots.values().filter(|s| s.open).count()
    }

    fn forwards(&self) -> usize {
        self.forwards
    }

    fn propose(&mut self, asks: &mut [Ask<'_>]) -> Vec<Result<Proposal, String>> {
        let mut out: Vec<Result<Proposal, String>> = vec![Ok(Proposal::default()); asks.len()];
        let mut free = self
            .host
            .as_ref()
            .map_or(usize::MAX, |h| (h.free)(&self.model));
        let mut runs = Vec::new();
        for (i, a) in asks.iter().enumerate() {
            match self.prepare(i, a, &mut free) {
                Ok(Some(r)) => runs.push(r),
                Ok(None) => {}
                Err(e) => out[i] = Err(e),
            }
        }
        let chunk = self.model.max_batch().max(1);
        // The catch-up: each forward takes the next part of every run it has room for.
        while runs.iter().any(|r| !r.parts.is_empty()) {
            let mut room = chunk;
            let mut taken: Vec<usize> = Vec::new();
            for (k, r) in runs.iter().enumerate() {
                if let Some((p, _)) = r.parts.front() {
                    if p.len() <= room {
                        room -= p.len();
                        taken.push(k);
                    }
                }
            }
            let parts: Vec<(Vec<u32>, bool)> = taken
                .iter()
                .map(|&k| runs[k].parts.pop_front().expect("taken above"))
                .collect();
            let entries: Vec<(usize, &[u32], bool, bool)> = taken
                .iter()
                .zip(&parts)
                .map(|(&k, (t, prompt))| (runs[k].slot, &t[..], *prompt, runs[k].parts.is_empty()))
                .collect();
            match self.forward(&entries) {
                Ok(logits) => {
                    for (&k, l) in taken.iter().zip(logits) {
                        if l.is_some() {
                            runs[k].logits = l;
                        }
                    }
                }
                Err(e) => {
                    for &k in &taken {
                        out[runs[k].ask] = Err(e.clone());
                    }
                    let failed: Vec<usize> = taken.iter().map(|&k| runs[k].ask).collect();
                    runs.retain(|r| !failed.contains(&r.ask));
                }
            }
        }
        // Decoding: one token per run and forward, the runs still drafting sharing each.
        while !runs.is_empty() {
            let mut going: Vec<usize> = Vec::new();
            let mut finished: Vec<usize> = Vec::new();
            for (k, r) in runs.iter_mut().enumerate() {
                let a = &mut asks[r.ask];
                let logits = r.logits.take().expect("every run has its row");
                match pick(&logits, a.how, a.rng) {
                    Err(e) => {
                        out[r.ask] = Err(e);
                        finished.push(k);
                    }
                    Ok((tok, top, q)) => {
                        if top < a.how.p_min || tok as usize >= self.target_vocab {
                            finished.push(k);
                            continue;
                        }
                        r.proposal.tokens.push(tok);
                        if let Some(q) = q {
                            r.proposal.q.push(q);
                        }
                        if r.proposal.tokens.len() == r.max {
                            finished.push(k);
                        } else {
                            going.push(k);
                        }
                    }
                }
            }
            for &k in &finished {
                if out[runs[k].ask].is_ok() {
                    out[runs[k].ask] = Ok(std::mem::take(&mut runs[k].proposal));
                }
            }
            let mut failed: Vec<usize> = Vec::new();
            for group in going.chunks(chunk) {
                let toks: Vec<[u32; 1]> = group
                    .iter()
                    .map(|&k| [*runs[k].proposal.tokens.last().expect("pushed above")])
                    .collect();
                let entries: Vec<(usize, &[u32], bool, bool)> = group
                    .iter()
                    .zip(&toks)
                    .map(|(&k, t)| (runs[k].slot, &t[..], false, true))
                    .collect();
                match self.forward(&entries) {
                    Ok(logits) => {
                        for (&k, l) in group.iter().zip(logits) {
                            runs[k].logits = l;
                        }
                    }
                    Err(e) => {
                        for &k in group {
                            out[runs[k].ask] = Err(e.clone());
                            failed.push(k);
                        }
                    }
                }
            }
            let mut k = 0;
            runs.retain(|_| {
                let keep = going.contains(&k) && !failed.contains(&k);
                k += 1;
                keep
            });
        }
        out
    }
}
