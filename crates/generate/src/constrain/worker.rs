//! One sequence's constraint state: the matcher lives on a worker thread that computes
//! the next mask as soon as a token is committed, in parallel with the model's forward.

use crate::sampler::SamplerError;
use llguidance::toktrie::SimpleVob;
use llguidance::Matcher;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the sequence asks of its worker, in order.
enum Msg {
    /// The sampled token: advance over it, then compute the next mask.
    Commit(u32),
    /// How many of these drafted tokens the grammar allows in turn from the current state
    /// (llguidance's `validate_tokens`, which leaves the matcher where it was).
    Validate(Vec<u32>),
}

/// The worker's answer for one step.
struct Computed {
    mask: Result<SimpleVob, String>,
    took: Duration,
}

/// Mask timings of one sequence.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct ConstraintStats {
    /// Microseconds per mask, as the worker measured it.
    pub mask_us: Vec<f64>,
    /// Microseconds the sampler waited for each mask (0 when it was ready in time).
    pub wait_us: Vec<f64>,
}

impl ConstraintStats {
    /// `(p50, p99)` of the mask times and of the waits, in µs (zeros when empty).
    pub fn percentiles(&self) -> ((f64, f64), (f64, f64)) {
        fn pct(v: &[f64]) -> (f64, f64) {
            if v.is_empty() {
                return (0.0, 0.0);
            }
            let mut s = v.to_vec();
            s.sort_by(f64::total_cmp);
            let at = |q: f64| s[((s.len() - 1) as f64 * q).round() as usize];
            (at(0.5), at(0.99))
        }
        (pct(&self.mask_us), pct(&self.wait_us))
    }
}

/// One sequence's view of its constraint.
pub struct ConstraintState {
    to_worker: Option<Sender<Msg>>,
    from_worker: Receiver<Computed>,
    validated: Receiver<usize>,
    eog: Arc<[u32]>,
    n_vocab: usize,
    stats: ConstraintStats,
}

impl std::fmt::Debug for ConstraintState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConstraintState").finish_non_exhaustive()
    }
}

impl ConstraintState {
    pub(crate) fn spawn(mut matcher: Matcher, eog: Arc<[u32]>, n_vocab: usize) -> Self {
        let (to_worker, tokens) = channel::<Msg>();
        let (masks, from_worker) = channel::<Computed>();
        let (valid, validated) = channel::<usize>();
        std::thread::Builder::new()
            .name("minfer-grammar".into())
            .spawn(move || {
                let compute = |m: &mut Matcher| {
                    let t0 = Instant::now();
                    let mask = m.compute_mask_or_eos().map_err(|e| e.to_string());
                    Computed {
                        mask,
                        took: t0.elapsed(),
                    }
                };
                if masks.send(compute(&mut matcher)).is_err() {
                    return;
                }
                // Ends when the state is dropped (its sender closes).
                while let Ok(msg) = tokens.recv() {
                    let tok = match msg {
                        Msg::Commit(t) => t,
                        Msg::Validate(draft) => {
                            // An error here surfaces at the next mask; the draft is cut.
                            let n = matcher.validate_tokens(&draft).unwrap_or(0);
                            if valid.send(n).is_err() {
                                return;
                            }
                            continue;
                        }
                    };
                    let r = match matcher.consume_token(tok) {
                        Ok(()) => compute(&mut matcher),
                        Err(e) => Computed {
                            mask: Err(e.to_string()),
                            took: Duration::ZERO,
                        },
                    };
                    if masks.send(r).is_err() {
                        return;
                    }
                }
            })
            .expect("spawning the grammar worker thread");
        ConstraintState {
            to_worker: Some(to_worker),
            from_worker,
            validated,
            eog,
            n_vocab,
            stats: ConstraintStats::default(),
        }
    }

    /// Waits for the current mask and sets every disallowed logit to −inf. End-of-generation
    /// ids are allowed exactly where the grammar accepts.
    pub fn apply(&mut self, logits: &mut [f32]) -> Result<(), SamplerError> {
        let t0 = Instant::now();
        let got = self
            .from_worker
            .recv()
            .map_err(|_| SamplerError::Constraint("the grammar worker stopped".into()))?;
        self.stats.wait_us.push(t0.elapsed().as_secs_f64() * 1e6);
        self.stats.mask_us.push(got.took.as_secs_f64() * 1e6);
        let mask = got.mask.map_err(SamplerError::Constraint)?;
        let eos_ok = self.eog.first().is_some_and(|&e| mask.is_allowed(e));
        // The model's own end-of-generation logits, kept where the grammar accepts.
        let eog_logits: Vec<(usize, f32)> = self
            .eog
            .iter()
            .filter_map(|&e| logits.get(e as usize).map(|&l| (e as usize, l)))
            .collect();
        // Word by word over the mask's bits (bit `i % 32` of word `i / 32` is id `i`): a
        // word of zeros — most of the vocabulary inside a JSON string — is 32 plain stores.
        let mut any = false;
        let allowed = mask.as_slice();
        let n = self.n_vocab.min(logits.len());
        for (w, chunk) in logits[..n].chunks_mut(32).enumerate() {
            let bits = allowed.get(w).copied().unwrap_or(0);
            if bits == 0 {
                chunk.fill(f32::NEG_INFINITY);
                continue;
            }
            for (b, l) in chunk.iter_mut().enumerate() {
                if bits >> b & 1 == 1 {
                    any |= *l > f32::NEG_INFINITY;
                } else {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        logits[n..].fill(f32::NEG_INFINITY);
        for (e, l) in eog_logits {
            logits[e] = if eos_ok { l } else { f32::NEG_INFINITY };
            any |= eos_ok && l > f32::NEG_INFINITY;
        }
        if !any {
            return Err(SamplerError::Constraint(
                "no token the model can produce is allowed".into(),
            ));
        }
        Ok(())
    }

    /// Hands the sampled token to the worker, which computes the next mask at once.
    pub fn commit(&mut self, token: u32) {
        if let Some(tx) = &self.to_worker {
            if tx.send(Msg::Commit(token)).is_err() {
                self.to_worker = None;
            }
        }
    }

    /// How many leading tokens of `draft` the grammar allows, each after the ones before,
    /// from the state after every committed token. The worker answers after the mask it is
    /// computing, so this waits for that mask (the forward then starts a little later).
    /// 0 when the worker is gone (the next mask says why).
    pub fn valid_prefix(&self, draft: &[u32]) -> usize {
        if draft.is_empty() {
            return 0;
        }
        let Some(tx) = &self.to_worker else { return 0 };
        if tx.send(Msg::Validate(draft.to_vec())).is_err() {
            return 0;
        }
        self.validated.recv().unwrap_or(0).min(draft.len())
    }

    pub fn stats(&self) -> &ConstraintStats {
        &self.stats
    }
}
