//! Speculative sampling's acceptance rule (issue 31; Leviathan et al. 2023, Chen et al.
//! 2023): a drafted token `x` proposed from the drafter's distribution `q` is kept with
//! probability min(1, p(x)/q(x)), `p` being the target's distribution at that row (the
//! sampler chain's final one, exactly what plain sampling would draw from); on rejection the
//! row's token is drawn from the normalised residual max(0, p − q), and the rows after it
//! are dropped. Whatever `q` is, the kept-or-resampled token is distributed as `p`, so a
//! speculative reply is distributed as a plain one (not equal to it draw for draw).
//!
//! Prompt lookup's drafts are deterministic: its `q` is one-hot on `x`, so `x` is kept with
//! probability p(x) and the residual is `p` without `x`, renormalised. The rule is written
//! for a general `q` so a draft model plugs in with its own distribution.
//!
//! The random stream (the sequence's own sampler RNG, so a seeded run is reproducible: the
//! same seed and the same drafts give the same tokens): per drafted row, the chain's own
//! draws first (XTC's coin, where it runs), then one uniform u for the acceptance (always
//! taken, kept when u·q(x) < p(x)), then, on rejection only, one uniform for the residual.
//! A row without a draft (the bonus row after every draft held) draws as plain sampling.

use crate::sampler::Rng;
use std::collections::HashMap;

/// A distribution over token ids: (id, probability) pairs, ids distinct, summing to 1;
/// an id not listed has probability 0.
pub type Dist = [(u32, f64)];

/// What verification made of a drafted row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The draft holds: it is the row's token and the next row is verified.
    Accepted(u32),
    /// The draft fails; the token drawn in its place ends the forward's rows.
    Rejected(u32),
}

impl Verdict {
    pub fn token(self) -> u32 {
        match self {
            Verdict::Accepted(t) | Verdict::Rejected(t) => t,
        }
    }
    pub fn accepted(self) -> bool {
        matches!(self, Verdict::Accepted(_))
    }
}

/// How the rule runs; only the tests' controls change it (they must fail the same bound
/// the exact rule passes).
#[cfg(test)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Control {
    Exact,
    /// On rejection, draw from `p` instead of the residual (the draft is over-weighted).
    ResampleFromP,
}

#[cfg(test)]
thread_local! {
    pub(crate) static CONTROL: std::cell::Cell<Control> = const { std::cell::Cell::new(Control::Exact) };
}

/// The probability `d` gives `id`.
pub fn prob(d: &Dist, id: u32) -> f64 {
    d.iter().find(|e| e.0 == id).map_or(0.0, |e| e.1)
}

/// Verifies the drafted token `x` (proposed from `q`) against the target `p`, drawing from
/// `rng` as the module docs say.
pub fn verify(p: &Dist, q: &Dist, x: u32, rng: &mut Rng) -> Verdict {
    let (px, qx) = (prob(p, x), prob(q, x));
    let u = rng.next_f64();
    // u < p/q without the division; a draft its own drafter gave no mass (a drafter's bug)
    // is kept exactly where the target allows it.
    if u * qx < px {
        return Verdict::Accepted(x);
    }
    #[cfg(test)]
    if CONTROL.with(|c| c.get()) == Control::ResampleFromP {
        return Verdict::Rejected(draw(p.iter().copied(), 1.0, rng));
    }
    // A large q (a draft model's whole vocabulary) is looked up through a map.
    let map: Option<HashMap<u32, f64>> = (q.len() > 8).then(|| q.iter().copied().collect());
    let q_of = |id: u32| match &map {
        Some(m) => m.get(&id).copied().unwrap_or(0.0),
        None => prob(q, id),
    };
    let residual = || p.iter().map(|&(id, pi)| (id, (pi - q_of(id)).max(0.0)));
    let mass: f64 = residual().map(|e| e.1).sum();
    if mass <= 0.0 {
        // Rejection needs p(x) < q(x), which leaves the residual the mass q(x) − p(x) > 0;
        // none left means p and q agree within rounding, where acceptance is certain.
        return Verdict::Accepted(x);
    }
    Verdict::Rejected(draw(residual(), mass, rng))
}

/// One draw from unnormalised weights summing to `mass` (the last positive one when
/// rounding leaves the uniform past the sum).
fn draw(w: impl Iterator<Item = (u32, f64)>, mass: f64, rng: &mut Rng) -> u32 {
    let r = rng.next_f64() * mass;
    let mut cum = 0.0;
    let mut last = None;
    for (id, wi) in w {
        if wi <= 0.0 {
            continue;
        }
        cum += wi;
        last = Some(id);
        if r < cum {
            return id;
        }
    }
    last.expect("a distribution with mass has a positive entry")
}

#[cfg(test)]
#[path = "speculative_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "spec_sampling_tests.rs"]
mod end_to_end;
