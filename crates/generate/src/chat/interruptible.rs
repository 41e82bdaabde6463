//! One generation that its caller can stop between forwards (Ctrl-C in `minfer run` and
//! `minfer chat`), keeping what was generated and its timings.
//!
//! It drives the steppable [`Batcher`] with one sequence, as [`crate::generate`]
//! does, and reads `cancel` before every forward; when set, the sequence is ended there
//! ([`SeqGen::finish_now`]: held text released, timings taken), so an interrupted reply
//! reports its real token rate instead of none.

use crate::{
    Batcher, Event, Failure, FinishReason, GenerateError, GenerateOutput, GenerateRequest,
    LogitsModel, SeqGen, TokenBytes,
};
use std::sync::atomic::{AtomicBool, Ordering};

/// How an interruptible generation ended.
#[derive(Clone, Debug)]
pub struct Interruptible {
    /// What was generated; after an interruption `finish` reads `Length` and
    /// `interrupted` says why it really stopped.
    pub out: GenerateOutput,
    /// `cancel` stopped it before it finished by itself.
    pub interrupted: bool,
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
    mut on_text: impl FnMut(&[u8]),
    mut on_prefill: impl FnMut(usize, usize),
) -> Result<Interruptible, GenerateError<M::Error>> {
    let n_ctx = model.context_len();
    let mut batch = Batcher::new(model.max_batch());
    batch.push((), SeqGen::new(model.default_seq(), req, n_ctx)?);
    let mut cancelled = false;
    let mut fed_before = 0;
    loop {
        if cancel.load(Ordering::SeqCst) {
            cancelled = true;
            break;
        }
        let mut failed = None;
        let worked = batch
            .step(model, vocab, |_, g, ev| match ev {
                Event::Token { text, .. } if !text.is_empty() => on_text(text),
                Event::Done => {
                    if let Some(Failure::Sampler(e)) = g.failure() {
                        failed.get_or_insert(e.clone());
                    }
                }
                _ => {}
            })
            .map_err(|f| f.error)?;
        if let Some(e) = failed {
            return Err(GenerateError::Sampler(e));
        }
        if let Some((_, g)) = batch.iter().next() {
            let (fed, total) = (g.prompt_fed(), g.prompt().len());
            if fed > fed_before && fed_before < total {
                fed_before = fed.min(total);
                on_prefill(fed_before, total);
            }
        }
        if !worked {
            break;
        }
    }
    let (_, mut g) = batch
        .take_where(|_, _| true)
        .pop()
        .expect("the batch holds the one sequence pushed");
    let interrupted = cancelled && !g.is_done();
    if !g.is_done() {
        let tail = g.finish_now(FinishReason::Length);
        if !tail.is_empty() {
            on_text(&tail);
        }
    }
    Ok(Interruptible {
        out: g.out,
        interrupted,
    })
}
