//! Handing a validated request to the engine loop: the bounded queue, the in-flight count
//! that shutdown waits for, and the per-choice requests (`n` choices, each its own seed).

use crate::engine_loop::{Job, JobEvent};
use crate::error::ApiError;
use crate::metrics::Reject;
use crate::request::{speculative, GenParams};
use crate::AppState;
use minfer_generate::GenerateRequest;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

/// Counts a request as in flight until dropped (the response is complete or abandoned).
pub struct InFlight(Arc<AppState>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

pub struct Submitted {
    pub events: UnboundedReceiver<JobEvent>,
    pub guard: InFlight,
}

/// The engine requests of one prompt's `n` choices. Choice `i` samples with `seed + i`, so
/// sampled choices differ while each stays reproducible. A `speculative` the request asks
/// for and cannot have (request::speculative) is refused here, before the queue.
pub fn choices(
    state: &AppState,
    prompt: &[u32],
    gen: &GenParams,
    grammar: Option<&minfer_generate::constrain::Grammar>,
) -> Result<Vec<GenerateRequest>, ApiError> {
    let server = match (&state.cfg.draft, state.cfg.lookup) {
        (Some(h), _) => speculative::ServerDrafter::Model(h.clone()),
        (None, Some(l)) => speculative::ServerDrafter::Lookup(l),
        (None, None) => speculative::ServerDrafter::None,
    };
    let drafter = speculative::resolve(gen.speculative, &server, &gen.sampler)?;
    crate::prompt::check_fit(state, prompt.len(), gen.max_tokens)?;
    // Without `max_tokens`: until the sequence's context is full.
    let max_tokens = gen
        .max_tokens
        .unwrap_or(state.limits.n_ctx.saturating_sub(prompt.len()));
    Ok((0..gen.n)
        .map(|i| {
            let mut sampler = gen.sampler.clone();
            sampler.seed = sampler.seed.wrapping_add(i as u64);
            GenerateRequest {
                prompt: prompt.to_vec(),
                max_tokens,
                sampler,
                stop_strings: gen.stop.clone(),
                eog: state.eog.clone(),
                logprobs: gen.logprobs,
                constraint: grammar.cloned(),
                lookup: drafter.lookup(),
                draft: drafter.model(),
            }
        })
        .collect())
}

/// Queues a job, or refuses it when the queue is full or the server is draining.
pub fn submit(state: &Arc<AppState>, choices: Vec<GenerateRequest>) -> Result<Submitted, ApiError> {
    if state.draining.load(Ordering::SeqCst) {
        state.metrics.request_rejected(Reject::Draining);
        return Err(ApiError::draining());
    }
    let cap = state.cfg.queue;
    if state.queued.fetch_add(1, Ordering::SeqCst) >= cap {
        state.queued.fetch_sub(1, Ordering::SeqCst);
        state.metrics.request_rejected(Reject::QueueFull);
        return Err(ApiError::queue_full(cap));
    }
    state.in_flight.fetch_add(1, Ordering::SeqCst);
    let guard = InFlight(state.clone());
    let (tx, rx) = unbounded_channel();
    let job = Job {
        choices,
        events: tx,
        received: Instant::now(),
    };
    let sent = state
        .jobs
        .lock()
        .map_err(|_| ApiError::server("the engine loop is gone"))?
        .send(job);
    if sent.is_err() {
        state.queued.fetch_sub(1, Ordering::SeqCst);
        return Err(ApiError::server("the engine loop is gone"));
    }
    Ok(Submitted { events: rx, guard })
}
