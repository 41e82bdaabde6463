//! The acceptance rule on fixed distributions, model-free: over 10⁵ verifications the token
//! it returns is distributed as the target p (Pearson's χ², p-value threshold
//! [`CHI2_ALPHA`] = 1e-4, the critical value computed for the cells' degrees of freedom),
//! for a one-hot q (prompt lookup) and a general q (a draft model); the control that draws
//! from p instead of the residual fails the same bound.

use super::*;
use crate::test_support::{chi2_critical, chi2_fit, CHI2_ALPHA};

const DRAWS: usize = 100_000;

/// Runs `DRAWS` verifications of drafts drawn from `q` against `p` (over ids 0..n):
/// the histogram of the tokens the rule returns, and how many drafts held.
fn histogram(p: &Dist, q: &Dist, n: usize, control: Control, seed: u64) -> (Vec<u64>, usize) {
    CONTROL.with(|c| c.set(control));
    let mut rng = Rng::new(seed);
    let mut draft_rng = Rng::new(seed ^ 0xD1A7);
    let mut counts = vec![0u64; n];
    let mut held = 0;
    for _ in 0..DRAWS {
        let x = draw(q.iter().copied(), 1.0, &mut draft_rng);
        let v = verify(p, q, x, &mut rng);
        held += usize::from(v.accepted());
        counts[v.token() as usize] += 1;
    }
    CONTROL.with(|c| c.set(Control::Exact));
    (counts, held)
}

fn dense(p: &Dist, n: usize) -> Vec<f64> {
    (0..n as u32).map(|i| prob(p, i)).collect()
}

#[test]
fn the_rule_gives_the_targets_distribution_and_the_control_does_not() {
    let p: Vec<(u32, f64)> = vec![
        (0, 0.35),
        (1, 0.25),
        (2, 0.2),
        (3, 0.1),
        (4, 0.07),
        (5, 0.03),
    ];
    let cases: [(&str, Vec<(u32, f64)>); 3] = [
        ("one-hot on a likely token", vec![(1, 1.0)]),
        ("one-hot on a token p never picks", vec![(6, 1.0)]),
        (
            "a draft model's q",
            vec![(0, 0.1), (1, 0.4), (2, 0.1), (3, 0.3), (6, 0.1)],
        ),
    ];
    let n = 7;
    for (what, q) in cases {
        let (counts, held) = histogram(&p, &q, n, Control::Exact, 17);
        let (stat, df) = chi2_fit(&counts, &dense(&p, n));
        let crit = chi2_critical(df, CHI2_ALPHA);
        eprintln!("{what}: χ² {stat:.1}, critical {crit:.1}, df {df}");
        assert!(
            stat < crit,
            "{what}: χ² {stat:.1} ≥ {crit:.1} (df {df}, p-value threshold {CHI2_ALPHA}): {counts:?}"
        );
        // The acceptance rate is Σ min(p, q) (1 − the total variation distance).
        let rate: f64 = q.iter().map(|&(id, qi)| qi.min(prob(&p, id))).sum();
        let got = held as f64 / DRAWS as f64;
        assert!((got - rate).abs() < 0.01, "{what}: held {got} for {rate}");
        if what.contains("never") {
            assert_eq!(held, 0);
            continue; // p ignores the draft: resampling from p is exact there too.
        }
        let (bad, _) = histogram(&p, &q, n, Control::ResampleFromP, 17);
        let (stat, df) = chi2_fit(&bad, &dense(&p, n));
        let crit = chi2_critical(df, CHI2_ALPHA);
        eprintln!("{what}, control: χ² {stat:.1}, critical {crit:.1}");
        assert!(
            stat > crit,
            "{what}: the control passed, χ² {stat:.1} < {crit:.1}"
        );
    }
}

#[test]
fn a_seeded_stream_repeats_and_a_certain_draft_always_holds() {
    let p = [(0u32, 0.5), (1, 0.3), (2, 0.2)];
    let q = [(1u32, 1.0)];
    let run = |seed| {
        let mut rng = Rng::new(seed);
        (0..200)
            .map(|_| verify(&p, &q, 1, &mut rng))
            .collect::<Vec<_>>()
    };
    assert_eq!(run(5), run(5));
    assert_ne!(run(5), run(6), "control: another seed, other verdicts");
    let mut rng = Rng::new(1);
    let sure = [(3u32, 1.0)];
    assert!((0..1000).all(|_| verify(&sure, &sure, 3, &mut rng) == Verdict::Accepted(3)));
}
