//! The truncation stages on the candidate list, each as llama.cpp defines it. Candidates
//! are kept best first (ties by id) wherever a stage reads that order.
//!
//! Temperature is not applied to the logits: the chain carries it as `t` and every stage
//! that reads probabilities computes them as softmax(logit / t). That keeps the default
//! chain's arithmetic exactly what it was before the order became configurable.

use super::Candidate;

/// Best first, ties by id: a total order, so sorting gives one result.
pub(crate) fn by_logit(a: &Candidate, b: &Candidate) -> std::cmp::Ordering {
    b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id))
}

/// softmax(logit / t) in f64, in the list's order.
pub(crate) fn softmax(c: &[Candidate], temperature: f32) -> Vec<f64> {
    let max = c.iter().map(|c| c.logit).fold(f32::NEG_INFINITY, f32::max) as f64;
    let t = temperature as f64;
    let mut v: Vec<f64> = c
        .iter()
        .map(|c| ((c.logit as f64 - max) / t).exp())
        .collect();
    let s: f64 = v.iter().sum();
    v.iter_mut().for_each(|p| *p /= s);
    v
}

/// Top-k on an unsorted list; leaves it sorted.
pub(crate) fn top_k(c: &mut Vec<Candidate>, k: i32) {
    if k > 0 && (k as usize) < c.len() {
        c.select_nth_unstable_by(k as usize - 1, by_logit);
        c.truncate(k as usize);
    }
    c.sort_unstable_by(by_logit);
}

/// Nucleus on a sorted list: the smallest prefix whose mass reaches `p`.
pub(crate) fn top_p(c: &mut Vec<Candidate>, p: f32, t: f32) {
    let probs = softmax(c, t);
    let mut cum = 0.0f64;
    let mut keep = probs.len();
    for (i, q) in probs.iter().enumerate() {
        cum += q;
        if cum >= p as f64 {
            keep = i + 1;
            break;
        }
    }
    c.truncate(keep.max(1));
}

/// Min-p on a sorted list: p_i ≥ min_p · p_max ⇔ logit_i ≥ logit_max + t · ln(min_p).
pub(crate) fn min_p(c: &mut Vec<Candidate>, min_p: f32, t: f32) {
    let floor = c[0].logit + min_p.ln() * t;
    let keep = c.iter().take_while(|c| c.logit >= floor).count();
    c.truncate(keep.max(1));
}

/// Locally typical sampling (Meister et al. 2022) on a sorted list: tokens ordered by how
/// far their surprise −ln p is from the entropy H, the smallest such set with mass > `p`.
/// Leaves the list unsorted (the caller re-sorts). Terms with p = 0 add nothing to H.
pub(crate) fn typical(c: &mut Vec<Candidate>, p: f32, t: f32) {
    let probs = softmax(c, t);
    let entropy: f64 = probs
        .iter()
        .filter(|&&q| q > 0.0)
        .map(|&q| -q * q.ln())
        .sum();
    let score = |i: usize| (-probs[i].ln() - entropy).abs();
    let mut order: Vec<usize> = (0..c.len()).collect();
    order.sort_by(|&a, &b| score(a).total_cmp(&score(b)).then(a.cmp(&b)));
    let mut cum = 0.0f64;
    let mut keep = order.len();
    for (i, &idx) in order.iter().enumerate() {
        cum += probs[idx];
        if cum > p as f64 {
            keep = i + 1;
            break;
        }
    }
    let kept: Vec<Candidate> = order[..keep].iter().map(|&i| c[i]).collect();
    *c = kept;
}

/// Top-n-σ (Tang et al. 2024): keep logits ≥ max − n·σ, σ the population standard
/// deviation of the logits. The bound scales with temperature on both sides, so it is
/// the same before or after it.
pub(crate) fn top_n_sigma(c: &mut Vec<Candidate>, n: f32) {
    if c.len() <= 1 {
        return;
    }
    let count = c.len() as f64;
    let max = c.iter().map(|c| c.logit).fold(f32::NEG_INFINITY, f32::max) as f64;
    let mean = c.iter().map(|c| c.logit as f64).sum::<f64>() / count;
    let var = c
        .iter()
        .map(|c| (c.logit as f64 - mean).powi(2))
        .sum::<f64>()
        / count;
    let floor = max - n as f64 * var.sqrt();
    c.retain(|c| c.logit as f64 >= floor);
}

/// XTC (exclude top choices, p-e-w) on a sorted list, once its coin came up: of the tokens
/// with probability ≥ `threshold`, all but the least likely are removed.
pub(crate) fn xtc(c: &mut Vec<Candidate>, threshold: f32, t: f32) {
    let probs = softmax(c, t);
    let above = probs.iter().take_while(|&&q| q >= threshold as f64).count();
    if above >= 2 {
        c.drain(..above - 1);
    }
}
