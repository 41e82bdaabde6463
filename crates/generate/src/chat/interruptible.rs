//! One generation that its caller can stop between forwards (Ctrl-C in `minfer run` and
//! `minfer chat`), keeping what was generated and its timings.
//!
//! It drives the [`Scheduler`] with one sequence, as [`crate::generate`] does, and reads
//! `cancel` before every forward; when set, the sequence is ended there
//! ([`Scheduler::finish_all`]: held text released, timings taken), so an interrupted reply
//! reports its real token rate instead of none.

use crate::sched::{Direct, SchedConfig, SchedEvent, Scheduler};
use crate::{
    Failure, FinishReason, GenerateError, GenerateOutput, GenerateRequest, LogitsModel, SeqGen,
    TokenBytes,
};
use minfer_engine::SeqId;
use std::sync::atomic::{AtomicBool, Ordering};

/// How an interruptible generation ended.
#[derive(Clone, Debug)]
pub struct Interruptible {
    /// What was generated; after an interruption `finish` reads `Length` and
    /// `interrupted` says why it really stopped.
    pub out: GenerateOutput,
    /// `cancel` stopped it before it finished by itself.
    pub interrupted: bool,
    /// The tokens whose KV the sequence gained, in position order from where it started:
    /// the prompt as far as it was read, then the generated tokens but the last one sampled.
    pub kv_tokens: Vec<u32>,
}

/// Runs `req` on the model's default sequence until it finishes or `cancel` is set (read
/// before each forward, so a prompt being prefilled in chunks stops between chunks).
pub fn generate_interruptible<M: LogitsModel>(
    model: &mut M,
    vocab: &dyn TokenBytes,
    req: &GenerateRequest,
    cancel: &AtomicBool,
    on_text: impl FnMut(&[u8]),
) -> Result<Interruptible, GenerateError<M::Error>> {
    generate_interruptible_with_progress(model, vocab, req, cancel, on_text, |_, _| {})
}

/// [`generate_interruptible`], calling `on_prefill(fed, total)` after each forward that fed
/// prompt tokens (`fed` of the prompt's `total`, the last call with `fed == total`), so a
/// long prompt's prefill can be shown.
pub fn generate_interruptible_with_progress<M: LogitsModel>(
    model: &mut M,
    vocab: &dyn TokenBytes,
    req: &GenerateRequest,
    cancel: &AtomicBool,
    on_text: impl FnMut(&[u8]),
    on_prefill: impl FnMut(usize, usize),
) -> Result<Interruptible, GenerateError<M::Error>> {
    let seq = model.default_seq();
    resume_interruptible(model, vocab, seq, 0, req, cancel, on_text, on_prefill)
}

/// [`generate_interruptible_with_progress`] on sequence `seq`, which already holds positions
/// `0..base` (a conversation's earlier turns): the prompt continues it from `base`.
#[allow(clippy::too_many_arguments)]
pub fn resume_interruptible<M: LogitsModel>(
    model: &mut M,
    vocab: &dyn TokenBytes,
    seq: SeqId,
    base: usize,
    req: &GenerateRequest,
    cancel: &AtomicBool,
    mut on_text: impl FnMut(&[u8]),
    mut on_prefill: impl FnMut(usize, usize),
) -> Result<Interruptible, GenerateError<M::Error>> {
    let n_ctx = model.context_len();
    let mut sched = Scheduler::new(SchedConfig::direct(model.max_batch()));
    sched.start((), SeqGen::resume(seq, base, req, n_ctx)?);
    let mut host = Direct(model);
    let mut out: Option<(GenerateOutput, Vec<u32>)> = None;
    let mut cancelled = false;
    let mut fed_before = 0;
    while !sched.is_idle() {
        let stop = cancel.load(Ordering::SeqCst);
        let mut failed = None;
        {
            let mut on_event = |_: &mut (), ev: SchedEvent| match ev {
                SchedEvent::Token { text, .. } | SchedEvent::Text(text) if !text.is_empty() => {
                    on_text(text)
                }
                SchedEvent::Done { gen, .. } => {
                    out = Some((gen.out.clone(), gen.kv_tokens().to_vec()))
                }
                SchedEvent::Failed {
                    failure: Some(Failure::Sampler(e)),
                    ..
                } => {
                    failed.get_or_insert(e.clone());
                }
                _ => {}
            };
            if stop {
                cancelled = true;
                sched.finish_all(&mut host, FinishReason::Length, "", &mut on_event);
            } else {
                sched
                    .step(&mut host, vocab, &mut on_event)
                    .map_err(|f| f.error)?;
                if !sched.last_step().forwarded && !sched.is_idle() {
                    // Nothing had work yet the sequence is not done: end it rather than loop.
                    sched.finish_all(&mut host, FinishReason::Length, "", &mut on_event);
                }
            }
        }
        if let Some(e) = failed {
            return Err(GenerateError::Sampler(e));
        }
        if stop {
            break;
        }
        let (fed, total) = match sched.iter().next() {
            Some((_, g)) => (g.prompt_fed(), g.prompt().len()),
            // The step that read the prompt's last chunk also ended the sequence.
            None => (req.prompt.len(), req.prompt.len()),
        };
        if fed > fed_before && fed_before < total {
            fed_before = fed.min(total);
            on_prefill(fed_before, total);
        }
    }
    let (out, kv_tokens) = out.expect("the one sequence ends with Done or an error");
    Ok(Interruptible {
        out,
        interrupted: cancelled,
        kv_tokens,
    })
}
