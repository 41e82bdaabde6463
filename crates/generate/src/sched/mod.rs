//! The scheduler every caller drives: `serve`'s engine loop, `run`, `chat`, the viz page's
//! runs and [`crate::generate_batch`] (ADR 0012, step 5).
//!
//! It holds the queue of submitted jobs, the running sequences (a [`Batcher`]), the prefix
//! cache and the KV budget, and advances everything by one forward per [`Scheduler::step`]:
//! 1. admits queued jobs while fewer than `parallel` sequences run: each choice gets a new
//!    sequence that shares, in place, the longest prefix of its prompt held by a cached or
//!    running sequence ([`prefix`]); a choice whose prompt equals an earlier choice's of the
//!    same job is parked until that one has read it, then shares it (`n > 1`);
//! 2. makes room in the KV (least recently used cached prefixes go first; prompt reading is
//!    capped to the free cells; a sequence that cannot grow ends with `context`);
//! 3. runs one [`Batcher::step`]: one decode row per generating sequence, then prompt chunks
//!    (chunked prefill), each row computed as it would be alone (batch invariance); a failed
//!    forward fails the sequence its error names (or those that fail again alone), the others
//!    rerun, and the prefix cache is forgotten (its cells are not trusted any more);
//! 4. reaps finished sequences: a submitted job's sequence becomes a cached prefix, a
//!    sequence the caller [`start`](Scheduler::start)ed stays the caller's.
//!
//! The caller tags every sequence (`T`: where its events go) and hears about it through
//! [`SchedEvent`]s; cancellation ([`Scheduler::cancel_where`]) and ending everything
//! ([`Scheduler::finish_all`]) free cells at once. The KV is reached through [`SeqHost`], so
//! the scheduler runs over the engine, over a model wrapping it, or over a fake in tests.

mod host;
pub mod prefix;
#[cfg(test)]
mod tests;

use crate::seq::{Failure, SeqGen, TokenLogprob};
use crate::{Batcher, Event, FinishReason, GenerateRequest, StepFailed, TokenBytes};
pub(crate) use host::Direct;
pub use host::SeqHost;
use minfer_engine::SeqId;
use prefix::{common_prefix, PrefixCache};
use std::collections::VecDeque;

/// How the scheduler runs.
#[derive(Clone, Debug)]
pub struct SchedConfig {
    /// Most submitted sequences running at once (a job larger than this runs alone).
    pub parallel: usize,
    /// Most prompt tokens one forward reads (all sequences together).
    pub chunk: usize,
    /// Most finished sequences kept as cached prefixes (0: none kept).
    pub cache_entries: usize,
}

impl SchedConfig {
    /// One caller's own generations, to the end: no admission limit, prompts read in chunks
    /// of the model's batch size, nothing cached.
    pub fn direct(max_batch: usize) -> SchedConfig {
        SchedConfig {
            parallel: usize::MAX,
            chunk: max_batch,
            cache_entries: 0,
        }
    }
}

/// What happened to one of the caller's sequences.
pub enum SchedEvent<'a> {
    /// The choice's job left the queue (it starts, is parked behind an earlier choice of the
    /// same prompt, or fails at once).
    Admitted,
    /// The choice's sequence joined the running batch; `cached` prompt tokens were shared from
    /// cells already held instead of computed.
    Started {
        seq: SeqId,
        prompt: &'a [u32],
        cached: usize,
    },
    /// A token was sampled; `text` is what became final with it.
    Token {
        id: u32,
        text: &'a [u8],
        logprob: Option<&'a TokenLogprob>,
    },
    /// Held text released without a new token (a sequence the scheduler ended).
    Text(&'a [u8]),
    /// The sequence finished: `gen` holds its output, timings and the tokens of its cells.
    Done { gen: &'a SeqGen, cached: usize },
    /// The choice failed (its request, a forward or its sampler); the message says why and
    /// `failure` is the sequence's own (None for a request refused before it ran).
    Failed {
        message: String,
        failure: Option<&'a Failure>,
    },
}

/// Where a sequence stood when it was cancelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Its job was still queued.
    Waiting,
    /// Admitted, waiting for an earlier choice of its job to read the shared prompt.
    Parked,
    Running,
}

/// The shape of the last step's forward.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepReport {
    /// A forward ran.
    pub forwarded: bool,
    /// Sequences in the running batch during the forward.
    pub running: usize,
    /// Decode rows and prompt tokens it read.
    pub decodes: usize,
    pub prompt_tokens: usize,
}

/// What a finished sequence becomes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum OnFinish {
    /// A cached prefix (a submitted job's sequence, created by the scheduler).
    Cache,
    /// Nothing: the sequence is the caller's ([`Scheduler::start`]).
    Keep,
}

/// A running sequence's bookkeeping beside the caller's tag.
struct Slot<T> {
    tag: T,
    cached: usize,
    on_finish: OnFinish,
}

/// A choice waiting for an earlier choice of its job (same prompt) to read the prompt.
struct Parked<T> {
    tag: T,
    gen: SeqGen,
    leader: SeqId,
}

pub struct Scheduler<T> {
    cfg: SchedConfig,
    waiting: VecDeque<Vec<(T, GenerateRequest)>>,
    batch: Batcher<Slot<T>>,
    parked: Vec<Parked<T>>,
    cache: PrefixCache,
    last: StepReport,
}

impl<T> Scheduler<T> {
    pub fn new(cfg: SchedConfig) -> Scheduler<T> {
        Scheduler {
            batch: Batcher::new(cfg.chunk),
            cache: PrefixCache::new(cfg.cache_entries),
            cfg,
            waiting: VecDeque::new(),
            parked: Vec::new(),
            last: StepReport::default(),
        }
    }

    /// Queues a job: its choices, each run on a sequence of its own that the scheduler
    /// creates, shares prefixes into and, when it finishes, keeps as a cached prefix.
    pub fn submit(&mut self, choices: Vec<(T, GenerateRequest)>) {
        self.waiting.push_back(choices);
    }

    /// Runs `gen` on the caller's own sequence from the next step on, outside the admission
    /// limit and the prefix cache; when it finishes the sequence stays as it is.
    pub fn start(&mut self, tag: T, gen: SeqGen) {
        self.batch.push(
            Slot {
                tag,
                cached: 0,
                on_finish: OnFinish::Keep,
            },
            gen,
        );
    }

    /// Nothing queued, parked or running.
    pub fn is_idle(&self) -> bool {
        self.batch.is_empty() && self.parked.is_empty() && self.waiting.is_empty()
    }

    /// Sequences running or parked.
    pub fn running(&self) -> usize {
        self.batch.len() + self.parked.len()
    }

    /// Jobs queued, not admitted yet.
    pub fn waiting_jobs(&self) -> usize {
        self.waiting.len()
    }

    /// Finished sequences kept as cached prefixes.
    pub fn cached_prefixes(&self) -> usize {
        self.cache.len()
    }

    /// The running sequences with their tags.
    pub fn iter(&self) -> impl Iterator<Item = (&T, &SeqGen)> {
        self.batch.iter().map(|(s, g)| (&s.tag, g))
    }

    /// Tokens sequence `seq` has sampled (0 while parked); None when it is not running.
    pub fn sampled(&self, seq: SeqId) -> Option<usize> {
        match self.batch.iter().find(|(_, g)| g.seq == seq) {
            Some((_, g)) => Some(g.out.tokens.len()),
            None => self.parked.iter().any(|p| p.gen.seq == seq).then_some(0),
        }
    }

    /// The last step's forward.
    pub fn last_step(&self) -> StepReport {
        self.last
    }

    /// Drops every sequence whose tag `gone` selects (a client that went away), without
    /// events, freeing their cells at once; returns their tags and where each stood. A queued
    /// job is asked about through its first choice's tag.
    pub fn cancel_where<H: SeqHost>(
        &mut self,
        host: &mut H,
        mut gone: impl FnMut(&T) -> bool,
    ) -> Vec<(T, Stage)> {
        let mut out = Vec::new();
        let mut kept = VecDeque::new();
        for job in self.waiting.drain(..) {
            if job.first().is_some_and(|(t, _)| gone(t)) {
                out.extend(job.into_iter().map(|(t, _)| (t, Stage::Waiting)));
            } else {
                kept.push_back(job);
            }
        }
        self.waiting = kept;
        let mut parked = Vec::new();
        for p in std::mem::take(&mut self.parked) {
            if gone(&p.tag) {
                host.seq_release(p.gen.seq);
                out.push((p.tag, Stage::Parked));
            } else {
                parked.push(p);
            }
        }
        self.parked = parked;
        for (slot, g) in self.batch.take_where(|s, _| gone(&s.tag)) {
            if slot.on_finish == OnFinish::Cache {
                host.seq_release(g.seq);
            }
            out.push((slot.tag, Stage::Running));
        }
        out
    }

    /// Ends everything now: queued and parked choices fail with `message`, running sequences
    /// finish with `reason` and what they have (their held text as [`SchedEvent::Text`], then
    /// [`SchedEvent::Done`]). Returns how many queued jobs failed.
    pub fn finish_all<H: SeqHost>(
        &mut self,
        host: &mut H,
        reason: FinishReason,
        message: &str,
        mut on_event: impl FnMut(&mut T, SchedEvent),
    ) -> usize {
        let jobs = self.waiting.len();
        for job in self.waiting.drain(..) {
            for (mut tag, _) in job {
                on_event(
                    &mut tag,
                    SchedEvent::Failed {
                        message: message.into(),
                        failure: None,
                    },
                );
            }
        }
        for mut p in std::mem::take(&mut self.parked) {
            on_event(
                &mut p.tag,
                SchedEvent::Failed {
                    message: message.into(),
                    failure: None,
                },
            );
            host.seq_release(p.gen.seq);
        }
        self.finish_running(|_| true, reason, &mut on_event);
        self.reap(host, &mut on_event);
        jobs
    }

    /// Ends the running sequences `pick` selects with `reason` (their held text as
    /// [`SchedEvent::Text`]); they are reaped by the next step or [`Scheduler::finish_all`].
    fn finish_running(
        &mut self,
        mut pick: impl FnMut(&SeqGen) -> bool,
        reason: FinishReason,
        on_event: &mut impl FnMut(&mut T, SchedEvent),
    ) {
        for (slot, g) in self.batch.iter_mut() {
            if g.is_done() || !pick(g) {
                continue;
            }
            let text = g.finish_now(reason);
            if !text.is_empty() {
                on_event(&mut slot.tag, SchedEvent::Text(&text));
            }
        }
    }

    /// One turn: admission, room in the KV, one forward, reaping (see the module docs).
    /// `on_event` hears about every sequence the turn touched. Err: the forward failed for
    /// some sequences (they got their `Failed` events; the others advanced).
    pub fn step<H: SeqHost>(
        &mut self,
        host: &mut H,
        vocab: &dyn TokenBytes,
        mut on_event: impl FnMut(&mut T, SchedEvent),
    ) -> Result<StepReport, StepFailed<H::Error>> {
        self.admit(host, &mut on_event);
        self.unpark(host, &mut on_event);
        self.make_room(host, &mut on_event);
        let running = self.batch.len();
        let res = if running == 0 {
            Ok(false)
        } else {
            self.batch.step(host, vocab, |slot, _g, ev| match ev {
                Event::Token { id, text, logprob } => {
                    on_event(&mut slot.tag, SchedEvent::Token { id, text, logprob })
                }
                Event::Prefilled { .. } | Event::Done => {}
            })
        };
        let (decodes, prompt_tokens) = if running == 0 {
            (0, 0)
        } else {
            self.batch.last_step()
        };
        self.last = StepReport {
            forwarded: matches!(res, Ok(true) | Err(_)),
            running,
            decodes,
            prompt_tokens,
        };
        if res.is_err() {
            // The cells of cached prefixes are not trusted after a failed forward.
            for seq in self.cache.clear() {
                host.seq_release(seq);
            }
        }
        self.reap(host, &mut on_event);
        res.map(|_| self.last)
    }

    fn admit<H: SeqHost>(&mut self, host: &mut H, on_event: &mut impl FnMut(&mut T, SchedEvent)) {
        while let Some(job) = self.waiting.front() {
            if self.running() + job.len() > self.cfg.parallel && self.running() > 0 {
                break;
            }
            let job = self.waiting.pop_front().expect("front exists");
            let n_ctx = host.context_len();
            let mut seqs: Vec<(SeqId, Vec<u32>)> = Vec::new();
            for (mut tag, req) in job {
                on_event(&mut tag, SchedEvent::Admitted);
                let seq = host.seq_create();
                let mut gen = match SeqGen::new::<std::io::Error>(seq, &req, n_ctx) {
                    Ok(g) => g,
                    Err(e) => {
                        host.seq_release(seq);
                        on_event(
                            &mut tag,
                            SchedEvent::Failed {
                                message: e.to_string(),
                                failure: None,
                            },
                        );
                        continue;
                    }
                };
                let leader = seqs.iter().find(|(_, p)| *p == req.prompt).map(|(s, _)| *s);
                seqs.push((seq, req.prompt));
                match leader {
                    Some(leader) => self.parked.push(Parked { tag, gen, leader }),
                    None => {
                        let cached = self.share_prefix(host, &mut gen);
                        self.begin(tag, gen, cached, on_event);
                    }
                }
            }
        }
    }

    /// A submitted choice joins the running batch.
    fn begin(
        &mut self,
        mut tag: T,
        gen: SeqGen,
        cached: usize,
        on_event: &mut impl FnMut(&mut T, SchedEvent),
    ) {
        on_event(
            &mut tag,
            SchedEvent::Started {
                seq: gen.seq,
                prompt: gen.prompt(),
                cached,
            },
        );
        self.batch.push(
            Slot {
                tag,
                cached,
                on_finish: OnFinish::Cache,
            },
            gen,
        );
    }

    /// Shares the longest cached or running prefix of the sequence's prompt into it;
    /// returns the prompt tokens it no longer has to compute.
    fn share_prefix<H: SeqHost>(&mut self, host: &mut H, gen: &mut SeqGen) -> usize {
        let prompt = gen.prompt();
        let mut best = self.cache.best(prompt);
        for (_, g) in self.batch.iter() {
            let n = common_prefix(g.kv_tokens(), prompt);
            if n > best.map_or(0, |b| b.1) {
                best = Some((g.seq, n));
            }
        }
        let Some((src, n)) = best else { return 0 };
        let take = n.min(prompt.len() - 1).min(host.shareable_prefix(src));
        if take == 0 || !host.seq_share_prefix(gen.seq, src, take) {
            return 0;
        }
        gen.skip_cached(take)
    }

    /// Starts parked choices whose leader has read the prompt (or is gone).
    fn unpark<H: SeqHost>(&mut self, host: &mut H, on_event: &mut impl FnMut(&mut T, SchedEvent)) {
        let mut i = 0;
        while i < self.parked.len() {
            let leader = self.parked[i].leader;
            let ready = match self.batch.iter().find(|(_, g)| g.seq == leader) {
                Some((_, g)) => g.prompt_fed() + 1 >= g.prompt().len(),
                None => true,
            };
            if ready {
                let mut p = self.parked.remove(i);
                let cached = self.share_prefix(host, &mut p.gen);
                self.begin(p.tag, p.gen, cached, on_event);
            } else {
                i += 1;
            }
        }
    }

    /// Makes sure the next step finds KV cells: evicts cached prefixes, caps prompt
    /// reading, and ends sequences that cannot grow.
    fn make_room<H: SeqHost>(
        &mut self,
        host: &mut H,
        on_event: &mut impl FnMut(&mut T, SchedEvent),
    ) {
        let want_prompt = self.batch.prompt_backlog().min(self.cfg.chunk);
        loop {
            let decodes = self.batch.decode_rows(host.context_len());
            let free = host.free_cells();
            if free >= decodes + want_prompt {
                self.batch.cap_next_prompt(free - decodes);
                return;
            }
            if let Some(seq) = self.cache.evict_lru() {
                host.seq_release(seq);
                continue;
            }
            if free >= decodes && (decodes > 0 || free > 0) {
                // Decodes fit; prompts read what is left (maybe nothing this step).
                self.batch.cap_next_prompt(free - decodes);
                return;
            }
            // Nothing to evict and a sequence cannot get a cell: end the one holding the
            // most positions (it is the context that is full).
            let victim = self
                .batch
                .iter()
                .filter(|(_, g)| !g.is_done())
                .max_by_key(|(_, g)| g.kv_tokens().len())
                .map(|(_, g)| g.seq);
            let Some(victim) = victim else { return };
            self.finish_running(|g| g.seq == victim, FinishReason::Context, on_event);
            self.reap(host, on_event);
        }
    }

    /// Takes out finished and failed sequences: tells their callers, caches or frees the
    /// cells of submitted ones.
    fn reap<H: SeqHost>(&mut self, host: &mut H, on_event: &mut impl FnMut(&mut T, SchedEvent)) {
        for (mut slot, g) in self.batch.take_where(|_, g| g.is_done()) {
            let own = slot.on_finish == OnFinish::Cache;
            if let Some(f) = g.failure() {
                on_event(
                    &mut slot.tag,
                    SchedEvent::Failed {
                        message: f.to_string(),
                        failure: Some(f),
                    },
                );
                if own {
                    host.seq_release(g.seq);
                }
                continue;
            }
            on_event(
                &mut slot.tag,
                SchedEvent::Done {
                    gen: &g,
                    cached: slot.cached,
                },
            );
            if own {
                for seq in self.cache.insert(g.seq, g.kv_tokens().to_vec()) {
                    host.seq_release(seq);
                }
            }
        }
    }
}
