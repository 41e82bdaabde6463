//! The chain against references written from each method's definition (the paper or
//! llama.cpp's formula) on fixed logits, and every new stage a no-op at its default.

use super::*;

fn no_bytes(_: u32) -> Vec<u8> {
    Vec::new()
}

fn cfg() -> SamplerConfig {
    SamplerConfig {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        ..SamplerConfig::default()
    }
}

fn sample(s: &mut Sampler, logits: &[f32], history: &[u32]) -> u32 {
    s.sample(&mut logits.to_vec(), history, &no_bytes).unwrap()
}

/// The ids the chain would draw from, ascending.
fn kept(s: &mut Sampler, logits: &[f32]) -> Vec<u32> {
    match s
        .distribution(&mut logits.to_vec(), &[], &no_bytes)
        .unwrap()
    {
        Pick::Token(id) => vec![id],
        Pick::Draw(_) => {
            let mut ids: Vec<u32> = s.cands.iter().map(|c| c.id).collect();
            ids.sort_unstable();
            ids
        }
    }
}

fn probs_of(logits: &[f64]) -> Vec<f64> {
    let m = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = logits.iter().map(|l| (l - m).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|x| x / s).collect()
}

fn penalties(c: &SamplerConfig, l: &mut [f32], history: &[u32]) {
    for (&id, &n) in &penalty_counts(c, history) {
        l[id as usize] = penalize(c, l[id as usize], n, 1.0);
    }
}

/// The chain as it was before the configurable order (bias → penalties → greedy → top-k →
/// top-p → min-p → temperature → draw), kept as the reference the default chain must equal
/// bit for bit.
fn first_chain(cfg: &SamplerConfig, rng: &mut Rng, logits: &mut [f32], history: &[u32]) -> u32 {
    for &(id, b) in &cfg.logit_bias {
        logits[id as usize] += b;
    }
    penalties(cfg, logits, history);
    if cfg.temperature <= 0.0 {
        return greedy(logits).unwrap();
    }
    let mut c: Vec<Candidate> = logits
        .iter()
        .enumerate()
        .filter(|(_, l)| !l.is_nan() && **l > f32::NEG_INFINITY)
        .map(|(i, &logit)| Candidate {
            id: i as u32,
            logit,
        })
        .collect();
    let k = cfg.top_k;
    if k > 0 && (k as usize) < c.len() {
        c.select_nth_unstable_by(k as usize - 1, by_logit);
        c.truncate(k as usize);
    }
    c.sort_unstable_by(by_logit);
    if cfg.top_p < 1.0 {
        let p = softmax(&c, 1.0);
        let mut cum = 0.0f64;
        let mut keep = p.len();
        for (i, q) in p.iter().enumerate() {
            cum += q;
            if cum >= cfg.top_p as f64 {
                keep = i + 1;
                break;
            }
        }
        c.truncate(keep.max(1));
    }
    if cfg.min_p > 0.0 {
        let floor = c[0].logit + cfg.min_p.ln();
        let keep = c.iter().take_while(|x| x.logit >= floor).count();
        c.truncate(keep.max(1));
    }
    let p = softmax(&c, cfg.temperature);
    let r = rng.next_f64();
    let mut cum = 0.0;
    for (x, q) in c.iter().zip(&p) {
        cum += q;
        if r < cum {
            return x.id;
        }
    }
    c[c.len() - 1].id
}

fn random_logits(seed: u64, n: usize) -> Vec<f32> {
    let mut r = Rng::new(seed);
    (0..n).map(|_| (r.next_f64() * 12.0 - 6.0) as f32).collect()
}

#[test]
fn default_chain_is_bit_for_bit_the_first_chain() {
    // Every knob added later at its off value, in several spellings of "off".
    let offs = [
        SamplerConfig::default(),
        SamplerConfig {
            dry_multiplier: 0.0,
            dry_base: 3.0,
            dry_allowed_length: 1,
            ..SamplerConfig::default()
        },
        SamplerConfig {
            dry_multiplier: 2.0,
            dry_penalty_last_n: 0,
            ..SamplerConfig::default()
        },
        SamplerConfig {
            xtc_probability: 1.0,
            xtc_threshold: 0.6,
            ..SamplerConfig::default()
        },
        SamplerConfig {
            typical_p: 1.0,
            top_n_sigma: 0.0,
            mirostat_tau: 3.0,
            ..SamplerConfig::default()
        },
    ];
    for (n, base) in offs.iter().enumerate() {
        for seed in 0..8u64 {
            let c = SamplerConfig {
                seed,
                repeat_penalty: 1.3,
                frequency_penalty: 0.2,
                logit_bias: vec![(3, 2.0)],
                ..base.clone()
            };
            let mut s = Sampler::new(c.clone()).unwrap();
            let mut rng = Rng::new(seed);
            let mut history = vec![1u32, 2, 3, 2];
            for step in 0..40 {
                let l = random_logits(seed * 100 + step, 300);
                let want = first_chain(&c, &mut rng, &mut l.clone(), &history);
                let got = sample(&mut s, &l, &history);
                assert_eq!(got, want, "config {n} seed {seed} step {step}");
                history.push(got);
            }
        }
    }
}

#[test]
fn greedy_picks_argmax_and_lowest_id_on_tie() {
    let mut s = Sampler::new(SamplerConfig {
        temperature: 0.0,
        ..cfg()
    })
    .unwrap();
    assert_eq!(sample(&mut s, &[1.0, 3.0, 3.0, -1.0], &[]), 1);
}

#[test]
fn penalties_follow_llama_cpp_semantics() {
    // Token 0 seen twice (positive logit divided), token 1 once (negative multiplied).
    let c = SamplerConfig {
        repeat_penalty: 2.0,
        frequency_penalty: 0.5,
        presence_penalty: 0.25,
        ..cfg()
    };
    let mut l = [4.0f32, -1.0, 7.0];
    penalties(&c, &mut l, &[0, 1, 0]);
    assert_eq!(l, [4.0 / 2.0 - 2.0 * 0.5 - 0.25, -2.0 - 0.5 - 0.25, 7.0]);
    let c = SamplerConfig {
        repeat_last_n: 1,
        repeat_penalty: 2.0,
        ..cfg()
    };
    let mut l = [4.0f32, 4.0];
    penalties(&c, &mut l, &[0, 1]);
    assert_eq!(l, [4.0, 2.0]);
}

#[test]
fn top_k_top_p_min_p_keep_what_their_definitions_say() {
    let l = [2.0f32, 1.0, 0.0];
    let mut s = Sampler::new(SamplerConfig { top_k: 1, ..cfg() }).unwrap();
    assert_eq!(kept(&mut s, &l), [0]);
    // probs 0.665, 0.245, 0.090: top_p 0.7 keeps two, 0.6 keeps one.
    let mut s = Sampler::new(SamplerConfig {
        top_p: 0.7,
        ..cfg()
    })
    .unwrap();
    assert_eq!(kept(&mut s, &l), [0, 1]);
    let mut s = Sampler::new(SamplerConfig {
        top_p: 0.6,
        ..cfg()
    })
    .unwrap();
    assert_eq!(kept(&mut s, &l), [0]);
    // p1/p0 = e^-1 ≈ 0.37, p2/p0 = e^-2 ≈ 0.14: min_p 0.2 keeps {0, 1}.
    let mut s = Sampler::new(SamplerConfig {
        min_p: 0.2,
        ..cfg()
    })
    .unwrap();
    assert_eq!(kept(&mut s, &l), [0, 1]);
}

#[test]
fn typical_p_matches_its_definition() {
    // Meister et al.: H = −Σ p ln p; rank by |−ln p − H|; smallest prefix with mass > τ.
    let l = [3.0f64, 2.5, 1.0, 0.5, 0.0, -2.0];
    let p = probs_of(&l);
    let h: f64 = p.iter().map(|q| -q * q.ln()).sum();
    let mut idx: Vec<usize> = (0..p.len()).collect();
    idx.sort_by(|&a, &b| ((-p[a].ln() - h).abs()).total_cmp(&(-p[b].ln() - h).abs()));
    for tau in [0.2f32, 0.5, 0.8, 0.95] {
        let mut cum = 0.0;
        let mut want = Vec::new();
        for &i in &idx {
            want.push(i as u32);
            cum += p[i];
            if cum > tau as f64 {
                break;
            }
        }
        want.sort_unstable();
        let lf: Vec<f32> = l.iter().map(|&x| x as f32).collect();
        let mut s = Sampler::new(SamplerConfig {
            typical_p: tau,
            ..cfg()
        })
        .unwrap();
        assert_eq!(kept(&mut s, &lf), want, "tau {tau}");
    }
}

#[test]
fn top_n_sigma_matches_its_definition() {
    // logits 4, 3, 1, 0, -1, -7: mean 0, σ = sqrt(76/6) ≈ 3.559; n = 1 → floor ≈ 0.441.
    let l = [4.0f32, 3.0, 1.0, 0.0, -1.0, -7.0];
    let mean = 0.0f64;
    let sd = (l.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / 6.0).sqrt();
    for n in [0.5f32, 1.0, 2.0] {
        let floor = 4.0 - n as f64 * sd;
        let want: Vec<u32> = (0..6)
            .filter(|&i| l[i] as f64 >= floor)
            .map(|i| i as u32)
            .collect();
        let mut s = Sampler::new(SamplerConfig {
            top_n_sigma: n,
            ..cfg()
        })
        .unwrap();
        assert_eq!(kept(&mut s, &l), want, "n {n}");
    }
    assert_eq!(
        kept(
            &mut Sampler::new(SamplerConfig {
                top_n_sigma: 1.0,
                ..cfg()
            })
            .unwrap(),
            &l
        ),
        [0, 1, 2]
    );
}

#[test]
fn xtc_removes_all_top_choices_but_the_least_likely() {
    // probs ∝ 5, 3, 1.5, 0.5 (0.5, 0.3, 0.15, 0.05): threshold 0.1 → three are "top";
    // the first two go, 0.15 and 0.05 stay.
    let l: Vec<f32> = [5.0f32, 3.0, 1.5, 0.5].iter().map(|x| x.ln()).collect();
    let mut s = Sampler::new(SamplerConfig {
        xtc_probability: 1.0,
        xtc_threshold: 0.1,
        ..cfg()
    })
    .unwrap();
    assert_eq!(kept(&mut s, &l), [2, 3]);
    // One token above the threshold: nothing is removed.
    let mut s = Sampler::new(SamplerConfig {
        xtc_probability: 1.0,
        xtc_threshold: 0.4,
        ..cfg()
    })
    .unwrap();
    assert_eq!(kept(&mut s, &l), [0, 1, 2, 3]);
    // Probability 0.5: removed in about half the steps.
    let mut s = Sampler::new(SamplerConfig {
        xtc_probability: 0.5,
        xtc_threshold: 0.1,
        ..cfg()
    })
    .unwrap();
    let cut = (0..2000).filter(|_| kept(&mut s, &l) == [2, 3]).count();
    assert!((850..1150).contains(&cut), "{cut}");
}

#[test]
fn mirostat_v2_truncates_at_mu_and_moves_mu_toward_tau() {
    // probs 0.5, 0.25, 0.125, 0.125 → surprises 1, 2, 3, 3 bits. τ = 1: μ = 2 keeps two.
    let l: Vec<f32> = [4.0f32, 2.0, 1.0, 1.0].iter().map(|x| x.ln()).collect();
    let c = SamplerConfig {
        mirostat: Mirostat::V2,
        mirostat_tau: 1.0,
        mirostat_eta: 0.5,
        ..cfg()
    };
    let mut s = Sampler::new(c.clone()).unwrap();
    assert_eq!(kept(&mut s, &l), [0, 1]);
    let mut s = Sampler::new(c).unwrap();
    let id = sample(&mut s, &l, &[]);
    // Renormalised over the two kept: 2/3 and 1/3.
    let p = if id == 0 { 2.0f64 / 3.0 } else { 1.0 / 3.0 };
    let want_mu = 2.0 - 0.5 * (-(p.log2()) - 1.0);
    assert!(
        (s.mu as f64 - want_mu).abs() < 1e-6,
        "{} vs {want_mu}",
        s.mu
    );
}

#[test]
fn mirostat_v1_keeps_the_zipf_estimated_top_k() {
    // A Zipf distribution p_i ∝ 1/(i+1)^s over N tokens gives ŝ = s exactly; then
    // k = (ε·2^μ / (1 − N^−ε))^(1/s), ε = s − 1 (Basu et al., eq. 11 and alg. 1).
    let s_true = 1.5f64;
    let n = 500usize;
    let l: Vec<f32> = (0..n)
        .map(|i| (-s_true * ((i + 1) as f64).ln()) as f32)
        .collect();
    for tau in [2.0f32, 3.0, 4.0] {
        let mu = 2.0 * tau as f64;
        let eps = s_true - 1.0;
        let k = ((eps * 2f64.powf(mu)) / (1.0 - (n as f64).powf(-eps))).powf(1.0 / s_true);
        let want = (k as usize).max(1);
        let mut s = Sampler::new(SamplerConfig {
            mirostat: Mirostat::V1,
            mirostat_tau: tau,
            ..cfg()
        })
        .unwrap();
        assert_eq!(kept(&mut s, &l).len(), want, "tau {tau} (k = {k})");
    }
}

#[test]
fn dry_in_the_chain_subtracts_its_penalty() {
    // History "a b c a b": continuing with c extends a repeat of length 2 (allowed 1):
    // penalty = 0.8 · 1.75^(2−1).
    let c = SamplerConfig {
        temperature: 0.0,
        dry_multiplier: 0.8,
        dry_base: 1.75,
        dry_allowed_length: 1,
        dry_sequence_breakers: vec![],
        ..cfg()
    };
    let mut s = Sampler::new(c).unwrap();
    let mut l = vec![0.0f32, 0.0, 1.0, 0.5];
    let id = s.sample(&mut l, &[0, 1, 2, 0, 1], &no_bytes).unwrap();
    assert!((l[2] - (1.0 - 0.8 * 1.75)).abs() < 1e-6);
    assert_eq!(id, 3);
}

#[test]
fn the_order_decides_what_a_stage_sees() {
    // probs at t = 1: 0.665, 0.245, 0.090. At t = 0.5 (∝ e^(2l)): 0.867, 0.117, 0.016.
    // top_p 0.8 before temperature keeps two, after it one.
    let l = [2.0f32, 1.0, 0.0];
    let base = SamplerConfig {
        temperature: 0.5,
        top_p: 0.8,
        ..cfg()
    };
    let mut s = Sampler::new(SamplerConfig {
        samplers: order::parse_names("top_p;temperature").unwrap(),
        ..base.clone()
    })
    .unwrap();
    assert_eq!(kept(&mut s, &l), [0, 1]);
    let mut s = Sampler::new(SamplerConfig {
        samplers: order::parse_letters("tp").unwrap(),
        ..base
    })
    .unwrap();
    assert_eq!(kept(&mut s, &l), [0]);
}

#[test]
fn draws_follow_the_distribution() {
    // Control: with probs 0.665/0.245/0.090, 20k draws land within 1.5% of each.
    let l = [2.0f32, 1.0, 0.0];
    let mut s = Sampler::new(cfg()).unwrap();
    let mut n = [0usize; 3];
    for _ in 0..20_000 {
        n[sample(&mut s, &l, &[]) as usize] += 1;
    }
    let want = probs_of(&[2.0, 1.0, 0.0]);
    for i in 0..3 {
        assert!((n[i] as f64 / 20_000.0 - want[i]).abs() < 0.015, "{n:?}");
    }
}

#[test]
fn same_seed_same_tokens() {
    let run = |seed| {
        let mut s = Sampler::new(SamplerConfig { seed, ..cfg() }).unwrap();
        (0..50)
            .map(|_| sample(&mut s, &[0.5, 0.4, 0.3, 0.2], &[]))
            .collect::<Vec<_>>()
    };
    assert_eq!(run(7), run(7));
    assert_ne!(run(7), run(8));
}

#[test]
fn logit_bias_bans_and_out_of_range_is_refused() {
    let mut s = Sampler::new(SamplerConfig {
        temperature: 0.0,
        logit_bias: vec![(2, f32::NEG_INFINITY)],
        ..cfg()
    })
    .unwrap();
    assert_eq!(sample(&mut s, &[0.0, 1.0, 9.0], &[]), 1);
    let mut s = Sampler::new(SamplerConfig {
        logit_bias: vec![(5, 1.0)],
        ..cfg()
    })
    .unwrap();
    assert_eq!(
        s.sample(&mut [0.0; 3], &[], &no_bytes),
        Err(SamplerError::BiasTokenOutOfRange { id: 5, vocab: 3 })
    );
}

#[test]
fn bad_settings_are_refused_by_name() {
    for (c, name) in [
        (
            SamplerConfig {
                top_p: 1.5,
                ..cfg()
            },
            "top_p",
        ),
        (
            SamplerConfig {
                repeat_penalty: 0.0,
                ..cfg()
            },
            "repeat_penalty",
        ),
        (
            SamplerConfig {
                xtc_probability: 2.0,
                ..cfg()
            },
            "xtc_probability",
        ),
        (
            SamplerConfig {
                typical_p: -0.1,
                ..cfg()
            },
            "typical_p",
        ),
        (
            SamplerConfig {
                dry_multiplier: -1.0,
                ..cfg()
            },
            "dry_multiplier",
        ),
        (
            SamplerConfig {
                dry_penalty_last_n: -2,
                ..cfg()
            },
            "dry_penalty_last_n",
        ),
        (
            SamplerConfig {
                mirostat_tau: f32::NAN,
                ..cfg()
            },
            "mirostat_tau",
        ),
    ] {
        let e = Sampler::new(c).unwrap_err();
        assert!(e.to_string().contains(name), "{e}");
    }
}
