//! `minfer bench`: prompt-processing (pp) and token-generation (tg) throughput, in the manner
//! of llama.cpp's `llama-bench` so rows can be set side by side (`scripts/peer-bench`).
//!
//! - pp N: one forward of N synthetic token ids (seeded, uniform over the vocabulary) from an
//!   empty KV, logits of the last row only.
//! - tg N: N single-token decodes from an empty KV (llama-bench's tg starts empty too).
//! - `-d D` (llama-bench's `--n-depth`): each run first prefills D synthetic tokens, untimed,
//!   and the test then runs from position D (attention over a long context); rows read
//!   `pp512 @ d2048`, `tg64 @ d2048`.
//! - Every repetition starts from a cleared KV of the same loaded model; an untimed warm-up
//!   run (the full pp, or one tg step, as llama-bench does) comes first.
//! - Reported: mean ± sample sd of the per-repetition tok/s, their median, and for tg the
//!   weight bytes streamed per second (every weight is read once per generated token).
//! - `--membw` measures this machine's copy and read bandwidth, the ceiling for tg.

mod membw;
mod report;
mod stats;
mod sysinfo;
mod target;

use anyhow::{bail, Context};
use clap::Args as ClapArgs;
use minfer_engine::fetch;
use std::time::Instant;

pub use report::Format;
use report::Row;

#[derive(ClapArgs, Debug)]
pub struct Args {
    /// A GGUF path or a known model name (pulled on first use), as for `minfer run`.
    #[arg(short = 'm', long = "model", default_value = super::args::DEFAULT_MODEL)]
    pub model: String,
    /// Prompt lengths for pp tests, comma-separated; 0 skips pp.
    #[arg(
        short = 'p',
        long = "n-prompt",
        value_delimiter = ',',
        default_value = "512"
    )]
    pub n_prompt: Vec<usize>,
    /// Generation lengths for tg tests, comma-separated; 0 skips tg.
    #[arg(
        short = 'n',
        long = "n-gen",
        value_delimiter = ',',
        default_value = "128"
    )]
    pub n_gen: Vec<usize>,
    /// Depths, comma-separated: tokens already in the KV cache when each timed run starts
    /// (prefilled untimed before every repetition, as llama-bench's -d does).
    #[arg(
        short = 'd',
        long = "n-depth",
        value_delimiter = ',',
        default_value = "0"
    )]
    pub n_depth: Vec<usize>,
    /// Timed repetitions per test.
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    pub reps: usize,
    /// CPU thread counts, comma-separated (0: the number of physical cores).
    #[arg(
        short = 't',
        long = "threads",
        value_delimiter = ',',
        default_value = "0"
    )]
    pub threads: Vec<usize>,
    /// Output format: md, csv or json.
    #[arg(short = 'o', long = "output", value_enum, default_value = "md")]
    pub output: Format,
    /// KV cache element type: f32, f16 or q8_0 (llama.cpp's default is f16).
    #[arg(long = "cache-type", default_value = "f16")]
    pub cache_type: String,
    /// Backends to use (default: every available one).
    #[arg(long = "backend", value_delimiter = ',')]
    pub backends: Vec<String>,
    /// CPU float arithmetic, as for `minfer run` (native, llamacpp-x86-avx2, llamacpp-x86-avx512).
    #[arg(long = "numerics", default_value = "native")]
    pub numerics: String,
    /// Seed of the synthetic token ids.
    #[arg(long, default_value_t = 1234)]
    pub seed: u64,
    /// Skip the untimed warm-up run.
    #[arg(long)]
    pub no_warmup: bool,
    /// Also measure memory bandwidth (copy and read, best of 5) with each thread count;
    /// with `-p 0 -n 0` only that (no model is loaded).
    #[arg(long)]
    pub membw: bool,
    /// Buffer size of the bandwidth test in MiB (two buffers are allocated for the copy).
    #[arg(long, default_value_t = 1024)]
    pub membw_mib: usize,
    /// Per-repetition progress on stderr.
    #[arg(long)]
    pub progress: bool,
}

/// A benchmark test: a prompt of n tokens or n generated tokens.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Test {
    Prompt(usize),
    Gen(usize),
}

impl Test {
    pub fn name(self) -> String {
        match self {
            Test::Prompt(n) => format!("pp{n}"),
            Test::Gen(n) => format!("tg{n}"),
        }
    }
    pub fn n_tokens(self) -> usize {
        match self {
            Test::Prompt(n) | Test::Gen(n) => n,
        }
    }
}

/// What the timing loop drives: the engine, or a stand-in in tests.
pub trait Target {
    fn kv_clear(&mut self);
    /// Appends `tokens` at `pos0..` and computes the logits of the last `n_out` rows.
    fn decode(&mut self, tokens: &[u32], pos0: usize, n_out: usize) -> anyhow::Result<()>;
}

/// Seeded token ids uniform over `0..vocab` (xorshift64*; the ids only need to be valid and
/// not all equal, so any decent generator will do).
pub fn synthetic_tokens(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            (s.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 32) as u32 % vocab.max(1) as u32
        })
        .collect()
}

/// One run from a cleared KV: the untimed `depth` prefill, then the timed test from position
/// `depth.len()`; returns the nanoseconds of the test alone.
fn run_once(
    target: &mut dyn Target,
    test: Test,
    tokens: &[u32],
    depth: &[u32],
) -> anyhow::Result<u64> {
    target.kv_clear();
    if !depth.is_empty() {
        target.decode(depth, 0, 1).context("depth prefill")?;
    }
    let pos0 = depth.len();
    let t0 = Instant::now();
    match test {
        Test::Prompt(_) => target.decode(tokens, pos0, 1)?,
        Test::Gen(_) => {
            for (i, &t) in tokens.iter().enumerate() {
                target.decode(&[t], pos0 + i, 1)?;
            }
        }
    }
    Ok(t0.elapsed().as_nanos() as u64)
}

/// Times `reps` runs of `test` after `depth` cached tokens; returns nanoseconds per run.
pub fn time_test(
    target: &mut dyn Target,
    test: Test,
    tokens: &[u32],
    depth: &[u32],
    reps: usize,
    warmup: bool,
    progress: &dyn Fn(usize),
) -> anyhow::Result<Vec<u64>> {
    if warmup {
        let warm = match test {
            Test::Prompt(_) => tokens,
            Test::Gen(_) => &tokens[..tokens.len().min(1)],
        };
        run_once(target, test, warm, depth).context("warm-up run")?;
    }
    let mut ns = Vec::with_capacity(reps);
    for rep in 0..reps {
        progress(rep);
        ns.push(run_once(target, test, tokens, depth)?);
    }
    target.kv_clear();
    Ok(ns)
}

fn tests_of(args: &Args) -> Vec<Test> {
    let mut v: Vec<Test> = args
        .n_prompt
        .iter()
        .filter(|&&n| n > 0)
        .map(|&n| Test::Prompt(n))
        .collect();
    v.extend(args.n_gen.iter().filter(|&&n| n > 0).map(|&n| Test::Gen(n)));
    v
}

/// llama-bench's test-name suffix for a depth: ` @ d2048` (none for 0).
pub fn depth_suffix(depth: usize) -> String {
    if depth == 0 {
        String::new()
    } else {
        format!(" @ d{depth}")
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if args.reps == 0 {
        bail!("--repetitions must be at least 1");
    }
    let sys = sysinfo::detect();
    let mut bws = Vec::new();
    if args.membw {
        for &t in &args.threads {
            let t = target::resolve_threads(t);
            bws.push(membw::measure(args.membw_mib << 20, t, 5));
        }
    }
    let mut rows = Vec::new();
    let mut facts = None;
    let tests = tests_of(&args);
    if tests.is_empty() && !args.membw {
        bail!("nothing to do: every -p and -n value is 0 and --membw is not given");
    }
    if !tests.is_empty() {
        let path = fetch::resolve_model(&args.model)?;
        let path = &path;
        let max_depth = args.n_depth.iter().copied().max().unwrap_or(0);
        let n_ctx = max_depth + tests.iter().map(|t| t.n_tokens()).max().unwrap_or(1);
        for &threads in &args.threads {
            let loaded = target::load(path, &args, threads, n_ctx)?;
            let f = facts.get_or_insert(loaded.facts.clone());
            let mut engine = loaded.target;
            for (&d, &test) in args
                .n_depth
                .iter()
                .flat_map(|d| tests.iter().map(move |t| (d, t)))
            {
                let tokens = synthetic_tokens(test.n_tokens(), f.vocab, args.seed);
                // A different seed, so the depth is not the test's own tokens repeated.
                let depth = synthetic_tokens(d, f.vocab, args.seed ^ 0xd3);
                let label = format!("{}{} t={}", test.name(), depth_suffix(d), loaded.threads);
                let show = |rep: usize| {
                    if args.progress {
                        eprintln!("minfer bench: {label} repetition {}/{}", rep + 1, args.reps);
                    }
                };
                let ns = time_test(
                    engine.as_mut(),
                    test,
                    &tokens,
                    &depth,
                    args.reps,
                    !args.no_warmup,
                    &show,
                )
                .with_context(|| format!("{label} on {}", path.display()))?;
                rows.push(
                    Row::new(
                        f,
                        &loaded.backend,
                        loaded.threads,
                        &args.cache_type,
                        test,
                        ns,
                    )
                    .at_depth(d),
                );
            }
        }
    }
    let mut out = std::io::stdout().lock();
    report::write(&mut out, args.output, &sys, facts.as_ref(), &bws, &rows)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records every decode call so the loop's shape can be checked.
    #[derive(Default)]
    struct Recorder {
        calls: Vec<(usize, usize, usize)>,
        clears: usize,
    }

    impl Target for Recorder {
        fn kv_clear(&mut self) {
            self.clears += 1;
        }
        fn decode(&mut self, tokens: &[u32], pos0: usize, n_out: usize) -> anyhow::Result<()> {
            self.calls.push((tokens.len(), pos0, n_out));
            Ok(())
        }
    }

    #[test]
    fn prompt_test_is_one_forward_per_repetition_after_a_warm_up() {
        let mut r = Recorder::default();
        let tokens = synthetic_tokens(512, 1000, 1);
        let ns = time_test(&mut r, Test::Prompt(512), &tokens, &[], 3, true, &|_| {}).unwrap();
        assert_eq!(ns.len(), 3);
        assert_eq!(r.calls, vec![(512, 0, 1); 4]);
        // A clear before each of the 4 runs, one after.
        assert_eq!(r.clears, 5);
    }

    #[test]
    fn gen_test_is_n_single_token_steps_from_position_zero() {
        let mut r = Recorder::default();
        let tokens = synthetic_tokens(4, 1000, 1);
        time_test(&mut r, Test::Gen(4), &tokens, &[], 2, true, &|_| {}).unwrap();
        // Warm-up: one step; then two runs of positions 0..4.
        let run: Vec<_> = (0..4).map(|p| (1, p, 1)).collect();
        let mut want = vec![(1, 0, 1)];
        want.extend(run.iter().copied());
        want.extend(run.iter().copied());
        assert_eq!(r.calls, want);
    }

    #[test]
    fn depth_is_prefilled_before_every_run_and_the_test_starts_after_it() {
        let mut r = Recorder::default();
        let tokens = synthetic_tokens(3, 1000, 1);
        let depth = synthetic_tokens(10, 1000, 2);
        time_test(&mut r, Test::Gen(3), &tokens, &depth, 1, true, &|_| {}).unwrap();
        // Warm-up: depth, one step at 10; the run: depth, steps at 10, 11, 12.
        let want = vec![
            (10, 0, 1),
            (1, 10, 1),
            (10, 0, 1),
            (1, 10, 1),
            (1, 11, 1),
            (1, 12, 1),
        ];
        assert_eq!(r.calls, want);
        let mut r = Recorder::default();
        time_test(&mut r, Test::Prompt(3), &tokens, &depth, 1, false, &|_| {}).unwrap();
        assert_eq!(r.calls, vec![(10, 0, 1), (3, 10, 1)]);
        assert_eq!(depth_suffix(2048), " @ d2048");
        assert_eq!(depth_suffix(0), "");
    }

    #[test]
    fn synthetic_tokens_are_valid_seeded_and_varied() {
        let a = synthetic_tokens(1000, 151_936, 7);
        assert_eq!(a, synthetic_tokens(1000, 151_936, 7));
        assert_ne!(a, synthetic_tokens(1000, 151_936, 8));
        assert!(a.iter().all(|&t| t < 151_936));
        let distinct: std::collections::HashSet<_> = a.iter().collect();
        assert!(distinct.len() > 900, "{} distinct", distinct.len());
    }
}
