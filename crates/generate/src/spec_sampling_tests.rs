//! Speculative sampling end to end, through `generate` and the Batcher, on a tiny fake
//! model: over 2·10⁴ seeded runs each, the replies with prompt lookup at temperature 0.8
//! (with top-k, a presence and a repeat penalty, so each row's distribution depends on the
//! accepted history) are distributed as plain sampling's (two-sample χ² over the whole
//! 4-token reply, p-value threshold [`CHI2_ALPHA`]); the control that resamples from p
//! instead of the residual fails the same bound. Drafts are both kept and rejected.

use super::{Control, CONTROL};
use crate::lookup::LookupConfig;
use crate::sampler::SamplerConfig;
use crate::test_support::{chi2_critical, chi2_two_sample, greedy, CHI2_ALPHA};
use crate::{generate, GenerateRequest, LogitsModel, TokenBytes};
use minfer_engine::{BatchEntry, BatchLogits, SeqId};
use std::collections::HashMap;

const VOCAB: usize = 5;
const RUNS: u64 = 20_000;
const REPLY: usize = 4;

/// Next-token logits from the row's own token: a soft, uneven table.
fn row(t: u32) -> [f32; VOCAB] {
    let mut l = [0.0; VOCAB];
    for (j, x) in l.iter_mut().enumerate() {
        *x = ((t as usize * 3 + j * 2) % VOCAB) as f32 * 0.7;
    }
    l
}

#[derive(Default)]
struct Soft {
    len: HashMap<SeqId, usize>,
    logits: BatchLogits,
}

impl LogitsModel for Soft {
    type Error = std::io::Error;
    fn forward_batch(&mut self, entries: &[BatchEntry]) -> Result<&BatchLogits, Self::Error> {
        let mut data = Vec::new();
        let mut rows = Vec::new();
        for e in entries {
            let len = self.len.entry(e.seq).or_default();
            assert_eq!(e.pos0, *len, "an entry must start where the KV ends");
            *len += e.tokens.len();
            rows.push((data.len() / VOCAB, e.logits));
            for &t in &e.tokens[e.tokens.len() - e.logits..] {
                data.extend(row(t));
            }
        }
        self.logits = BatchLogits::from_rows(data, rows, VOCAB);
        Ok(&self.logits)
    }
    fn context_len(&self) -> usize {
        64
    }
    fn max_batch(&self) -> usize {
        16
    }
    fn default_seq(&self) -> SeqId {
        SeqId(0)
    }
    fn seq_truncate(&mut self, seq: SeqId, len: usize) -> Result<(), Self::Error> {
        *self.len.entry(seq).or_default() = len;
        Ok(())
    }
}

struct Ids;
impl TokenBytes for Ids {
    fn token_bytes(&self, id: u32) -> Vec<u8> {
        vec![b'a' + id as u8]
    }
}

fn request(seed: u64, lookup: Option<LookupConfig>) -> GenerateRequest {
    GenerateRequest {
        sampler: SamplerConfig {
            temperature: 0.8,
            top_k: 4,
            presence_penalty: 0.4,
            repeat_penalty: 1.2,
            seed,
            ..SamplerConfig::default()
        },
        lookup,
        draft: None,
        // Every token follows every other somewhere in the prompt: a draft at every row.
        ..greedy(vec![0, 1, 2, 3, 4, 0, 2, 4, 1, 3, 0], REPLY)
    }
}

/// The replies of `RUNS` seeds as a histogram over the 5⁴ possible replies, with the
/// speculation counts (drafted, accepted) summed.
fn replies(lookup: Option<LookupConfig>, control: Control) -> (Vec<u64>, (usize, usize)) {
    CONTROL.with(|c| c.set(control));
    let mut counts = vec![0u64; VOCAB.pow(REPLY as u32)];
    let mut spec = (0, 0);
    for seed in 0..RUNS {
        let out = generate(&mut Soft::default(), &Ids, &request(seed, lookup), |_| {}).unwrap();
        assert_eq!(out.tokens.len(), REPLY);
        let cell = out.tokens.iter().fold(0, |a, &t| a * VOCAB + t as usize);
        counts[cell] += 1;
        if let Some(s) = out.speculative {
            spec.0 += s.drafted;
            spec.1 += s.accepted;
        }
    }
    CONTROL.with(|c| c.set(Control::Exact));
    (counts, spec)
}

#[test]
fn sampled_replies_with_lookup_are_distributed_as_plain_ones() {
    let cfg = LookupConfig {
        ngram: 2,
        draft_max: 4,
    };
    let (plain, none) = replies(None, Control::Exact);
    assert_eq!(none, (0, 0));
    let (spec, (drafted, accepted)) = replies(Some(cfg), Control::Exact);
    assert!(
        drafted >= RUNS as usize && accepted > drafted / 10 && accepted < drafted * 9 / 10,
        "drafts must be both kept and rejected: {accepted} of {drafted}"
    );
    let (stat, df) = chi2_two_sample(&plain, &spec);
    let crit = chi2_critical(df, CHI2_ALPHA);
    eprintln!("lookup vs plain: χ² {stat:.1}, critical {crit:.1}, df {df}; {accepted} of {drafted} drafts kept");
    assert!(
        stat < crit,
        "χ² {stat:.1} ≥ {crit:.1} (df {df}, p-value threshold {CHI2_ALPHA})"
    );
    // Control: skipping the residual (resampling from p) over-weights the drafts.
    let (bad, _) = replies(Some(cfg), Control::ResampleFromP);
    let (stat, df) = chi2_two_sample(&plain, &bad);
    let crit = chi2_critical(df, CHI2_ALPHA);
    eprintln!("control vs plain: χ² {stat:.1}, critical {crit:.1}, df {df}");
    assert!(
        stat > crit,
        "the control passed: χ² {stat:.1} < {crit:.1} (df {df})"
    );
}

#[test]
fn a_seeded_speculative_reply_repeats_but_is_not_the_plain_draw() {
    let cfg = Some(LookupConfig::default());
    let run = |seed, lookup| {
        generate(&mut Soft::default(), &Ids, &request(seed, lookup), |_| {})
            .unwrap()
            .tokens
    };
    let mut differs = 0;
    for seed in 0..50 {
        assert_eq!(run(seed, cfg), run(seed, cfg), "seed {seed}");
        differs += usize::from(run(seed, cfg) != run(seed, None));
    }
    // Only the distribution is the target's: the draws are taken differently (ADR 0013).
    assert!(differs > 0);
}
