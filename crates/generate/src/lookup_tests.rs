//! Prompt lookup through the generation loop on a fake model: the tokens are plain
//! decoding's, fewer forwards run, drafts are both accepted and rejected, and no rejected
//! row survives in the KV (every entry starts exactly where the sequence's KV ends, which
//! the fake asserts: the engine would silently drop a tail, the fake does not).

use super::*;
use crate::test_support::greedy;
use crate::{generate, GenerateRequest, LogitsModel, TokenBytes};
use minfer_engine::{BatchEntry, BatchLogits, SeqId};
use std::collections::HashMap;

const VOCAB: usize = 32;

/// Greedy next token = f(the row's own token), f fixed: a reply is a chain of f, which the
/// drafter guesses right once the chain repeats and wrong where it copies the prompt.
fn f(t: u32) -> u32 {
    (t * 7 + 3) % VOCAB as u32
}

#[derive(Default)]
struct Chain {
    len: HashMap<SeqId, usize>,
    forwards: usize,
    rows: usize,
    logits: BatchLogits,
}

impl LogitsModel for Chain {
    type Error = std::io::Error;
    fn forward_batch(&mut self, entries: &[BatchEntry]) -> Result<&BatchLogits, Self::Error> {
        self.forwards += 1;
        let mut data = Vec::new();
        let mut rows = Vec::new();
        for e in entries {
            let len = self.len.entry(e.seq).or_default();
            assert_eq!(e.pos0, *len, "an entry must start where the KV ends");
            *len += e.tokens.len();
            self.rows += e.tokens.len();
            rows.push((data.len() / VOCAB, e.logits));
            for &t in &e.tokens[e.tokens.len() - e.logits..] {
                let mut l = vec![0.0; VOCAB];
                l[f(t) as usize] = 10.0;
                data.extend(l);
            }
        }
        self.logits = BatchLogits::from_rows(data, rows, VOCAB);
        Ok(&self.logits)
    }
    fn context_len(&self) -> usize {
        4096
    }
    fn max_batch(&self) -> usize {
        512
    }
    fn default_seq(&self) -> SeqId {
        SeqId(0)
    }
    fn seq_truncate(&mut self, seq: SeqId, len: usize) -> Result<(), Self::Error> {
        let l = self.len.entry(seq).or_default();
        assert!(len <= *l);
        *l = len;
        Ok(())
    }
}

struct Ids;
impl TokenBytes for Ids {
    fn token_bytes(&self, id: u32) -> Vec<u8> {
        vec![b'A' + id as u8]
    }
}

fn req(prompt: Vec<u32>, n: usize, lookup: Option<LookupConfig>) -> GenerateRequest {
    GenerateRequest {
        lookup,
        ..greedy(prompt, n)
    }
}

#[test]
fn lookup_gives_plain_decodings_tokens_in_fewer_forwards() {
    // The reply is f's cycle from 24: 11 16 19 8 27 0 3 24 ... The prompt holds pieces of it
    // with wrong continuations (11 16 19 then 5, 27 0 then 9), which are drafted and rejected
    // until the reply's own earlier cycle is the latest match.
    let prompt = vec![11, 16, 19, 5, 2, 27, 0, 9, 7, 3, 24, 30, 1, 24];
    for (n, ngram, draft_max) in [(60, 3, 8), (40, 1, 4), (7, 2, 16)] {
        let mut plain = Chain::default();
        let a = generate(&mut plain, &Ids, &req(prompt.clone(), n, None), |_| {}).unwrap();
        let mut spec = Chain::default();
        let cfg = LookupConfig { ngram, draft_max };
        let b = generate(&mut spec, &Ids, &req(prompt.clone(), n, Some(cfg)), |_| {}).unwrap();
        assert_eq!(a.tokens, b.tokens, "n {n} ngram {ngram}");
        assert_eq!(a.text, b.text);
        assert_eq!(a.finish, b.finish);
        let s = b.speculative.expect("stats of a speculative run");
        assert!(s.accepted > 0, "{s:?}");
        // The KV ends holding the prompt and every token but the last sampled one.
        assert_eq!(spec.len[&SeqId(0)], prompt.len() + n - 1);
        if n >= 40 {
            assert!(s.accepted < s.drafted, "some drafts must fail: {s:?}");
            assert!(
                spec.forwards * 2 <= plain.forwards,
                "{} forwards against plain {}",
                spec.forwards,
                plain.forwards
            );
        }
        // Control: plain decoding drafts nothing and reports no speculation.
        assert!(a.speculative.is_none());
        assert_eq!(plain.rows, prompt.len() + n - 1);
    }
}

#[test]
fn settings_lookup_cannot_honour_are_refused_by_name() {
    let mut m = Chain::default();
    let mut r = req(vec![1, 2, 3], 4, Some(LookupConfig::default()));
    r.sampler.temperature = 0.7;
    r.sampler.mirostat = crate::sampler::Mirostat::V2;
    let e = generate(&mut m, &Ids, &r, |_| {}).unwrap_err().to_string();
    assert!(e.contains("mirostat"), "{e}");
    // Controls: the same request without mirostat runs (temperature > 0 is verified by
    // speculative sampling's rule), and so does mirostat's greedy pick.
    r.sampler.mirostat = crate::sampler::Mirostat::Off;
    assert!(generate(&mut Chain::default(), &Ids, &r, |_| {}).is_ok());
    r.sampler.mirostat = crate::sampler::Mirostat::V2;
    r.sampler.temperature = 0.0;
    assert!(generate(&mut Chain::default(), &Ids, &r, |_| {}).is_ok());
}
