//! DRY ("don't repeat yourself", p-e-w's sampler as llama.cpp runs it): a token that would
//! extend a repetition of at least `allowed_length` tokens already in the window loses
//! `multiplier · base^(length − allowed_length)` from its logit.
//!
//! Repeats do not reach back across a sequence breaker (by default `\n`, `:`, `"`, `*`): the
//! match length is capped at the distance to the newest breaker in the window. llama.cpp
//! finds a breaker split across tokens by re-tokenizing its tail; we match the tail's bytes
//! against the following tokens' bytes instead, so any tokenization of the tail counts.

use std::collections::HashMap;

/// Longest breaker llama.cpp keeps (longer ones are cut to this many bytes).
const MAX_BREAKER_BYTES: usize = 40;
/// `ln(f32::MAX)`: the exponent cap that keeps `base^exp` finite.
const F32_MAX_LN: f32 = 88.722_84;

/// The breakers as seen by the vocabulary: for each token that holds a breaker, or ends with
/// the start of one, the bytes still to come (empty: the token holds a whole breaker).
#[derive(Clone, Debug, Default)]
pub(crate) struct Breakers {
    heads: HashMap<u32, Vec<Vec<u8>>>,
}

impl Breakers {
    /// Scans the vocabulary once (`bytes(id)` for ids `0..vocab`).
    pub(crate) fn build(breakers: &[String], vocab: usize, bytes: &dyn Fn(u32) -> Vec<u8>) -> Self {
        let list: Vec<&[u8]> = breakers
            .iter()
            .map(|b| &b.as_bytes()[..b.len().min(MAX_BREAKER_BYTES)])
            .filter(|b| !b.is_empty())
            .collect();
        let mut heads: HashMap<u32, Vec<Vec<u8>>> = HashMap::new();
        if list.is_empty() {
            return Breakers { heads };
        }
        for id in 0..vocab as u32 {
            let word = bytes(id);
            for b in &list {
                let mut tails: Vec<Vec<u8>> = Vec::new();
                if word.windows(b.len()).any(|w| w == *b) {
                    tails.push(Vec::new());
                } else {
                    // A suffix of the token that is a proper prefix of the breaker.
                    for pos in 0..word.len() {
                        let rest = &word[pos..];
                        if rest.len() < b.len() && b.starts_with(rest) {
                            tails.push(b[rest.len()..].to_vec());
                        }
                    }
                }
                if !tails.is_empty() {
                    let e = heads.entry(id).or_default();
                    for t in tails {
                        if !e.contains(&t) {
                            e.push(t);
                        }
                    }
                }
            }
        }
        Breakers { heads }
    }

    /// The token holds a whole breaker: DRY never penalises it.
    fn is_whole(&self, id: u32) -> bool {
        self.heads
            .get(&id)
            .is_some_and(|t| t.iter().any(|t| t.is_empty()))
    }

    /// How many tokens after `window[head]` the breaker starting there spans (None: none
    /// starts there). The longest matching tail wins, as in llama.cpp.
    fn span_at(
        &self,
        window: &[u32],
        head: usize,
        bytes: &dyn Fn(u32) -> Vec<u8>,
    ) -> Option<usize> {
        let tails = self.heads.get(&window[head])?;
        let mut best: Option<usize> = None;
        for tail in tails {
            let mut got = Vec::new();
            let mut used = 0;
            while got.len() < tail.len() && head + 1 + used < window.len() {
                got.extend(bytes(window[head + 1 + used]));
                used += 1;
            }
            if got.len() >= tail.len() && got.starts_with(tail) && best.is_none_or(|b| used > b) {
                best = Some(used);
            }
        }
        best
    }
}

/// DRY's settings (llama.cpp's names without the `dry_` prefix).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dry {
    pub multiplier: f32,
    pub base: f32,
    pub allowed_length: usize,
}

impl Dry {
    /// The penalty per token id for continuing `window` (the last tokens, oldest first).
    /// Empty when no repeat reaches `allowed_length`.
    pub(crate) fn penalties(
        &self,
        window: &[u32],
        breakers: &Breakers,
        bytes: &dyn Fn(u32) -> Vec<u8>,
    ) -> HashMap<u32, f32> {
        let mut out = HashMap::new();
        let n = window.len();
        if n <= self.allowed_length {
            return out;
        }
        // The newest breaker caps how far back a repeat may reach.
        let mut rep_limit = n;
        for back in 0..n {
            let head = n - 1 - back;
            if let Some(span) = breakers.span_at(window, head, bytes) {
                rep_limit = back - span;
                break;
            }
        }
        if rep_limit < self.allowed_length {
            return out;
        }
        // z[k] = longest common prefix of the reversed window and the reversed window from
        // k on: how many tokens before position n-1-k (inclusive) repeat the window's end.
        let z = reversed_z(window);
        let mut longest: HashMap<u32, usize> = HashMap::new();
        for (k, &zk) in z.iter().enumerate().skip(1) {
            let len = zk.min(rep_limit);
            if len >= self.allowed_length {
                let next = window[n - k];
                let e = longest.entry(next).or_default();
                *e = (*e).max(len);
            }
        }
        let max_exp = if self.base > 1.000_001 {
            (F32_MAX_LN / self.base.ln()) as usize
        } else {
            0
        };
        for (id, len) in longest {
            if breakers.is_whole(id) {
                continue;
            }
            let mut exp = len - self.allowed_length;
            if max_exp > 0 {
                exp = exp.min(max_exp);
            }
            out.insert(id, self.multiplier * self.base.powi(exp as i32));
        }
        out
    }
}

/// The Z-array of the window read backwards (newest token first), in O(n).
fn reversed_z(window: &[u32]) -> Vec<usize> {
    let n = window.len();
    let at = |i: usize| window[n - 1 - i];
    let mut z = vec![0usize; n];
    if n == 0 {
        return z;
    }
    z[0] = n;
    let (mut l, mut r) = (0usize, 0usize); // [l, r) is the rightmost match box
    for k in 1..n {
        let mut len = if k < r { z[k - l].min(r - k) } else { 0 };
        while k + len < n && at(len) == at(k + len) {
            len += 1;
        }
        z[k] = len;
        if k + len > r {
            l = k;
            r = k + len;
        }
    }
    z
}

#[cfg(test)]
mod tests {
    use super::*;

    fn letters(id: u32) -> Vec<u8> {
        vec![b'a' + id as u8]
    }

    /// The definition, brute force: for each earlier position p whose next token is t, the
    /// number of tokens ending at p that equal the window's end, capped by `limit`.
    fn reference(
        window: &[u32],
        allowed: usize,
        limit: usize,
        mult: f32,
        base: f32,
    ) -> HashMap<u32, f32> {
        let n = window.len();
        let mut best: HashMap<u32, usize> = HashMap::new();
        for p in 0..n.saturating_sub(1) {
            let mut len = 0;
            while len <= p && window[p - len] == window[n - 1 - len] {
                len += 1;
            }
            let len = len.min(limit);
            if len >= allowed {
                let e = best.entry(window[p + 1]).or_default();
                *e = (*e).max(len);
            }
        }
        best.into_iter()
            .map(|(t, l)| (t, mult * base.powf((l - allowed) as f32)))
            .collect()
    }

    #[test]
    fn z_penalties_equal_the_brute_force_definition() {
        // The llama.cpp comment's example "a b c c b c y a b c": c (3→4), b (1), y (2).
        let w = [0u32, 1, 2, 2, 1, 2, 24, 0, 1, 2];
        let dry = Dry {
            multiplier: 0.8,
            base: 1.75,
            allowed_length: 2,
        };
        let got = dry.penalties(&w, &Breakers::default(), &letters);
        let want = reference(&w, 2, usize::MAX, 0.8, 1.75);
        assert_eq!(got.len(), 2);
        assert_eq!(got[&2], 0.8 * 1.75);
        assert_eq!(got[&24], 0.8);
        for (t, p) in &want {
            assert!((got[t] - p).abs() < 1e-6, "{t}");
        }
        // Many pseudo-random windows over a small alphabet (lots of repeats).
        let mut x = 12345u64;
        for _ in 0..300 {
            let n = 2 + (x % 60) as usize;
            let w: Vec<u32> = (0..n)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    (x % 3) as u32
                })
                .collect();
            for allowed in [1, 2, 3] {
                let dry = Dry {
                    multiplier: 1.5,
                    base: 1.1,
                    allowed_length: allowed,
                };
                let got = dry.penalties(&w, &Breakers::default(), &letters);
                let want = if n <= allowed {
                    HashMap::new()
                } else {
                    reference(&w, allowed, usize::MAX, 1.5, 1.1)
                };
                assert_eq!(got.len(), want.len(), "{w:?}");
                for (t, p) in &want {
                    assert!((got[t] - p).abs() <= 1e-5 * p.abs(), "{w:?} {t}");
                }
            }
        }
    }

    #[test]
    fn breakers_cap_the_repeat_and_are_never_penalised() {
        // Vocabulary: letters; "x" (23) is a breaker. Window "a b c x a b": the repeat "a b"
        // reaches back to the breaker only (limit 2), and "x" itself is exempt.
        let br = Breakers::build(&["x".into()], 26, &letters);
        let dry = Dry {
            multiplier: 1.0,
            base: 2.0,
            allowed_length: 1,
        };
        let w = [0u32, 1, 2, 23, 0, 1];
        let got = dry.penalties(&w, &br, &letters);
        assert_eq!(got, reference(&w, 1, 2, 1.0, 2.0));
        // "a b x a b": the repeat would continue with x, a whole breaker: no penalty.
        let w = [0u32, 1, 23, 0, 1];
        assert!(!dry.penalties(&w, &br, &letters).contains_key(&23));
    }

    #[test]
    fn a_breaker_split_across_tokens_is_found() {
        // Tokens "q" (16) and "r" (17); the breaker "qr" spans two tokens.
        let br = Breakers::build(&["qr".into()], 26, &letters);
        let w = [0u32, 1, 16, 17, 0, 1];
        let dry = Dry {
            multiplier: 1.0,
            base: 2.0,
            allowed_length: 1,
        };
        // Newest breaker head at index 2 spanning one more token: limit = 3 - 1 = 2.
        assert_eq!(
            dry.penalties(&w, &br, &letters),
            reference(&w, 1, 2, 1.0, 2.0)
        );
    }
}
