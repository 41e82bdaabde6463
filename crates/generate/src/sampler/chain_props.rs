//! Issue 37 (1): the stages composed. Random logits × random stage orders (`--samplers`,
//! repeats allowed) × random parameters: the set the chain would draw from and its
//! probabilities against a plain reference of every stage llama.cpp defines, written here
//! for clarity and not for speed (every stage that reads an order sorts its own copy).
//!
//! The reference follows llama.cpp's semantics, not minfer's arrangement of them: the
//! temperature stage divides the logits (minfer carries it as a factor), penalties and DRY
//! act on the logits as they stand at their place (scaled, when a temperature ran before),
//! top-p / min-p / typical-p / XTC read softmax of the current logits, top-n-σ reads the
//! current logits, XTC flips its coin (from the sampler's own stream) only when it is on
//! and at least two candidates are left. At temperature 0 (a fifth of the cases) the pick is
//! the best token left where the first temperature stage stands (llama.cpp's temperature
//! ≤ 0 keeps only it), XTC skipped (minfer keeps a greedy pick deterministic; llama.cpp
//! would run it). Cases whose outcome hangs on a comparison closer
//! than [`MARGIN`] (f32 in the chain, f64 here) are skipped and counted.
//!
//! Controls: planted bugs in the chain that leave a stage's candidates in the wrong state
//! for the next one (typical-p's list marked sorted, a stage's temperature dropped), run by
//! hand and in `scripts/mutants`; docs/PRECISION.md records them.

use super::*;

/// Comparisons this close are too near to call between f32 and f64 arithmetic.
const MARGIN: f64 = 1e-5;
/// Probabilities compared to this.
const PROB_TOL: f64 = 1e-5;
const CASES: usize = 20000;

/// The breaker character: tokens spelled with it are sequence breakers.
const BREAKER: u8 = b'z';

/// Token spellings: one letter each, `z` for every id ≡ 7 (mod 11).
fn letter(id: u32) -> Vec<u8> {
    if id % 11 == 7 {
        vec![BREAKER]
    } else {
        vec![b'a' + (id % 25) as u8]
    }
}

/// One reference candidate: id and its logit as llama.cpp would hold it (f64 here).
#[derive(Clone, Copy, Debug)]
struct Ref {
    id: u32,
    logit: f64,
}

struct Reference<'a> {
    cfg: &'a SamplerConfig,
    rng: Rng,
    /// The smallest distance seen at any decision (see [`MARGIN`]).
    margin: f64,
}

fn sort_by_logit(c: &mut [Ref]) {
    c.sort_by(|a, b| b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id)));
}

fn probs(c: &[Ref]) -> Vec<f64> {
    let max = c.iter().map(|r| r.logit).fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = c.iter().map(|r| (r.logit - max).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|x| x / s).collect()
}

impl Reference<'_> {
    fn near(&mut self, a: f64, b: f64) {
        self.margin = self.margin.min((a - b).abs());
    }

    fn penalties(&mut self, c: &mut [Ref], history: &[u32]) {
        let cfg = self.cfg;
        let n = cfg.repeat_last_n.min(history.len());
        let window = &history[history.len() - n..];
        for r in c.iter_mut() {
            let count = window.iter().filter(|&&t| t == r.id).count();
            if count == 0 {
                continue;
            }
            let rp = cfg.repeat_penalty as f64;
            let l = if r.logit > 0.0 {
                r.logit / rp
            } else {
                r.logit * rp
            };
            r.logit = l - count as f64 * cfg.frequency_penalty as f64 - cfg.presence_penalty as f64;
        }
    }

    /// DRY by brute force: for each earlier position j, the longest run of tokens ending
    /// just before j that equals the run ending the window, cut at the newest breaker; the
    /// token at j is penalised by multiplier · base^(run − allowed) for its longest run.
    fn dry(&mut self, c: &mut [Ref], history: &[u32]) {
        let cfg = self.cfg;
        if cfg.dry_multiplier == 0.0 || cfg.dry_base < 1.0 || cfg.dry_penalty_last_n == 0 {
            return;
        }
        let n = if cfg.dry_penalty_last_n < 0 {
            history.len()
        } else {
            (cfg.dry_penalty_last_n as usize).min(history.len())
        };
        let w = &history[history.len() - n..];
        let is_breaker = |id: u32| {
            cfg.dry_sequence_breakers
                .iter()
                .any(|b| !b.is_empty() && letter(id) == b.as_bytes())
        };
        // Tokens after the newest breaker in the window.
        let limit = match w.iter().rposition(|&t| is_breaker(t)) {
            Some(p) => n - 1 - p,
            None => n,
        };
        let mut longest: HashMap<u32, usize> = HashMap::new();
        for j in 1..n {
            let mut run = 0;
            while run < j && w[j - 1 - run] == w[n - 1 - run] {
                run += 1;
            }
            let run = run.min(limit);
            if run >= cfg.dry_allowed_length {
                let e = longest.entry(w[j]).or_default();
                *e = (*e).max(run);
            }
        }
        for r in c.iter_mut() {
            if let Some(&run) = longest.get(&r.id) {
                if is_breaker(r.id) {
                    continue;
                }
                let exp = (run - cfg.dry_allowed_length) as i32;
                r.logit -= cfg.dry_multiplier as f64 * (cfg.dry_base as f64).powi(exp);
            }
        }
    }

    fn top_k(&mut self, c: &mut Vec<Ref>) {
        let k = self.cfg.top_k;
        if k <= 0 || k as usize >= c.len() {
            return;
        }
        sort_by_logit(c);
        let (a, b) = (c[k as usize - 1].logit, c[k as usize].logit);
        self.near(a, b);
        c.truncate(k as usize);
    }

    fn top_p(&mut self, c: &mut Vec<Ref>) {
        let p = self.cfg.top_p as f64;
        if p >= 1.0 {
            return;
        }
        sort_by_logit(c);
        let pr = probs(c);
        let mut cum = 0.0;
        for (i, q) in pr.iter().enumerate() {
            cum += q;
            self.near(cum, p);
            if cum >= p {
                c.truncate(i + 1);
                return;
            }
        }
    }

    fn min_p(&mut self, c: &mut Vec<Ref>) {
        let m = self.cfg.min_p as f64;
        if m <= 0.0 {
            return;
        }
        let pr = probs(c);
        let pmax = pr.iter().cloned().fold(0.0, f64::max);
        let mut keep = Vec::new();
        for (r, q) in c.iter().zip(&pr) {
            self.near((q / pmax).ln(), m.ln());
            if *q >= m * pmax {
                keep.push(*r);
            }
        }
        *c = keep;
    }

    fn typical(&mut self, c: &mut Vec<Ref>) {
        let tau = self.cfg.typical_p as f64;
        if tau >= 1.0 {
            return;
        }
        sort_by_logit(c);
        let pr = probs(c);
        let h: f64 = pr.iter().filter(|&&q| q > 0.0).map(|&q| -q * q.ln()).sum();
        let score: Vec<f64> = pr.iter().map(|&q| (-q.ln() - h).abs()).collect();
        let mut idx: Vec<usize> = (0..c.len()).collect();
        idx.sort_by(|&a, &b| score[a].total_cmp(&score[b]).then(a.cmp(&b)));
        let mut cum = 0.0;
        let mut keep = idx.len();
        for (i, &k) in idx.iter().enumerate() {
            cum += pr[k];
            self.near(cum, tau);
            if cum > tau {
                keep = i + 1;
                break;
            }
        }
        if keep < idx.len() {
            self.near(score[idx[keep - 1]], score[idx[keep]]);
        }
        *c = idx[..keep].iter().map(|&k| c[k]).collect();
    }

    fn top_n_sigma(&mut self, c: &mut Vec<Ref>) {
        let n = self.cfg.top_n_sigma as f64;
        if n <= 0.0 || c.len() <= 1 {
            return;
        }
        let cnt = c.len() as f64;
        let max = c.iter().map(|r| r.logit).fold(f64::NEG_INFINITY, f64::max);
        let mean = c.iter().map(|r| r.logit).sum::<f64>() / cnt;
        let sd = (c.iter().map(|r| (r.logit - mean).powi(2)).sum::<f64>() / cnt).sqrt();
        let floor = max - n * sd;
        for r in c.iter() {
            self.near(r.logit, floor);
        }
        c.retain(|r| r.logit >= floor);
    }

    fn xtc(&mut self, c: &mut Vec<Ref>) {
        let cfg = self.cfg;
        if cfg.temperature <= 0.0
            || cfg.xtc_probability <= 0.0
            || cfg.xtc_threshold > 0.5
            || c.len() < 2
        {
            return;
        }
        if self.rng.next_f64() > cfg.xtc_probability as f64 {
            return;
        }
        sort_by_logit(c);
        let pr = probs(c);
        let th = cfg.xtc_threshold as f64;
        for &q in &pr {
            self.near(q, th);
        }
        let above = pr.iter().filter(|&&q| q >= th).count();
        if above >= 2 {
            c.drain(..above - 1);
        }
    }

    /// The candidates left, with their logits as llama.cpp holds them at the draw.
    fn run(&mut self, logits: &[f32], history: &[u32]) -> Vec<Ref> {
        let cfg = self.cfg;
        let mut l: Vec<f64> = logits.iter().map(|&x| x as f64).collect();
        for &(id, b) in &cfg.logit_bias {
            l[id as usize] += b as f64;
        }
        let mut c: Vec<Ref> = l
            .iter()
            .enumerate()
            .filter(|(_, x)| x.is_finite())
            .map(|(i, &logit)| Ref {
                id: i as u32,
                logit,
            })
            .collect();
        for &stage in &cfg.samplers {
            match stage {
                Stage::Penalties => self.penalties(&mut c, history),
                Stage::Dry => self.dry(&mut c, history),
                Stage::TopNSigma => self.top_n_sigma(&mut c),
                Stage::TopK => self.top_k(&mut c),
                Stage::TypicalP => self.typical(&mut c),
                Stage::TopP => self.top_p(&mut c),
                Stage::MinP => self.min_p(&mut c),
                Stage::Xtc => self.xtc(&mut c),
                Stage::Temperature if cfg.temperature <= 0.0 => break,
                Stage::Temperature => {
                    let t = cfg.temperature as f64;
                    c.iter_mut().for_each(|r| r.logit /= t);
                }
            }
        }
        c
    }
}

fn pick<T: Copy>(rng: &mut Rng, v: &[T]) -> T {
    v[(rng.next_u64() % v.len() as u64) as usize]
}

fn uniform(rng: &mut Rng, lo: f64, hi: f64) -> f32 {
    (lo + (hi - lo) * rng.next_f64()) as f32
}

/// Off half the time, else uniform in [lo, hi].
fn maybe(rng: &mut Rng, off: f32, lo: f64, hi: f64) -> f32 {
    if rng.next_u64().is_multiple_of(2) {
        off
    } else {
        uniform(rng, lo, hi)
    }
}

/// One random case: the config (order included), logits and history.
fn case(seed: u64) -> (SamplerConfig, Vec<f32>, Vec<u32>) {
    let mut r = Rng::new(seed);
    let vocab = 2 + (r.next_u64() % 63) as usize;
    let logits: Vec<f32> = (0..vocab).map(|_| uniform(&mut r, -6.0, 6.0)).collect();
    // Repeats come from a small alphabet, so penalties and DRY find some.
    let alphabet = 2 + (r.next_u64() % 6) as u32;
    let hist_len = (r.next_u64() % 40) as usize;
    let history: Vec<u32> = (0..hist_len)
        .map(|_| (r.next_u64() % alphabet as u64) as u32 % vocab as u32)
        .collect();
    let mut logit_bias = Vec::new();
    for _ in 0..r.next_u64() % 3 {
        let id = (r.next_u64() % vocab as u64) as u32;
        let b = if r.next_u64().is_multiple_of(4) {
            f32::NEG_INFINITY
        } else {
            uniform(&mut r, -3.0, 3.0)
        };
        logit_bias.push((id, b));
    }
    let all = DEFAULT_ORDER;
    let len = 1 + (r.next_u64() % 10) as usize;
    let samplers: Vec<Stage> = (0..len).map(|_| pick(&mut r, &all)).collect();
    let cfg = SamplerConfig {
        temperature: if r.next_u64().is_multiple_of(5) {
            0.0
        } else {
            uniform(&mut r, 0.2, 3.0)
        },
        top_k: if r.next_u64().is_multiple_of(2) {
            0
        } else {
            1 + (r.next_u64() % (vocab as u64 + 4)) as i32
        },
        top_p: maybe(&mut r, 1.0, 0.05, 0.99),
        min_p: maybe(&mut r, 0.0, 0.01, 0.6),
        repeat_last_n: (r.next_u64() % 48) as usize,
        repeat_penalty: maybe(&mut r, 1.0, 0.5, 2.0),
        frequency_penalty: maybe(&mut r, 0.0, -0.5, 1.5),
        presence_penalty: maybe(&mut r, 0.0, -0.5, 1.5),
        logit_bias,
        seed: r.next_u64(),
        dry_multiplier: maybe(&mut r, 0.0, 0.1, 2.0),
        dry_base: uniform(&mut r, 0.9, 3.0),
        dry_allowed_length: (r.next_u64() % 4) as usize,
        dry_penalty_last_n: pick(&mut r, &[-1, 0, 5, 16, 40]),
        dry_sequence_breakers: if r.next_u64().is_multiple_of(2) {
            vec!["z".into()]
        } else {
            vec![]
        },
        xtc_probability: pick(&mut r, &[0.0, 1.0, 0.5]),
        xtc_threshold: uniform(&mut r, 0.0, 0.6),
        typical_p: maybe(&mut r, 1.0, 0.05, 0.99),
        top_n_sigma: maybe(&mut r, -1.0, 0.2, 3.0),
        samplers,
        ..SamplerConfig::default()
    };
    (cfg, logits, history)
}

/// The greedy pick of a reference list: the best logit, the lowest id on a tie.
fn best(reference: &mut Reference, c: &[Ref]) -> u32 {
    let mut s = c.to_vec();
    sort_by_logit(&mut s);
    if s.len() > 1 {
        reference.near(s[0].logit, s[1].logit);
    }
    s[0].id
}

/// Runs every case; returns (checked, skipped, greedy ones among the checked, the first
/// failure).
fn run_cases() -> (usize, usize, usize, Option<String>) {
    let (mut checked, mut skipped, mut greedy_cases) = (0, 0, 0);
    for seed in 0..CASES as u64 {
        let (cfg, logits, history) = case(seed);
        if logits.iter().enumerate().all(|(i, _)| {
            cfg.logit_bias
                .iter()
                .any(|&(id, b)| id as usize == i && b.is_infinite())
        }) {
            continue;
        }
        let mut reference = Reference {
            cfg: &cfg,
            rng: Rng::new(cfg.seed),
            margin: f64::INFINITY,
        };
        let want = reference.run(&logits, &history);
        let pick = (cfg.temperature <= 0.0).then(|| best(&mut reference, &want));
        if reference.margin < MARGIN {
            skipped += 1;
            continue;
        }
        let mut s = Sampler::new(cfg.clone()).unwrap();
        let dist = s
            .distribution(&mut logits.clone(), &history, &letter)
            .unwrap();
        let order: String = cfg.samplers.iter().map(|s| s.letter()).collect();
        let fail = |why: String| {
            format!("case {seed}, order {order}: {why}\nlogits {logits:?}\nhistory {history:?}\n{cfg:?}")
        };
        let got = match (dist, pick) {
            (Pick::Token(id), Some(want_id)) => {
                checked += 1;
                greedy_cases += 1;
                if id != want_id {
                    let why = format!("greedy pick {id}, reference {want_id}");
                    return (checked, skipped, greedy_cases, Some(fail(why)));
                }
                continue;
            }
            (Pick::Draw(t), None) => {
                let p = stages::softmax(&s.cands, t);
                s.cands.iter().map(|c| c.id).zip(p).collect::<Vec<_>>()
            }
            _ => unreachable!("a draw exactly when the temperature is positive"),
        };
        let mut got: Vec<(u32, f64)> = got;
        got.sort_by_key(|x| x.0);
        let mut want: Vec<(u32, f64)> = want
            .iter()
            .map(|r| r.id)
            .zip(probs(&want))
            .collect::<Vec<_>>();
        want.sort_by_key(|x| x.0);
        checked += 1;
        let ids = |v: &[(u32, f64)]| v.iter().map(|x| x.0).collect::<Vec<_>>();
        let why = if ids(&got) != ids(&want) {
            Some(format!("kept {:?}, reference {:?}", ids(&got), ids(&want)))
        } else {
            got.iter()
                .zip(&want)
                .find(|(g, w)| (g.1 - w.1).abs() > PROB_TOL)
                .map(|(g, w)| format!("token {}: p {} vs reference {}", g.0, g.1, w.1))
        };
        if let Some(why) = why {
            return (checked, skipped, greedy_cases, Some(fail(why)));
        }
    }
    (checked, skipped, greedy_cases, None)
}

#[test]
fn the_chain_in_any_order_keeps_what_the_reference_keeps() {
    let (checked, skipped, greedy_cases, fail) = run_cases();
    println!(
        "chain props: {checked} cases checked ({greedy_cases} greedy), {skipped} skipped (within {MARGIN})"
    );
    if let Some(f) = fail {
        panic!("{f}");
    }
    assert!(
        checked > CASES * 9 / 10,
        "{checked} checked, {skipped} skipped"
    );
    assert!(greedy_cases > CASES / 10, "{greedy_cases} greedy cases");
}
