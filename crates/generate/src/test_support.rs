//! What the crate's unit tests over fake models share: a vocabulary of letters and a greedy
//! request.

use crate::sampler::SamplerConfig;
use crate::{GenerateRequest, TokenBytes};

/// Token `id` is the letter `'a' + id`.
pub(crate) struct Letters;

impl TokenBytes for Letters {
    fn token_bytes(&self, id: u32) -> Vec<u8> {
        vec![b'a' + id as u8]
    }
}

/// A greedy request for `n` tokens after `prompt`: no stops, no end-of-generation tokens.
pub(crate) fn greedy(prompt: Vec<u32>, n: usize) -> GenerateRequest {
    GenerateRequest {
        prompt,
        max_tokens: n,
        sampler: SamplerConfig {
            temperature: 0.0,
            ..SamplerConfig::default()
        },
        stop_strings: vec![],
        eog: vec![],
        logprobs: None,
        constraint: None,
        lookup: None,
        draft: None,
    }
}

/// ln Γ(x), x > 0 (Lanczos, g = 7, nine terms: ~1e-15 relative).
fn ln_gamma(x: f64) -> f64 {
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    let x = x - 1.0;
    let mut a = C[0];
    let t = x + 7.5;
    for (i, c) in C.iter().enumerate().skip(1) {
        a += c / (x + i as f64);
    }
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + a.ln()
}

/// The regularised upper incomplete gamma Q(a, x): its series below a + 1, its continued
/// fraction (modified Lentz) above.
fn gamma_q(a: f64, x: f64) -> f64 {
    if x <= 0.0 {
        return 1.0;
    }
    let front = (-x + a * x.ln() - ln_gamma(a)).exp();
    if x < a + 1.0 {
        let (mut term, mut sum, mut n) = (1.0 / a, 1.0 / a, a);
        while term.abs() > sum.abs() * 1e-16 {
            n += 1.0;
            term *= x / n;
            sum += term;
        }
        1.0 - sum * front
    } else {
        let tiny = 1e-300;
        let mut b = x + 1.0 - a;
        let mut c = 1.0 / tiny;
        let mut d = 1.0 / b;
        let mut h = d;
        for i in 1..10_000 {
            let an = -(i as f64) * (i as f64 - a);
            b += 2.0;
            d = an * d + b;
            d = if d.abs() < tiny { tiny } else { d };
            c = b + an / c;
            c = if c.abs() < tiny { tiny } else { c };
            d = 1.0 / d;
            let step = d * c;
            h *= step;
            if (step - 1.0).abs() < 1e-16 {
                break;
            }
        }
        front * h
    }
}

/// P(χ²_df ≥ stat).
pub(crate) fn chi2_sf(stat: f64, df: usize) -> f64 {
    gamma_q(df as f64 / 2.0, stat / 2.0)
}

/// The χ² value whose upper tail is `alpha` at `df` degrees of freedom (bisection on
/// [`chi2_sf`]).
pub(crate) fn chi2_critical(df: usize, alpha: f64) -> f64 {
    let (mut lo, mut hi) = (0.0, 10.0 * df as f64 + 100.0);
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if chi2_sf(mid, df) > alpha {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    hi
}

/// The p-value threshold every distribution gate of the crate uses: a correct rule fails
/// it once in 10⁴ runs.
pub(crate) const CHI2_ALPHA: f64 = 1e-4;

/// Pearson's χ² of `counts` against the probabilities `expected` (cells of expectation
/// below 5 pooled into one): (statistic, degrees of freedom).
pub(crate) fn chi2_fit(counts: &[u64], expected: &[f64]) -> (f64, usize) {
    let n: u64 = counts.iter().sum();
    let (mut stat, mut cells) = (0.0, 0usize);
    let (mut pool_o, mut pool_e) = (0.0, 0.0);
    for (&o, &p) in counts.iter().zip(expected) {
        let e = p * n as f64;
        if e < 5.0 {
            pool_o += o as f64;
            pool_e += e;
            continue;
        }
        stat += (o as f64 - e).powi(2) / e;
        cells += 1;
    }
    if pool_e > 0.0 {
        stat += (pool_o - pool_e).powi(2) / pool_e.max(1e-12);
        cells += 1;
    }
    (stat, cells.saturating_sub(1))
}

/// The two-sample χ² of equal-sized samples `a` and `b` over the same cells (cells seen
/// fewer than 10 times in both together pooled): (statistic, degrees of freedom).
pub(crate) fn chi2_two_sample(a: &[u64], b: &[u64]) -> (f64, usize) {
    assert_eq!(a.iter().sum::<u64>(), b.iter().sum::<u64>());
    let (mut stat, mut cells) = (0.0, 0usize);
    let (mut pa, mut pb) = (0.0, 0.0);
    for (&x, &y) in a.iter().zip(b) {
        let (x, y) = (x as f64, y as f64);
        if x + y < 10.0 {
            pa += x;
            pb += y;
            continue;
        }
        stat += (x - y).powi(2) / (x + y);
        cells += 1;
    }
    if pa + pb > 0.0 {
        stat += (pa - pb).powi(2) / (pa + pb);
        cells += 1;
    }
    (stat, cells.saturating_sub(1))
}

#[test]
fn chi2_tails_match_known_values() {
    // Tables: χ²(1) ≥ 3.841 is 0.05; χ²(10) ≥ 23.209 is 0.01; χ²(5) ≥ 20.515 is 0.001.
    assert!((chi2_sf(3.841_458_8, 1) - 0.05).abs() < 1e-6);
    assert!((chi2_sf(23.209_251, 10) - 0.01).abs() < 1e-6);
    assert!((chi2_sf(20.515_006, 5) - 0.001).abs() < 1e-7);
    assert!((chi2_critical(10, 0.01) - 23.209_251).abs() < 1e-4);
}
