//! Summary statistics of benchmark samples (llama-bench's: mean and sample standard
//! deviation of the per-repetition throughputs; plus the median, robust to a disturbed run).

pub fn mean(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    xs.iter().sum::<f64>() / xs.len() as f64
}

/// Sample standard deviation (n - 1 in the denominator); 0 for fewer than two samples.
pub fn stdev(xs: &[f64]) -> f64 {
    if xs.len() < 2 {
        return 0.0;
    }
    let m = mean(xs);
    let ss: f64 = xs.iter().map(|x| (x - m) * (x - m)).sum();
    (ss / (xs.len() - 1) as f64).sqrt()
}

pub fn median(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn against_hand_computed_values() {
        // 2, 4, 4, 4, 5, 5, 7, 9: mean 5, sum of squares 32, sample sd sqrt(32/7).
        let xs = [9.0, 2.0, 4.0, 4.0, 5.0, 4.0, 5.0, 7.0];
        assert_eq!(mean(&xs), 5.0);
        assert!((stdev(&xs) - (32.0f64 / 7.0).sqrt()).abs() < 1e-12);
        assert_eq!(median(&xs), 4.5);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(stdev(&[1.0]), 0.0);
        assert!(median(&[]).is_nan());
    }
}
