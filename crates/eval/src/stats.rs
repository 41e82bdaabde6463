//! KL divergence statistics of a model against a base file's log-probabilities, with
//! llama-perplexity's formulas (sums, uncertainties, percentiles).

use super::logits_file::row_header;

/// Running sums over scored tokens.
#[derive(Clone, Debug, Default)]
pub struct KldStats {
    sum_nll: f64,
    sum_nll2: f64,
    sum_nll_base: f64,
    sum_nll_base2: f64,
    sum_nll_nll_base: f64,
    sum_kld: f64,
    sum_kld2: f64,
    sum_p_diff: f64,
    sum_p_diff2: f64,
    sum_p_diff4: f64,
    n_same_top: usize,
    count: usize,
    klds: Vec<f32>,
    p_diffs: Vec<f32>,
}

/// A value and one standard error.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Estimate {
    pub value: f64,
    pub err: f64,
}

/// The final statistics (llama-perplexity's "Perplexity", "KL divergence" and "Token
/// probability" sections).
#[derive(Clone, Debug, PartialEq)]
pub struct KldSummary {
    pub count: usize,
    pub ppl: Estimate,
    pub ppl_base: Estimate,
    /// Correlation of the per-token ln-probabilities of the two models.
    pub ln_ppl_correlation: f64,
    pub ln_ppl_ratio: Estimate,
    pub ppl_ratio: Estimate,
    /// PPL(Q) - PPL(base).
    pub ppl_diff: Estimate,
    pub kld: Estimate,
    /// (label, value) from the maximum down to the minimum.
    pub kld_percentiles: Vec<(&'static str, f64)>,
    /// Mean of p(Q) - p(base) of the correct token.
    pub p_diff: Estimate,
    pub p_diff_rms: Estimate,
    pub p_diff_percentiles: Vec<(&'static str, f64)>,
    /// How often both models rank the same token first.
    pub same_top: Estimate,
}

fn mean_and_err(sum: f64, sum2: f64, count: usize) -> Estimate {
    if count == 0 {
        return Estimate {
            value: 0.0,
            err: 0.0,
        };
    }
    let n = count as f64;
    let f = sum / n;
    let df = sum2 / n - f * f;
    let err = if df > 0.0 && count > 10 {
        (df / (n - 1.0)).sqrt()
    } else {
        0.0
    };
    Estimate { value: f, err }
}

fn covariance(a: f64, b: f64, ab: f64, count: usize) -> f64 {
    if count < 10 {
        return 0.0;
    }
    let n = count as f64;
    (ab / n - (a / n) * (b / n)) / (n - 1.0)
}

/// Linear interpolation between sorted values, as llama-perplexity's `percentile`.
fn percentile(v: &[f32], fraction: f32) -> f64 {
    if fraction <= 0.0 {
        return v[0] as f64;
    }
    if fraction >= 1.0 {
        return v[v.len() - 1] as f64;
    }
    let p = fraction * (v.len() - 1) as f32;
    let ip = p as usize;
    let p = p - ip as f32;
    ((1.0 - p) * v[ip] + p * v[(ip + 1).min(v.len() - 1)]) as f64
}

fn median(v: &[f32]) -> f64 {
    let n = v.len();
    if n.is_multiple_of(2) {
        (0.5 * (v[n / 2] + v[n / 2 - 1])) as f64
    } else {
        v[n / 2] as f64
    }
}

impl KldStats {
    /// Adds one scored token: the model's logits row, the base row, the correct token.
    pub(crate) fn add(&mut self, logits: &[f32], base: &[u16], tok: u32) {
        let (mut max, mut imax) = (logits[0], 0usize);
        for (i, &v) in logits.iter().enumerate().skip(1) {
            if v > max {
                max = v;
                imax = i;
            }
        }
        let sum_exp: f64 = logits.iter().map(|&v| (v - max).exp() as f64).sum();
        let log_sum_exp = sum_exp.ln() as f32;
        let (scale, min_log_prob) = row_header(base);
        let q = &base[4..4 + logits.len()];
        let nll = max + log_sum_exp - logits[tok as usize];
        let nll_base = -(scale * q[tok as usize] as f32 + min_log_prob);
        self.sum_nll += nll as f64;
        self.sum_nll2 += (nll * nll) as f64;
        self.sum_nll_base += nll_base as f64;
        self.sum_nll_base2 += (nll_base * nll_base) as f64;
        self.sum_nll_nll_base += (nll * nll_base) as f64;
        // KL(base || Q) = sum p_base (ln p_base - ln p_Q), over tokens the base gives
        // ln p > -16 (the rest were quantized to ~0).
        let log_norm = max + log_sum_exp;
        let mut kld = 0.0f64;
        let (mut imax_base, mut best) = (0usize, 0.0f32);
        for (i, (&qi, &l)) in q.iter().zip(logits).enumerate() {
            let lp_base = scale * qi as f32 + min_log_prob;
            if i == 0 || lp_base > best {
                best = lp_base;
                imax_base = i;
            }
            if lp_base > -16.0 {
                kld += (lp_base.exp() * (lp_base - l + log_norm)) as f64;
            }
        }
        self.sum_kld += kld;
        self.sum_kld2 += kld * kld;
        self.count += 1;
        self.n_same_top += (imax == imax_base) as usize;
        let p_diff = (-nll).exp() - (-nll_base).exp();
        let p2 = (p_diff * p_diff) as f64;
        self.sum_p_diff += p_diff as f64;
        self.sum_p_diff2 += p2;
        self.sum_p_diff4 += p2 * p2;
        self.klds.push(kld as f32);
        self.p_diffs.push(p_diff);
    }

    pub fn count(&self) -> usize {
        self.count
    }

    /// exp(mean NLL) of the model so far, with its error.
    pub fn ppl(&self) -> Estimate {
        let l = mean_and_err(self.sum_nll, self.sum_nll2, self.count);
        let v = l.value.exp();
        Estimate {
            value: v,
            err: v * l.err,
        }
    }

    /// Mean ln(PPL(Q)/PPL(base)) so far.
    pub fn ln_ppl_ratio(&self) -> Estimate {
        let a = mean_and_err(self.sum_nll, self.sum_nll2, self.count);
        let b = mean_and_err(self.sum_nll_base, self.sum_nll_base2, self.count);
        let cov = covariance(
            self.sum_nll,
            self.sum_nll_base,
            self.sum_nll_nll_base,
            self.count,
        );
        Estimate {
            value: a.value - b.value,
            err: (a.err * a.err + b.err * b.err - 2.0 * cov).max(0.0).sqrt(),
        }
    }

    pub fn kld(&self) -> Estimate {
        mean_and_err(self.sum_kld, self.sum_kld2, self.count)
    }

    /// RMS of p(Q) - p(base), as a fraction.
    pub fn p_diff_rms(&self) -> Estimate {
        let mse = mean_and_err(self.sum_p_diff2, self.sum_p_diff4, self.count);
        let v = mse.value.sqrt();
        Estimate {
            value: v,
            err: if v > 0.0 { 0.5 / v * mse.err } else { 0.0 },
        }
    }

    pub fn same_top(&self) -> Estimate {
        let n = self.count as f64;
        let p = self.n_same_top as f64 / n;
        Estimate {
            value: p,
            err: if self.count > 1 {
                (p * (1.0 - p) / (n - 1.0)).sqrt()
            } else {
                0.0
            },
        }
    }

    pub(crate) fn summary(mut self) -> KldSummary {
        self.klds.sort_by(f32::total_cmp);
        self.p_diffs.sort_by(f32::total_cmp);
        let n = self.count;
        let ppl = self.ppl();
        let lb = mean_and_err(self.sum_nll_base, self.sum_nll_base2, n);
        let la = mean_and_err(self.sum_nll, self.sum_nll2, n);
        let ppl_base = Estimate {
            value: lb.value.exp(),
            err: lb.value.exp() * lb.err,
        };
        let cov = covariance(self.sum_nll, self.sum_nll_base, self.sum_nll_nll_base, n);
        let ratio = self.ln_ppl_ratio();
        let ppl_cov = ppl.value * ppl_base.value * cov;
        let pct = |v: &[f32], with_quartiles: bool| {
            let mut out = vec![("Maximum", v[v.len() - 1] as f64)];
            let mut fr = vec![
                ("99.9%", 0.999f32),
                ("99.0%", 0.99),
                ("95.0%", 0.95),
                ("90.0%", 0.9),
            ];
            if with_quartiles {
                fr.push(("75.0%", 0.75));
            }
            out.extend(fr.into_iter().map(|(l, f)| (l, percentile(v, f))));
            out.push(("Median", median(v)));
            let mut lo = vec![];
            if with_quartiles {
                lo.push(("25.0%", 0.25f32));
            }
            lo.extend([
                ("10.0%", 0.1f32),
                ("5.0%", 0.05),
                ("1.0%", 0.01),
                ("0.1%", 0.001),
            ]);
            out.extend(lo.into_iter().map(|(l, f)| (l, percentile(v, f))));
            out.push(("Minimum", v[0] as f64));
            out
        };
        KldSummary {
            count: n,
            ppl,
            ppl_base,
            ln_ppl_correlation: cov / (la.err * lb.err),
            ln_ppl_ratio: ratio,
            ppl_ratio: Estimate {
                value: ratio.value.exp(),
                err: ratio.value.exp() * ratio.err,
            },
            ppl_diff: Estimate {
                value: ppl.value - ppl_base.value,
                err: (ppl.err * ppl.err + ppl_base.err * ppl_base.err - 2.0 * ppl_cov)
                    .max(0.0)
                    .sqrt(),
            },
            kld: self.kld(),
            kld_percentiles: if n > 0 {
                pct(&self.klds, false)
            } else {
                vec![]
            },
            p_diff: mean_and_err(self.sum_p_diff, self.sum_p_diff2, n),
            p_diff_rms: self.p_diff_rms(),
            p_diff_percentiles: if n > 0 {
                pct(&self.p_diffs, true)
            } else {
                vec![]
            },
            same_top: self.same_top(),
        }
    }
}
