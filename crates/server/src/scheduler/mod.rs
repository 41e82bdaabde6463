//! The engine loop: one thread owns the engine and advances every running sequence in each
//! forward (continuous batching), reading long prompts in chunks between decode steps.
//!
//! Handlers send [`Job`]s (one per request, a choice per sequence) over a channel and get
//! [`JobEvent`]s back on the job's own channel. Each loop turn:
//! 1. takes new jobs and drops those whose client went away (their cells are freed at once);
//! 2. admits queued jobs while fewer than `parallel` sequences run: each choice gets a
//!    sequence that shares, in place, the longest prefix of its prompt held by a cached or
//!    running sequence ([`prefix`]); a choice whose prompt equals an earlier choice's of the
//!    same job waits until that one has read it, then shares it (`n > 1`);
//! 3. makes room in the arena (least recently used cached prefixes go first; prompt reading
//!    is capped to what is left; a sequence that cannot grow ends with `length`);
//! 4. runs one [`Batcher::step`]; a failed forward fails with a 500 the request its error
//!    names (or, when it names none, those that fail again alone) and reruns the others,
//!    forgets the prefix cache and carries on; NaN logits fail their request the same way;
//! 5. finished sequences become cached prefixes, and the metrics are updated.

pub mod faults;
pub mod prefix;

use crate::metrics::{Finish, Metrics};
pub use faults::{Faults, MarkedFault};
use faults::{Model, PendingFaults};
use minfer_engine::{Engine, SeqId};
use minfer_generate::chat::Pieces;
use minfer_generate::{Batcher, Event, FinishReason, GenerateRequest, SeqGen, TokenLogprob};
use minfer_tokenizer::Tokenizer;
use prefix::{common_prefix, PrefixCache};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

/// Most segments of shared cells a new sequence takes from its source (see [`shareable`]).
const SHARED_SEGMENTS: usize = minfer_engine::KV_MAP_RUNS - 2;

/// How many leading positions of `src` a new sequence may share.
///
/// A forward maps each sequence's window as at most `KV_MAP_RUNS` runs of cells, and
/// defrag can lay a sequence out in one run per *segment*: a stretch of positions whose
/// cells have the same owners. Along a sequence's positions the owner sets only shrink
/// (a prefix is shared by everyone sharing a longer one), so a segment ends exactly where
/// the owner count changes. Sharing at most `SHARED_SEGMENTS` segments leaves the rest of
/// the map for the sequence's own cells. Superseded cached prefixes are released, so a
/// conversation that grows turn by turn keeps merging back into few segments.
fn shareable(cells: &minfer_engine::KvCells, src: SeqId) -> usize {
    let Ok(runs) = cells.runs(src) else { return 0 };
    let mut segments = 0;
    let mut last = None;
    for r in runs {
        for (k, cell) in r.cells().enumerate() {
            let owners = cells.owner_count(cell);
            if last != Some(owners) {
                segments += 1;
                if segments > SHARED_SEGMENTS {
                    return r.pos + k;
                }
                last = Some(owners);
            }
        }
    }
    usize::MAX
}

/// The failure message of a request the server had queued, not started, when shutdown
/// ended what was left (answered with a 503).
pub const SHUTDOWN_MESSAGE: &str = "the server shut down before this request was started";

/// One request: its choices, each run as its own sequence.
pub struct Job {
    pub choices: Vec<GenerateRequest>,
    pub events: UnboundedSender<JobEvent>,
    pub received: Instant,
}

#[derive(Debug)]
pub enum JobEvent {
    /// A token of choice `choice`, with the text that became final with it.
    Token {
        choice: usize,
        id: u32,
        text: Vec<u8>,
        logprob: Option<TokenLogprob>,
    },
    /// Held text released without a new token (a sequence ended by the loop).
    Text { choice: usize, text: Vec<u8> },
    Done {
        choice: usize,
        finish: FinishReason,
        prompt_tokens: usize,
        completion_tokens: usize,
        /// Prompt tokens shared from cached cells instead of computed.
        cached_tokens: usize,
    },
    /// The choice failed (a forward or its sampler); the message says why.
    Failed { choice: usize, message: String },
}

/// Settings of the loop.
#[derive(Clone, Debug)]
pub struct LoopConfig {
    /// Most sequences running at once.
    pub parallel: usize,
    /// Most prompt tokens one forward reads.
    pub chunk: usize,
    /// Most finished sequences kept as cached prefixes.
    pub cache_entries: usize,
}

/// Counters the tests read to check that requests really shared forwards.
#[derive(Default, Debug)]
pub struct LoopStats {
    pub forwards: AtomicUsize,
    /// Most sequences running during one forward.
    pub max_running: AtomicUsize,
    /// Forwards that read prompt tokens while other sequences decoded (chunked prefill).
    pub mixed: AtomicUsize,
    /// Most prompt tokens one forward read.
    pub max_prompt_tokens: AtomicUsize,
    /// Sequences running when the last marked fault was armed (the forward it strikes).
    pub batch_at_fault: AtomicUsize,
    /// Sequences the engine holds (running, cached prefixes, its default one), as of the
    /// last turn: a sequence nothing answers for any more is a leak.
    pub engine_sequences: AtomicUsize,
}

/// Where a sequence's events go.
struct Tag {
    job: Arc<JobSink>,
    choice: usize,
    cached: usize,
    first_token: Option<Instant>,
}

/// A job's channel, shared by its choices.
struct JobSink {
    events: UnboundedSender<JobEvent>,
    received: Instant,
}

impl JobSink {
    fn send(&self, e: JobEvent) {
        // A closed channel is a client that went away: the next turn drops its sequences.
        let _ = self.events.send(e);
    }
    fn gone(&self) -> bool {
        self.events.is_closed()
    }
}

/// A choice waiting for an earlier choice of its job (same prompt) to read the prompt.
struct Parked {
    tag: Tag,
    gen: SeqGen,
    leader: SeqId,
}

/// What the loop shares with the handlers.
pub struct LoopShared {
    pub metrics: Arc<Metrics>,
    pub faults: Arc<Faults>,
    pub stats: Arc<LoopStats>,
    /// Jobs accepted by handlers and not yet admitted (the queue's length).
    pub queued: Arc<AtomicUsize>,
    /// Set by shutdown when the drain is over: every running sequence ends now (its
    /// partial reply with finish_reason `length`), every waiting job fails with
    /// [`SHUTDOWN_MESSAGE`].
    pub abort: Arc<AtomicBool>,
}

pub struct EngineLoop {
    engine: Engine,
    tok: Arc<Tokenizer>,
    cfg: LoopConfig,
    metrics: Arc<Metrics>,
    faults: Arc<Faults>,
    stats: Arc<LoopStats>,
    queued: Arc<AtomicUsize>,
    abort: Arc<AtomicBool>,
    waiting: VecDeque<Job>,
    batch: Batcher<Tag>,
    parked: Vec<Parked>,
    cache: PrefixCache,
    pending_faults: PendingFaults,
}

impl EngineLoop {
    pub fn new(engine: Engine, tok: Arc<Tokenizer>, cfg: LoopConfig, shared: LoopShared) -> Self {
        let LoopShared {
            metrics,
            faults,
            stats,
            queued,
            abort,
        } = shared;
        EngineLoop {
            engine,
            tok,
            batch: Batcher::new(cfg.chunk),
            cache: PrefixCache::new(cfg.cache_entries),
            cfg,
            metrics,
            faults,
            stats,
            queued,
            abort,
            waiting: VecDeque::new(),
            parked: Vec::new(),
            pending_faults: PendingFaults::default(),
        }
    }

    /// Runs until every job sender is gone.
    pub fn run(mut self, jobs: mpsc::Receiver<Job>) {
        loop {
            if self.batch.is_empty() && self.parked.is_empty() && self.waiting.is_empty() {
                self.publish();
                match jobs.recv() {
                    Ok(j) => self.waiting.push_back(j),
                    Err(_) => return,
                }
            }
            while let Ok(j) = jobs.try_recv() {
                self.waiting.push_back(j);
            }
            if self.abort.load(Ordering::SeqCst) {
                self.end_all();
            }
            self.drop_gone();
            self.admit();
            self.unpark();
            self.make_room();
            self.step();
            self.reap();
            self.publish();
        }
    }

    /// Shutdown's end of everything left: running sequences finish now with what they
    /// have (`length`), parked and waiting ones fail with [`SHUTDOWN_MESSAGE`].
    fn end_all(&mut self) {
        for job in self.waiting.drain(..) {
            self.queued.fetch_sub(1, Ordering::Relaxed);
            self.metrics.request_finished(Finish::Cancelled);
            for choice in 0..job.choices.len() {
                let _ = job.events.send(JobEvent::Failed {
                    choice,
                    message: SHUTDOWN_MESSAGE.into(),
                });
            }
        }
        for p in std::mem::take(&mut self.parked) {
            p.tag.job.send(JobEvent::Failed {
                choice: p.tag.choice,
                message: SHUTDOWN_MESSAGE.into(),
            });
            self.release(p.gen.seq);
        }
        for (t, g) in self.batch.iter_mut() {
            if g.is_done() {
                continue;
            }
            let text = g.finish_now(FinishReason::Length);
            if !text.is_empty() {
                t.job.send(JobEvent::Text {
                    choice: t.choice,
                    text,
                });
            }
        }
        self.reap();
    }

    fn running(&self) -> usize {
        self.batch.len() + self.parked.len()
    }

    /// Frees the sequences of clients that went away.
    fn drop_gone(&mut self) {
        let before = self.waiting.len();
        self.waiting.retain(|j| !j.events.is_closed());
        let dropped = before - self.waiting.len();
        if dropped > 0 {
            self.queued.fetch_sub(dropped, Ordering::Relaxed);
            for _ in 0..dropped {
                self.metrics.request_finished(Finish::Cancelled);
            }
        }
        let mut gone_jobs = 0;
        let gone = self.batch.take_where(|t, _| t.job.gone());
        let mut parked_gone = Vec::new();
        self.parked.retain_mut(|p| {
            if p.tag.job.gone() {
                parked_gone.push(p.gen.seq);
                false
            } else {
                true
            }
        });
        for (t, g) in &gone {
            if t.choice == 0 {
                gone_jobs += 1;
            }
            self.release(g.seq);
        }
        for s in parked_gone {
            self.release(s);
        }
        for _ in 0..gone_jobs {
            self.metrics.request_finished(Finish::Cancelled);
        }
    }

    fn release(&mut self, seq: SeqId) {
        // Only sequences this loop created are released; failure would be a bug, not input.
        let _ = self.engine.seq_release(seq);
    }

    fn admit(&mut self) {
        while let Some(job) = self.waiting.front() {
            if self.running() + job.choices.len() > self.cfg.parallel && self.running() > 0 {
                break;
            }
            let job = self.waiting.pop_front().expect("front exists");
            self.queued.fetch_sub(1, Ordering::Relaxed);
            let sink = Arc::new(JobSink {
                events: job.events,
                received: job.received,
            });
            let n_ctx = self.engine.n_ctx();
            let mut seqs: Vec<(SeqId, &[u32])> = Vec::new();
            for (choice, req) in job.choices.iter().enumerate() {
                let seq = self.engine.seq_create();
                let mut gen = match SeqGen::new::<std::io::Error>(seq, req, n_ctx) {
                    Ok(g) => g,
                    Err(e) => {
                        self.release(seq);
                        sink.send(JobEvent::Failed {
                            choice,
                            message: e.to_string(),
                        });
                        continue;
                    }
                };
                self.metrics.add_prompt_tokens(req.prompt.len());
                self.pending_faults
                    .admit(&self.faults, &self.tok, seq, &req.prompt);
                let tag = Tag {
                    job: sink.clone(),
                    choice,
                    cached: 0,
                    first_token: None,
                };
                let leader = seqs
                    .iter()
                    .find(|(_, p)| *p == req.prompt.as_slice())
                    .map(|(s, _)| *s);
                seqs.push((seq, &req.prompt));
                match leader {
                    Some(leader) => self.parked.push(Parked { tag, gen, leader }),
                    None => {
                        let mut tag = tag;
                        tag.cached = self.share_prefix(&mut gen);
                        self.batch.push(tag, gen);
                    }
                }
            }
        }
    }

    /// Shares the longest cached or running prefix of the sequence's prompt into it;
    /// returns the prompt tokens it no longer has to compute.
    fn share_prefix(&mut self, gen: &mut SeqGen) -> usize {
        let prompt = gen.prompt();
        let mut best = self.cache.best(prompt);
        for (_, g) in self.batch.iter() {
            let n = common_prefix(g.kv_tokens(), prompt);
            if n > best.map_or(0, |b| b.1) {
                best = Some((g.seq, n));
            }
        }
        let mut take = best.map_or(0, |(_, n)| n.min(prompt.len() - 1));
        if let Some((src, _)) = best {
            take = take.min(shareable(self.engine.cells(), src));
        }
        self.metrics.add_prefix_lookup(prompt.len(), take);
        if take == 0 {
            return 0;
        }
        let (src, _) = best.expect("take > 0");
        match self.engine.seq_share_prefix(gen.seq, src, take) {
            Ok(()) => gen.skip_cached(take),
            Err(_) => 0,
        }
    }

    /// Starts parked choices whose leader has read the prompt (or is gone).
    fn unpark(&mut self) {
        let mut i = 0;
        while i < self.parked.len() {
            let leader = self.parked[i].leader;
            let ready = match self.batch.iter().find(|(_, g)| g.seq == leader) {
                Some((_, g)) => g.prompt_fed() + 1 >= g.prompt().len(),
                None => true,
            };
            if ready {
                let mut p = self.parked.remove(i);
                p.tag.cached = self.share_prefix(&mut p.gen);
                self.batch.push(p.tag, p.gen);
            } else {
                i += 1;
            }
        }
    }

    /// Makes sure the next step finds KV cells: evicts cached prefixes, caps prompt
    /// reading, and ends sequences that cannot grow.
    fn make_room(&mut self) {
        let want_prompt = self.batch.prompt_backlog().min(self.cfg.chunk);
        loop {
            let decodes = self.batch.decode_rows();
            let free = self.engine.kv_budget().free;
            if free >= decodes + want_prompt {
                self.batch.cap_next_prompt(free - decodes);
                return;
            }
            if let Some(seq) = self.cache.evict_lru() {
                self.release(seq);
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
            for (t, g) in self.batch.iter_mut() {
                if g.seq == victim {
                    let text = g.finish_now(FinishReason::Context);
                    if !text.is_empty() {
                        t.job.send(JobEvent::Text {
                            choice: t.choice,
                            text,
                        });
                    }
                }
            }
            self.reap();
        }
    }

    fn step(&mut self) {
        if self.batch.is_empty() {
            return;
        }
        let (batch, parked) = (&self.batch, &self.parked);
        let sampled = |seq| match batch.iter().find(|(_, g)| g.seq == seq) {
            Some((_, g)) => Some(g.out.tokens.len()),
            None => parked.iter().any(|p| p.gen.seq == seq).then_some(0),
        };
        if self.pending_faults.arm_due(&mut self.engine, sampled) {
            self.stats
                .batch_at_fault
                .store(self.batch.len(), Ordering::Relaxed);
        }
        self.stats.forwards.fetch_add(1, Ordering::Relaxed);
        self.stats
            .max_running
            .fetch_max(self.batch.len(), Ordering::Relaxed);
        let pieces = Pieces(&self.tok);
        let metrics = &self.metrics;
        let mut model = Model {
            engine: &mut self.engine,
            faults: &self.faults,
        };
        let res = self.batch.step(&mut model, &pieces, |tag, _g, ev| {
            if let Event::Token { id, text, logprob } = ev {
                let now = Instant::now();
                if tag.first_token.is_none() {
                    tag.first_token = Some(now);
                    metrics.observe_ttft((now - tag.job.received).as_secs_f64());
                }
                tag.job.send(JobEvent::Token {
                    choice: tag.choice,
                    id,
                    text: text.to_vec(),
                    logprob: logprob.cloned(),
                });
            }
        });
        let (decodes, prompt) = self.batch.last_step();
        if decodes > 0 && prompt > 0 {
            self.stats.mixed.fetch_add(1, Ordering::Relaxed);
        }
        self.stats
            .max_prompt_tokens
            .fetch_max(prompt, Ordering::Relaxed);
        if res.is_err() {
            // The batcher marked the sequences that failed (the one an error named, or those
            // that failed alone: `Batcher::step`); `reap` answers them and frees their cells.
            metrics.forward_failed();
            // The cells of cached prefixes are not trusted after a failed forward.
            for seq in self.cache.clear() {
                let _ = self.engine.seq_release(seq);
            }
        }
    }

    /// Takes out finished and failed sequences: answers their jobs, caches or frees cells.
    fn reap(&mut self) {
        let done = self.batch.take_where(|_, g| g.is_done());
        for (tag, g) in done {
            if let Some(f) = g.failure() {
                tag.job.send(JobEvent::Failed {
                    choice: tag.choice,
                    message: f.to_string(),
                });
                self.release(g.seq);
                continue;
            }
            let n = g.out.tokens.len();
            self.metrics.add_completion_tokens(n);
            if let Some(first) = tag.first_token {
                if n > 1 {
                    let per = first.elapsed().as_secs_f64() / (n - 1) as f64;
                    self.metrics.observe_tpot(per);
                }
            }
            tag.job.send(JobEvent::Done {
                choice: tag.choice,
                finish: g.out.finish,
                prompt_tokens: g.prompt().len(),
                completion_tokens: n,
                cached_tokens: tag.cached,
            });
            let tokens = g.kv_tokens().to_vec();
            for seq in self.cache.insert(g.seq, tokens) {
                self.release(seq);
            }
        }
    }

    fn publish(&self) {
        let m = &self.metrics;
        let cells = self.engine.cells();
        self.stats
            .engine_sequences
            .store(cells.n_seqs(), Ordering::SeqCst);
        let free = cells.n_free();
        m.set_kv(cells.n_cells() - free, cells.n_shared(), free);
        m.set_running(self.running());
        m.set_queued(self.queued.load(Ordering::Relaxed));
        m.set_prefix_cache_entries(self.cache.len());
        m.set_defrags(self.engine.defrags());
    }
}
