//! Prompt lookup under a grammar, on a fake byte-level model: the grammar constrains the
//! drafts (a draft stops before the first token the matcher refuses, so no refused token is
//! ever fed as a drafted row) and the verification alike (each row is masked from the
//! matcher advanced over the kept tokens only), so greedy output equals plain constrained
//! decoding's byte for byte; sampled output stays inside the grammar.

use super::{ConstraintSpec, Grammars, TokTrie};
use crate::lookup::LookupConfig;
use crate::test_support::greedy;
use crate::{generate, GenerateRequest, LogitsModel, TokenBytes};
use minfer_engine::{BatchEntry, BatchLogits, SeqId};
use std::collections::HashMap;

const EOS: u32 = 256;
const N: usize = 257;

/// Greedy: a → b → c → d → a, then `a` (5) and `x` (3) as the next best.
fn row(t: u32) -> Vec<f32> {
    let mut l = vec![0.0; N];
    l[b'a' as usize] = 5.0;
    l[b'x' as usize] = 3.0;
    if (b'a' as u32..=b'd' as u32).contains(&t) {
        l[(b'a' as u32 + (t - b'a' as u32 + 1) % 4) as usize] = 10.0;
    }
    l
}

#[derive(Default)]
struct Bytes {
    len: HashMap<SeqId, usize>,
    /// Every drafted token the model was fed (the rows after an entry's first).
    drafted: Vec<u32>,
    logits: BatchLogits,
}

impl LogitsModel for Bytes {
    type Error = std::io::Error;
    fn forward_batch(&mut self, entries: &[BatchEntry]) -> Result<&BatchLogits, Self::Error> {
        let mut data = Vec::new();
        let mut rows = Vec::new();
        for e in entries {
            let len = self.len.entry(e.seq).or_default();
            assert_eq!(e.pos0, *len, "an entry must start where the KV ends");
            *len += e.tokens.len();
            if e.logits == e.tokens.len() {
                self.drafted.extend(&e.tokens[1..]);
            }
            rows.push((data.len() / N, e.logits));
            for &t in &e.tokens[e.tokens.len() - e.logits..] {
                data.extend(row(t));
            }
        }
        self.logits = BatchLogits::from_rows(data, rows, N);
        Ok(&self.logits)
    }
    fn context_len(&self) -> usize {
        256
    }
    fn max_batch(&self) -> usize {
        64
    }
    fn default_seq(&self) -> SeqId {
        SeqId(0)
    }
    fn seq_truncate(&mut self, seq: SeqId, len: usize) -> Result<(), Self::Error> {
        *self.len.entry(seq).or_default() = len;
        Ok(())
    }
}

struct Text;
impl TokenBytes for Text {
    fn token_bytes(&self, id: u32) -> Vec<u8> {
        if id < 256 {
            vec![id as u8]
        } else {
            Vec::new()
        }
    }
}

fn request(grammar: bool, lookup: bool) -> GenerateRequest {
    let mut words: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    words.push(vec![TokTrie::SPECIAL_TOKEN_MARKER, b'e']);
    let g = Grammars::from_words(words, &[EOS]).unwrap();
    let spec = ConstraintSpec::Regex("[abcx]+".into());
    GenerateRequest {
        constraint: grammar.then(|| g.compile(&spec).unwrap()),
        lookup: lookup.then_some(LookupConfig {
            ngram: 2,
            draft_max: 8,
        }),
        eog: vec![EOS],
        ..greedy(b"abcdabcdab".iter().map(|&b| b as u32).collect(), 40)
    }
}

#[test]
fn greedy_constrained_lookup_is_plain_constrained_decoding() {
    let mut plain = Bytes::default();
    let a = generate(&mut plain, &Text, &request(true, false), |_| {}).unwrap();
    let mut spec = Bytes::default();
    let b = generate(&mut spec, &Text, &request(true, true), |_| {}).unwrap();
    assert_eq!(a.text, b.text);
    assert_eq!(a.tokens, b.tokens);
    assert!(
        a.text.starts_with(b"cabcabc"),
        "{:?}",
        String::from_utf8_lossy(&a.text)
    );
    let s = b.speculative.unwrap();
    assert!(s.accepted > 10, "{s:?}");
    // No draft the grammar refuses was fed ('d' follows 'c' in the prompt).
    assert!(!spec.drafted.contains(&(b'd' as u32)), "{:?}", spec.drafted);
    // Control: without the grammar the drafter proposes the prompt's 'd'.
    let mut free = Bytes::default();
    generate(&mut free, &Text, &request(false, true), |_| {}).unwrap();
    assert!(free.drafted.contains(&(b'd' as u32)));
}

#[test]
fn sampled_constrained_lookup_stays_inside_the_grammar() {
    let mut kept = 0;
    for seed in 0..100 {
        let mut r = request(true, true);
        r.sampler.temperature = 1.0;
        r.sampler.seed = seed;
        let mut m = Bytes::default();
        let out = generate(&mut m, &Text, &r, |_| {}).unwrap();
        assert!(
            out.text.iter().all(|c| b"abcx".contains(c)),
            "{:?}",
            String::from_utf8_lossy(&out.text)
        );
        assert!(!m.drafted.contains(&(b'd' as u32)));
        kept += out.speculative.unwrap().accepted;
    }
    assert!(kept > 0);
}
