//! The engine loop: one thread owns the engine and drives the scheduler
//! ([`minfer_generate::sched`]: admission, the prefix cache, the KV budget, chunked prefill,
//! continuous batching, reruns after a failed forward) one step per turn.
//!
//! Handlers send [`Job`]s (one per request, a choice per sequence) over a channel and get
//! [`JobEvent`]s back on the job's own channel. Each loop turn takes new jobs, drops those
//! whose client went away (their cells are freed at once), arms the faults tests inject, runs
//! one scheduler step and publishes the metrics. What stays here is the server's: channels,
//! metrics, the shutdown's end of everything, and the test faults.

pub mod faults;

use crate::metrics::{Finish, Metrics, Turn};
pub use faults::{Faults, MarkedFault};
use faults::{Model, PendingFaults};
use minfer_engine::Engine;
use minfer_generate::chat::Pieces;
use minfer_generate::draft::DraftHandle;
use minfer_generate::lookup::SpecStats;
use minfer_generate::sched::{SchedConfig, SchedEvent, Scheduler, Stage};
use minfer_generate::{FinishReason, GenerateRequest, TokenLogprob};
use minfer_tokenizer::Tokenizer;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

/// The failure message of a request the server had queued, not started, when shutdown
/// ended what was left (answered with a 503).
pub const SHUTDOWN_MESSAGE: &str = "the server shut down before this request was started";

/// How the failure message of a reply the KV cache ran out of cells for begins (answered
/// with a 503 and Retry-After, or an error event ending the stream).
pub const KV_FULL: &str = "the KV cache ran out of cells";

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
        /// What speculation did (prompt lookup or the draft model), when the choice drafted.
        speculative: Option<SpecStats>,
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
    /// Sequences the server's draft model holds (one per running sequence that drafted),
    /// as of the last turn: one left after its request ended is a leak of its KV cells.
    pub draft_sequences: AtomicUsize,
    /// Forwards the server's draft model ran, as of the last turn.
    pub draft_forwards: AtomicUsize,
}

/// Where a sequence's events go.
struct Tag {
    job: Arc<JobSink>,
    choice: usize,
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
    /// The server's draft model, when it has one (its counts are published each turn).
    pub draft: Option<DraftHandle>,
}

pub struct EngineLoop {
    engine: Engine,
    tok: Arc<Tokenizer>,
    metrics: Arc<Metrics>,
    faults: Arc<Faults>,
    stats: Arc<LoopStats>,
    queued: Arc<AtomicUsize>,
    abort: Arc<AtomicBool>,
    sched: Scheduler<Tag>,
    pending_faults: PendingFaults,
    draft: Option<DraftHandle>,
}

/// The server's side of a scheduler event: the job's channel, the metrics, the faults.
fn on_event(
    metrics: &Metrics,
    queued: &AtomicUsize,
    pending: &mut PendingFaults,
    faults: &Faults,
    tok: &Tokenizer,
    tag: &mut Tag,
    ev: SchedEvent,
) {
    let choice = tag.choice;
    match ev {
        SchedEvent::Admitted => {
            if choice == 0 {
                queued.fetch_sub(1, Ordering::Relaxed);
            }
        }
        SchedEvent::Started {
            seq,
            prompt,
            cached,
        } => {
            metrics.add_prompt_tokens(prompt.len());
            metrics.add_prefix_lookup(prompt.len(), cached);
            pending.admit(faults, tok, seq, prompt);
        }
        SchedEvent::Token { id, text, logprob } => {
            let now = Instant::now();
            if tag.first_token.is_none() {
                tag.first_token = Some(now);
                metrics.observe_ttft((now - tag.job.received).as_secs_f64());
            }
            tag.job.send(JobEvent::Token {
                choice,
                id,
                text: text.to_vec(),
                logprob: logprob.cloned(),
            });
        }
        SchedEvent::Text(text) => tag.job.send(JobEvent::Text {
            choice,
            text: text.to_vec(),
        }),
        SchedEvent::Done { gen, cached } => {
            let n = gen.out.tokens.len();
            metrics.add_completion_tokens(n);
            if let Some(first) = tag.first_token {
                if n > 1 {
                    let per = first.elapsed().as_secs_f64() / (n - 1) as f64;
                    metrics.observe_tpot(per);
                }
            }
            // A request's prompt and max_tokens fit one sequence's context (prompt::check_fit)
            // and a reply without max_tokens stops at it, so a sequence the scheduler ends
            // for want of cells lost them to the others: an error, not a `length` finish.
            if gen.out.finish == FinishReason::Context {
                let message = format!(
                    "{KV_FULL} while this reply was generated (the sequences running together \
                     hold every cell): it was stopped after {n} tokens of a {}-token prompt; \
                     retry, or start the server with more KV (-c, --kv-mem) or a smaller \
                     --parallel",
                    gen.prompt().len()
                );
                tag.job.send(JobEvent::Failed { choice, message });
                return;
            }
            tag.job.send(JobEvent::Done {
                choice,
                finish: gen.out.finish,
                prompt_tokens: gen.prompt().len(),
                completion_tokens: n,
                cached_tokens: cached,
                speculative: gen.out.speculative,
            });
        }
        SchedEvent::Failed { message, .. } => tag.job.send(JobEvent::Failed { choice, message }),
    }
}

impl EngineLoop {
    pub fn new(engine: Engine, tok: Arc<Tokenizer>, cfg: LoopConfig, shared: LoopShared) -> Self {
        let LoopShared {
            metrics,
            faults,
            stats,
            queued,
            abort,
            draft,
        } = shared;
        EngineLoop {
            engine,
            tok,
            sched: Scheduler::new(SchedConfig {
                parallel: cfg.parallel,
                chunk: cfg.chunk,
                cache_entries: cfg.cache_entries,
            }),
            metrics,
            faults,
            stats,
            queued,
            abort,
            pending_faults: PendingFaults::default(),
            draft,
        }
    }

    /// Runs until every job sender is gone.
    pub fn run(mut self, jobs: mpsc::Receiver<Job>) {
        loop {
            if self.sched.is_idle() {
                self.publish();
                match jobs.recv() {
                    Ok(j) => self.submit(j),
                    Err(_) => return,
                }
            }
            let turn = Instant::now();
            while let Ok(j) = jobs.try_recv() {
                self.submit(j);
            }
            if self.abort.load(Ordering::SeqCst) {
                self.end_all();
            }
            self.drop_gone();
            let in_forward = self.step();
            self.publish();
            if let Some(forward) = in_forward {
                let r = self.sched.last_step();
                self.metrics.profile.turn(&Turn {
                    generation_rows: r.decodes,
                    prompt_rows: r.prompt_tokens,
                    forward,
                    turn: turn.elapsed(),
                });
            }
        }
    }

    fn submit(&mut self, job: Job) {
        let sink = Arc::new(JobSink {
            events: job.events,
            received: job.received,
        });
        let choices = job
            .choices
            .into_iter()
            .enumerate()
            .map(|(choice, req)| {
                let tag = Tag {
                    job: sink.clone(),
                    choice,
                    first_token: None,
                };
                (tag, req)
            })
            .collect();
        self.sched.submit(choices);
    }

    /// Shutdown's end of everything left: running sequences finish now with what they
    /// have (`length`), parked and waiting ones fail with [`SHUTDOWN_MESSAGE`].
    fn end_all(&mut self) {
        let (metrics, queued, tok, faults) = (&self.metrics, &self.queued, &self.tok, &self.faults);
        let pending = &mut self.pending_faults;
        let jobs = self.sched.finish_all(
            &mut self.engine,
            FinishReason::Length,
            SHUTDOWN_MESSAGE,
            |tag, ev| on_event(metrics, queued, pending, faults, tok, tag, ev),
        );
        self.queued.fetch_sub(jobs, Ordering::Relaxed);
        for _ in 0..jobs {
            self.metrics.request_finished(Finish::Cancelled);
        }
    }

    /// Frees the sequences of clients that went away.
    fn drop_gone(&mut self) {
        let gone = self.sched.cancel_where(&mut self.engine, |t| t.job.gone());
        for (tag, stage) in gone {
            // One count per request: its first choice (a parked choice is never the first).
            if tag.choice != 0 {
                continue;
            }
            if stage == Stage::Waiting {
                self.queued.fetch_sub(1, Ordering::Relaxed);
            }
            self.metrics.request_finished(Finish::Cancelled);
        }
    }

    /// One scheduler step; the time inside the engine's forwards when one ran.
    fn step(&mut self) -> Option<std::time::Duration> {
        let sched = &self.sched;
        if self
            .pending_faults
            .arm_due(&mut self.engine, |seq| sched.sampled(seq))
        {
            self.stats
                .batch_at_fault
                .store(self.sched.running(), Ordering::Relaxed);
        }
        let (metrics, queued, tok, faults) = (&self.metrics, &self.queued, &self.tok, &self.faults);
        let pending = &mut self.pending_faults;
        let mut model = Model {
            engine: &mut self.engine,
            faults,
            in_forward: std::time::Duration::ZERO,
        };
        let res = self.sched.step(&mut model, &Pieces(tok), |tag, ev| {
            on_event(metrics, queued, pending, faults, tok, tag, ev)
        });
        let in_forward = model.in_forward;
        let r = self.sched.last_step();
        if !r.forwarded {
            return None;
        }
        self.stats.forwards.fetch_add(1, Ordering::Relaxed);
        self.stats
            .max_running
            .fetch_max(r.running, Ordering::Relaxed);
        if r.decodes > 0 && r.prompt_tokens > 0 {
            self.stats.mixed.fetch_add(1, Ordering::Relaxed);
        }
        self.stats
            .max_prompt_tokens
            .fetch_max(r.prompt_tokens, Ordering::Relaxed);
        if res.is_err() {
            // The scheduler failed the sequences the forward broke and forgot its prefix
            // cache; their requests were answered.
            self.metrics.forward_failed();
        }
        Some(in_forward)
    }

    fn publish(&self) {
        let m = &self.metrics;
        let cells = self.engine.cells();
        self.stats
            .engine_sequences
            .store(cells.n_seqs(), Ordering::SeqCst);
        m.set_engine_sequences(cells.n_seqs());
        if let Some(d) = &self.draft {
            self.stats
                .draft_sequences
                .store(d.open_seqs(), Ordering::SeqCst);
            self.stats
                .draft_forwards
                .store(d.forwards(), Ordering::SeqCst);
        }
        let free = cells.n_free();
        m.set_kv(cells.n_cells() - free, cells.n_shared(), free);
        m.set_running(self.sched.running());
        m.set_queued(self.queued.load(Ordering::Relaxed));
        m.set_prefix_cache_entries(self.sched.cached_prefixes());
        m.set_defrags(self.engine.defrags());
        m.profile.set_engine_counts(
            self.engine.graph_builds(),
            minfer_engine::backends::cuda_graph_counts(),
        );
    }
}
