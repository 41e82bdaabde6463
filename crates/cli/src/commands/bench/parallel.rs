//! `minfer bench --parallel N,...`: batched decode in the manner of llama.cpp's
//! `llama-batched-bench`, so its S_PP / S_TG / S columns can be set side by side
//! (`scripts/peer-batched-bench`).
//!
//! One run of the shape (P, T, N), from N empty sequences:
//! - prefill: the N prompts of P synthetic tokens each, laid end to end (sequence 0's
//!   prompt, then sequence 1's, ...) and cut into forwards of at most `n_batch` tokens, as
//!   llama-batched-bench hands llama.cpp one batch of N·P tokens in `n_batch` views. A
//!   forward holds one entry per sequence it touches; only the entry that ends a prompt
//!   asks for logits (its last row). Timed as T_PP.
//! - decode: T forwards, each one token per sequence (N entries, each with its logits) at
//!   position P + step. Timed as T_TG.
//! - Rates: S_PP = N·P / T_PP, S_TG = N·T / T_TG (aggregate over the N sequences),
//!   S = N·(P + T) / (T_PP + T_TG); N_KV = N·(P + T), the cells the run ends holding.
//! - Every repetition starts from empty measured sequences of the same loaded model; an
//!   untimed warm-up run (which builds the graphs of every forward shape) comes first.
//!   Medians over the repetitions are reported.
//! - Where the cells go is [`KvLayout`]: by default each sequence owns a slot of P + T
//!   cells (one span per query, as llama.cpp's per-sequence KV streams), or the engine's
//!   allocation (blocks: a sequence's cells in few runs), or plain first fit (interleaved
//!   cells, kv-map windows, compaction). Each row reports the defragmentations its runs
//!   made (JSON `defrags`).

use super::report::{size_text, write_header, Format, ModelFacts};
use super::sysinfo::SysInfo;
use super::{membw::MemBw, stats, Target};
use anyhow::Context;
use minfer_engine::{BatchEntry, SeqId};
use std::io::Write;
use std::time::Instant;

/// A test: N sequences of a P-token prompt and T generated tokens each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub n_prompt: usize,
    pub n_gen: usize,
    pub n_parallel: usize,
}

impl Shape {
    /// KV cells a run ends holding (llama-batched-bench's N_KV).
    pub fn n_kv(self) -> usize {
        self.n_parallel * (self.n_prompt + self.n_gen)
    }
    pub fn name(self) -> String {
        format!("pp{}+tg{} x{}", self.n_prompt, self.n_gen, self.n_parallel)
    }
}

/// Part of one sequence's prompt in one prefill forward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// Index of the sequence (0..N).
    pub seq: usize,
    /// First prompt position of the part.
    pub start: usize,
    pub len: usize,
    /// The part ends the prompt: its last row gets logits.
    pub logits: bool,
}

/// The prefill forwards: the N prompts end to end, cut every `n_batch` tokens.
pub fn prefill_plan(n_parallel: usize, n_prompt: usize, n_batch: usize) -> Vec<Vec<Chunk>> {
    let n_batch = n_batch.max(1);
    let total = n_parallel * n_prompt;
    let mut plan = Vec::with_capacity(total.div_ceil(n_batch));
    let mut at = 0;
    while at < total {
        let end = (at + n_batch).min(total);
        let mut fwd = Vec::new();
        let mut t = at;
        while t < end {
            let seq = t / n_prompt;
            let start = t - seq * n_prompt;
            let len = (n_prompt - start).min(end - t);
            fwd.push(Chunk {
                seq,
                start,
                len,
                logits: start + len == n_prompt,
            });
            t += len;
        }
        plan.push(fwd);
        at = end;
    }
    plan
}

/// Nanoseconds of each repetition's prefill and decode.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Samples {
    pub pp_ns: Vec<u64>,
    pub tg_ns: Vec<u64>,
    /// Defragmentations during the timed runs.
    pub defrags: usize,
}

/// The synthetic tokens of a shape: each sequence's prompt and decode tokens.
pub struct Tokens {
    pub prompts: Vec<Vec<u32>>,
    pub gen: Vec<Vec<u32>>,
}

impl Tokens {
    pub fn new(shape: Shape, vocab: usize, seed: u64) -> Tokens {
        let seqs = 0..shape.n_parallel as u64;
        Tokens {
            prompts: seqs
                .clone()
                .map(|j| super::synthetic_tokens(shape.n_prompt, vocab, seed.wrapping_add(j)))
                .collect(),
            // Another seed family, so a decode token is not the prompt's next one repeated.
            gen: seqs
                .map(|j| super::synthetic_tokens(shape.n_gen, vocab, (seed ^ 0x7e57) + j))
                .collect(),
        }
    }
}

/// How the sequences' KV cells are laid out in the arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum KvLayout {
    /// Each sequence owns P + T contiguous cells: one span per query.
    //
    // What llama.cpp's per-sequence KV streams give it. The engine has no call that
    // reserves cells for a sequence, so the slots are made through the cell allocator: an
    // untimed pass fills every slot with a sequence of a spare set (one forward of P + T
    // tokens, then copies of its cells) and drops their first P positions, leaving a P-cell
    // hole followed by T held cells per slot; the timed
    // prefill fills the holes (first fit, in order), the spare set is cleared (untimed) and
    // decode grows every sequence in place. Afterwards the measured set drops its first P
    // positions and becomes the next run's spare set, so later runs need no extra forward.
    Slots,
    /// First fit from an empty arena (the engine's allocation before blocks).
    //
    // One sequence's decode cells interleave with the others', so windows become kv maps
    // and the cache is compacted every few steps.
    FirstFit,
    /// The engine's allocation from an empty arena, as the server sees it: a sequence that
    /// cannot grow in place jumps to a block with room to grow (few runs, rare compaction).
    Blocks,
}

impl KvLayout {
    pub fn name(self) -> &'static str {
        match self {
            KvLayout::Slots => "slots",
            KvLayout::FirstFit => "first-fit",
            KvLayout::Blocks => "blocks",
        }
    }

    /// The engine's cell placement under this layout (the slots are laid out by first fit).
    pub fn placement(self) -> minfer_engine::KvPlacement {
        match self {
            KvLayout::Slots | KvLayout::FirstFit => minfer_engine::KvPlacement::FirstFit,
            KvLayout::Blocks => minfer_engine::KvPlacement::SERVER,
        }
    }
}

/// The sequences a shape runs on: N measured, and N spares (slot layout only).
pub struct SeqSets {
    pub live: Vec<SeqId>,
    pub spare: Vec<SeqId>,
}

impl SeqSets {
    /// The first `n` of `a` and of `b`.
    pub fn new(a: &[SeqId], b: &[SeqId], n: usize) -> SeqSets {
        SeqSets {
            live: a[..n].to_vec(),
            spare: b[..n].to_vec(),
        }
    }
}

/// The forwards of a packed prefill of `seqs[j]`'s `prompt(j)`, logits as the plan says (or
/// none at all).
fn prefill(
    target: &mut dyn Target,
    seqs: &[SeqId],
    prompt: &dyn Fn(usize) -> Vec<u32>,
    n_prompt: usize,
    logits: bool,
    what: &str,
) -> anyhow::Result<()> {
    let prompts: Vec<Vec<u32>> = (0..seqs.len()).map(prompt).collect();
    let plan = prefill_plan(seqs.len(), n_prompt, target.n_batch());
    for (k, fwd) in plan.iter().enumerate() {
        let entries: Vec<BatchEntry> = fwd
            .iter()
            .map(|c| {
                BatchEntry::prompt(
                    seqs[c.seq],
                    &prompts[c.seq][c.start..c.start + c.len],
                    c.start,
                    usize::from(c.logits && logits),
                )
            })
            .collect();
        target
            .forward_batch(&entries)
            .with_context(|| format!("{what} forward {}/{}", k + 1, plan.len()))?;
    }
    Ok(())
}

/// The slot layout's untimed pass, from an empty arena: the first spare prefills P + T
/// tokens (cells `0..P + T`), the others copy its cells into the next free ones (a copy of
/// KV rows, no forward), and every spare drops its first P positions.
fn lay_out_slots(
    target: &mut dyn Target,
    shape: Shape,
    sets: &SeqSets,
    tokens: &Tokens,
) -> anyhow::Result<()> {
    let n = shape.n_prompt + shape.n_gen;
    let full = |_: usize| {
        let mut t = tokens.prompts[0].clone();
        t.extend_from_slice(&tokens.gen[0]);
        t
    };
    let first = sets.spare[0];
    prefill(target, &[first], &full, n, false, "slot layout")?;
    for &s in &sets.spare[1..] {
        target.seq_copy_prefix(s, first, n)?;
    }
    for &s in &sets.spare {
        target.seq_remove(s, 0..shape.n_prompt)?;
    }
    Ok(())
}

/// One run on the measured set (empty at the start): the prefill, then `shape.n_gen`
/// decode forwards; returns the nanoseconds of each phase. With slots, the spare set is
/// cleared between the two (untimed) and the sets swap roles after the run.
fn run_once(
    target: &mut dyn Target,
    shape: Shape,
    sets: &mut SeqSets,
    tokens: &Tokens,
    layout: KvLayout,
) -> anyhow::Result<(u64, u64)> {
    let t0 = Instant::now();
    prefill(
        target,
        &sets.live,
        &|j| tokens.prompts[j].clone(),
        shape.n_prompt,
        true,
        "prefill",
    )?;
    let pp = t0.elapsed().as_nanos() as u64;
    if layout == KvLayout::Slots {
        for &s in &sets.spare {
            target.seq_clear(s)?;
        }
    }
    let t1 = Instant::now();
    for i in 0..shape.n_gen {
        let entries: Vec<BatchEntry> = sets
            .live
            .iter()
            .zip(&tokens.gen)
            .map(|(&seq, g)| BatchEntry::generated(seq, &g[i..i + 1], shape.n_prompt + i))
            .collect();
        target
            .forward_batch(&entries)
            .with_context(|| format!("decode step {}/{}", i + 1, shape.n_gen))?;
    }
    let tg = t1.elapsed().as_nanos() as u64;
    match layout {
        KvLayout::Slots => {
            for &s in &sets.live {
                target.seq_remove(s, 0..shape.n_prompt)?;
            }
            std::mem::swap(&mut sets.live, &mut sets.spare);
        }
        KvLayout::FirstFit | KvLayout::Blocks => {
            for &s in &sets.live {
                target.seq_clear(s)?;
            }
        }
    }
    Ok((pp, tg))
}

/// Times `reps` runs of `shape` on `sets` after an untimed warm-up run (which builds the
/// graphs of every forward shape the runs use). Every sequence of `all` is cleared first
/// (the arena starts empty) and after the last run.
#[allow(clippy::too_many_arguments)]
pub fn time_parallel(
    target: &mut dyn Target,
    shape: Shape,
    all: &[SeqId],
    mut sets: SeqSets,
    tokens: &Tokens,
    layout: KvLayout,
    reps: usize,
    warmup: bool,
    progress: &dyn Fn(usize),
) -> anyhow::Result<Samples> {
    let n = shape.n_parallel;
    anyhow::ensure!(
        n >= 1 && sets.live.len() == n && sets.spare.len() == n,
        "{n} sequences wanted"
    );
    anyhow::ensure!(
        n <= target.n_batch(),
        "--parallel {n} is more than the batch size {} (one decode forward holds a token of \
         every sequence)",
        target.n_batch()
    );
    let clear_all = |target: &mut dyn Target| -> anyhow::Result<()> {
        for &s in all {
            target.seq_clear(s)?;
        }
        Ok(())
    };
    target.set_kv_placement(layout.placement());
    clear_all(target)?;
    if layout == KvLayout::Slots {
        lay_out_slots(target, shape, &sets, tokens)?;
    }
    if warmup {
        run_once(target, shape, &mut sets, tokens, layout).context("warm-up run")?;
    }
    let mut out = Samples::default();
    let defrags = target.defrags();
    for rep in 0..reps {
        progress(rep);
        let (pp, tg) = run_once(target, shape, &mut sets, tokens, layout)?;
        out.pp_ns.push(pp);
        out.tg_ns.push(tg);
    }
    out.defrags = target.defrags() - defrags;
    clear_all(target)?;
    Ok(out)
}

/// One shape's results (times in seconds and rates in tokens/s are medians over the
/// repetitions; llama-batched-bench's column names in the comments).
#[derive(Clone, Debug, serde::Serialize)]
pub struct ParRow {
    pub model_type: String,
    pub model_size: u64,
    pub model_n_params: u64,
    pub backend: String,
    pub n_threads: usize,
    pub type_kv: String,
    pub n_batch: usize,
    pub kv_layout: KvLayout,
    pub test: String,
    /// PP
    pub n_prompt: usize,
    /// TG
    pub n_gen: usize,
    /// B
    pub n_parallel: usize,
    /// N_KV
    pub n_kv: usize,
    pub samples_pp_ns: Vec<u64>,
    pub samples_tg_ns: Vec<u64>,
    /// KV defragmentations during the timed runs (all repetitions).
    pub defrags: usize,
    /// T_PP s
    pub t_pp_s: f64,
    /// S_PP t/s: all N·P prompt tokens over the prefill time.
    pub s_pp_ts: f64,
    /// T_TG s
    pub t_tg_s: f64,
    /// S_TG t/s: all N·T generated tokens over the decode time.
    pub s_tg_ts: f64,
    /// S_TG / N: what each sequence sees.
    pub s_tg_per_seq_ts: f64,
    /// T s
    pub t_s: f64,
    /// S t/s
    pub s_ts: f64,
    /// Mean and sample sd of the per-repetition S_TG.
    pub s_tg_avg_ts: f64,
    pub s_tg_stddev_ts: f64,
}

fn rate(tokens: usize, ns: u64) -> f64 {
    if ns == 0 {
        0.0
    } else {
        tokens as f64 * 1e9 / ns as f64
    }
}

pub struct RowFacts<'a> {
    pub facts: &'a ModelFacts,
    pub backend: &'a str,
    pub threads: usize,
    pub type_kv: &'a str,
    pub n_batch: usize,
    pub kv_layout: KvLayout,
}

impl ParRow {
    pub fn new(f: &RowFacts, shape: Shape, s: Samples) -> ParRow {
        let (np, ng) = (
            shape.n_parallel * shape.n_prompt,
            shape.n_parallel * shape.n_gen,
        );
        let med = |ns: &[u64]| stats::median(&ns.iter().map(|&x| x as f64).collect::<Vec<_>>());
        let rates = |tok: usize, ns: &[u64]| ns.iter().map(|&x| rate(tok, x)).collect::<Vec<_>>();
        let total: Vec<u64> = s.pp_ns.iter().zip(&s.tg_ns).map(|(a, b)| a + b).collect();
        let s_tg = rates(ng, &s.tg_ns);
        let s_tg_ts = stats::median(&s_tg);
        ParRow {
            model_type: f.facts.model_type.clone(),
            model_size: f.facts.model_size,
            model_n_params: f.facts.model_n_params,
            backend: f.backend.to_string(),
            n_threads: f.threads,
            type_kv: f.type_kv.to_string(),
            n_batch: f.n_batch,
            kv_layout: f.kv_layout,
            test: shape.name(),
            n_prompt: shape.n_prompt,
            n_gen: shape.n_gen,
            n_parallel: shape.n_parallel,
            n_kv: shape.n_kv(),
            t_pp_s: med(&s.pp_ns) / 1e9,
            s_pp_ts: stats::median(&rates(np, &s.pp_ns)),
            t_tg_s: med(&s.tg_ns) / 1e9,
            s_tg_ts,
            s_tg_per_seq_ts: s_tg_ts / shape.n_parallel as f64,
            t_s: med(&total) / 1e9,
            s_ts: stats::median(&rates(np + ng, &total)),
            s_tg_avg_ts: stats::mean(&s_tg),
            s_tg_stddev_ts: stats::stdev(&s_tg),
            samples_pp_ns: s.pp_ns,
            samples_tg_ns: s.tg_ns,
            defrags: s.defrags,
        }
    }
}

/// S_TG of `r` over S_TG of the row with one sequence and otherwise the same settings.
fn over_single(r: &ParRow, rows: &[ParRow]) -> Option<f64> {
    rows.iter()
        .find(|o| {
            o.n_parallel == 1
                && (o.n_prompt, o.n_gen, o.n_threads) == (r.n_prompt, r.n_gen, r.n_threads)
        })
        .filter(|o| o.s_tg_ts > 0.0)
        .map(|o| r.s_tg_ts / o.s_tg_ts)
}

pub fn write(
    out: &mut dyn Write,
    format: Format,
    sys: &SysInfo,
    facts: Option<&ModelFacts>,
    bws: &[MemBw],
    rows: &[ParRow],
) -> std::io::Result<()> {
    match format {
        Format::Md => {
            write_header(out, sys, bws)?;
            if let Some(f) = facts {
                writeln!(
                    out,
                    "model: {} ({}, {})",
                    f.filename,
                    f.model_type,
                    size_text(f.model_size)
                )?;
            }
            if let Some(r) = rows.first() {
                writeln!(
                    out,
                    "backend {}, KV {}, n_batch {}, KV layout {}; medians of {} repetition(s); \
                     S_TG = all sequences' generated tokens per second",
                    r.backend,
                    r.type_kv,
                    r.n_batch,
                    r.kv_layout.name(),
                    r.samples_tg_ns.len()
                )?;
            } else {
                return Ok(());
            }
            writeln!(out)?;
            writeln!(out, "| threads | PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | S_TG/B t/s | S_TG vs B=1 | T s | S t/s |")?;
            writeln!(out, "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")?;
            for r in rows {
                let x = over_single(r, rows)
                    .map(|x| format!("{x:.2}x"))
                    .unwrap_or_else(|| "-".into());
                writeln!(
                    out,
                    "| {} | {} | {} | {} | {} | {:.3} | {:.2} | {:.3} | {:.2} | {:.2} | {} | {:.3} | {:.2} |",
                    r.n_threads,
                    r.n_prompt,
                    r.n_gen,
                    r.n_parallel,
                    r.n_kv,
                    r.t_pp_s,
                    r.s_pp_ts,
                    r.t_tg_s,
                    r.s_tg_ts,
                    r.s_tg_per_seq_ts,
                    x,
                    r.t_s,
                    r.s_ts
                )?;
            }
        }
        Format::Csv => {
            writeln!(out, "model_type,backend,n_threads,type_kv,n_batch,n_prompt,n_gen,n_parallel,n_kv,t_pp_s,s_pp_ts,t_tg_s,s_tg_ts,t_s,s_ts")?;
            for r in rows {
                writeln!(
                    out,
                    "\"{}\",{},{},{},{},{},{},{},{},{:.6},{:.4},{:.6},{:.4},{:.6},{:.4}",
                    r.model_type,
                    r.backend,
                    r.n_threads,
                    r.type_kv,
                    r.n_batch,
                    r.n_prompt,
                    r.n_gen,
                    r.n_parallel,
                    r.n_kv,
                    r.t_pp_s,
                    r.s_pp_ts,
                    r.t_tg_s,
                    r.s_tg_ts,
                    r.t_s,
                    r.s_ts
                )?;
            }
        }
        Format::Json => super::report::write_json(out, sys, facts, bws, rows)?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use minfer_engine::RowClass;

    fn c(seq: usize, start: usize, len: usize, logits: bool) -> Chunk {
        Chunk {
            seq,
            start,
            len,
            logits,
        }
    }

    #[test]
    fn prompts_are_packed_end_to_end_into_n_batch_forwards() {
        // 3 x 5 tokens in forwards of 8: [s0 0..5, s1 0..3], [s1 3..5, s2 0..5].
        assert_eq!(
            prefill_plan(3, 5, 8),
            vec![
                vec![c(0, 0, 5, true), c(1, 0, 3, false)],
                vec![c(1, 3, 2, true), c(2, 0, 5, true)],
            ]
        );
        // All of them fit: one forward (llama-batched-bench's one batch of N*P tokens).
        assert_eq!(
            prefill_plan(4, 128, 512),
            vec![(0..4).map(|j| c(j, 0, 128, true)).collect::<Vec<_>>()]
        );
        // A prompt longer than the batch spans forwards of one entry each.
        assert_eq!(
            prefill_plan(1, 10, 4),
            vec![
                vec![c(0, 0, 4, false)],
                vec![c(0, 4, 4, false)],
                vec![c(0, 8, 2, true)]
            ]
        );
    }

    #[test]
    fn every_prompt_token_is_fed_once_in_order_within_the_batch_size() {
        for n in 1..=9 {
            for p in 1..=13 {
                for nb in [1, 2, 3, 7, 16, 64] {
                    let plan = prefill_plan(n, p, nb);
                    assert_eq!(plan.len(), (n * p).div_ceil(nb), "n {n} p {p} nb {nb}");
                    let mut next = vec![0; n];
                    let mut logits = vec![0; n];
                    for fwd in &plan {
                        let size: usize = fwd.iter().map(|c| c.len).sum();
                        assert!(size <= nb && size > 0);
                        let mut seen: Vec<usize> = fwd.iter().map(|c| c.seq).collect();
                        seen.dedup();
                        assert_eq!(seen.len(), fwd.len(), "a sequence twice in a forward");
                        for ch in fwd {
                            assert_eq!(ch.start, next[ch.seq]);
                            next[ch.seq] += ch.len;
                            assert_eq!(ch.logits, next[ch.seq] == p);
                            logits[ch.seq] += usize::from(ch.logits);
                        }
                    }
                    assert_eq!(next, vec![p; n]);
                    assert_eq!(logits, vec![1; n]);
                }
            }
        }
    }

    /// What the driver asked for.
    #[derive(Clone, Debug, PartialEq)]
    enum Call {
        Clear(u32),
        Remove(u32, std::ops::Range<usize>),
        Copy(u32, u32, usize),
        /// (sequence, pos0, tokens, logits) per entry.
        Fwd(Vec<(u32, usize, usize, usize)>),
    }

    /// A stand-in model that keeps a real cell table (the engine's allocator) and records
    /// every call and the most runs any forward's sequence had (1: every window a span).
    struct Fake {
        n_batch: usize,
        cells: minfer_engine::KvCells,
        calls: Vec<Call>,
        max_runs: usize,
    }

    impl Fake {
        fn new(n_cells: usize, n_batch: usize) -> Fake {
            Fake {
                n_batch,
                cells: minfer_engine::KvCells::new(n_cells),
                calls: Vec::new(),
                max_runs: 0,
            }
        }
        fn fwds(&self) -> Vec<Vec<(u32, usize, usize, usize)>> {
            self.calls
                .iter()
                .filter_map(|c| match c {
                    Call::Fwd(e) => Some(e.clone()),
                    _ => None,
                })
                .collect()
        }
    }

    impl Target for Fake {
        fn kv_clear(&mut self) {}
        fn decode(&mut self, _: &[u32], _: usize, _: usize, _: RowClass) -> anyhow::Result<()> {
            unreachable!("the parallel test decodes through forward_batch")
        }
        fn n_batch(&self) -> usize {
            self.n_batch
        }
        fn seq_create(&mut self) -> SeqId {
            self.cells.create()
        }
        fn set_kv_placement(&mut self, placement: minfer_engine::KvPlacement) {
            self.cells.set_placement(placement);
        }
        fn seq_clear(&mut self, seq: SeqId) -> anyhow::Result<()> {
            self.calls.push(Call::Clear(seq.0));
            Ok(self.cells.clear(seq)?)
        }
        fn seq_remove(&mut self, seq: SeqId, r: std::ops::Range<usize>) -> anyhow::Result<()> {
            self.calls.push(Call::Remove(seq.0, r.clone()));
            Ok(self.cells.remove(seq, r)?)
        }
        fn seq_copy_prefix(&mut self, dst: SeqId, src: SeqId, n: usize) -> anyhow::Result<()> {
            self.calls.push(Call::Copy(dst.0, src.0, n));
            self.cells.copy_prefix(dst, src, n)?;
            Ok(())
        }
        fn forward_batch(&mut self, entries: &[BatchEntry]) -> anyhow::Result<()> {
            assert!(entries.iter().map(|e| e.tokens.len()).sum::<usize>() <= self.n_batch);
            self.calls.push(Call::Fwd(
                entries
                    .iter()
                    .map(|e| (e.seq.0, e.pos0, e.tokens.len(), e.logits))
                    .collect(),
            ));
            let reqs: Vec<_> = entries
                .iter()
                .map(|e| (e.seq, e.pos0, e.tokens.len()))
                .collect();
            self.cells.reserve(&reqs)?;
            for e in entries {
                let runs = self.cells.runs(e.seq)?.len();
                self.max_runs = self.max_runs.max(runs);
            }
            Ok(())
        }
    }

    fn shape(p: usize, t: usize, n: usize) -> Shape {
        Shape {
            n_prompt: p,
            n_gen: t,
            n_parallel: n,
        }
    }

    /// Two sets of `n` sequences (ids 0..n and n..2n) on a fake sized for the shape.
    fn setup(s: Shape, n_batch: usize) -> (Fake, Vec<SeqId>, SeqSets) {
        let mut f = Fake::new(s.n_kv(), n_batch);
        let all: Vec<SeqId> = (0..2 * s.n_parallel).map(|_| f.seq_create()).collect();
        let sets = SeqSets::new(&all[..s.n_parallel], &all[s.n_parallel..], s.n_parallel);
        (f, all, sets)
    }

    #[test]
    fn first_fit_run_prefills_packed_then_decodes_one_token_per_sequence_per_forward() {
        let s = shape(5, 3, 3);
        let (mut f, all, sets) = setup(s, 8);
        let tokens = Tokens::new(s, 1000, 1);
        let out = time_parallel(
            &mut f,
            s,
            &all,
            sets,
            &tokens,
            KvLayout::FirstFit,
            2,
            false,
            &|_| {},
        )
        .unwrap();
        assert_eq!((out.pp_ns.len(), out.tg_ns.len()), (2, 2));
        let mut one_run = vec![
            vec![(0, 0, 5, 1), (1, 0, 3, 0)],
            vec![(1, 3, 2, 1), (2, 0, 5, 1)],
        ];
        one_run.extend((0..3).map(|i| (0..3).map(|q| (q, 5 + i, 1, 1)).collect()));
        let mut want = one_run.clone();
        want.extend(one_run);
        assert_eq!(f.fwds(), want);
        // First fit interleaves the decode cells: windows of several runs.
        assert!(f.max_runs > 1, "{}", f.max_runs);
        // Every sequence (spares too) cleared first and last, the measured ones after
        // each run.
        let clears = |q: u32| f.calls.iter().filter(|c| **c == Call::Clear(q)).count();
        assert_eq!((clears(0), clears(4)), (4, 2));
        assert!(f.calls.iter().all(|c| !matches!(c, Call::Remove(..))));
    }

    #[test]
    fn slots_keep_every_sequence_one_run_with_no_forward_between_runs() {
        let s = shape(5, 3, 3);
        let (mut f, all, sets) = setup(s, 8);
        let tokens = Tokens::new(s, 1000, 1);
        time_parallel(
            &mut f,
            s,
            &all,
            sets,
            &tokens,
            KvLayout::Slots,
            3,
            true,
            &|_| {},
        )
        .unwrap();
        // The arena is exactly N (P + T) cells and no window ever had two runs.
        assert_eq!(f.max_runs, 1);
        f.cells.check().unwrap();
        let fwds = f.fwds();
        // Layout: spare 3 prefills 8 tokens (no logits), spares 4 and 5 copy its cells.
        assert_eq!(fwds[0], vec![(3, 0, 8, 0)]);
        assert!(f.calls.contains(&Call::Copy(4, 3, 8)) && f.calls.contains(&Call::Copy(5, 3, 8)));
        // Then 4 runs (warm-up + 3), each 2 prefill forwards and 3 decode steps, the sets
        // taking turns: 0..3, 3..6, 0..3, 3..6.
        assert_eq!(fwds.len(), 1 + 4 * 5);
        for (k, run) in fwds[1..].chunks(5).enumerate() {
            let q0 = if k % 2 == 0 { 0 } else { 3 };
            assert_eq!(
                run[..2],
                [
                    vec![(q0, 0, 5, 1), (q0 + 1, 0, 3, 0)],
                    vec![(q0 + 1, 3, 2, 1), (q0 + 2, 0, 5, 1)]
                ]
            );
            for (i, step) in run[2..].iter().enumerate() {
                let want: Vec<_> = (q0..q0 + 3).map(|q| (q, 5 + i, 1, 1)).collect();
                assert_eq!(*step, want);
            }
        }
        // After the first run the measured set dropped its prompts and became the spares.
        assert!(f.calls.contains(&Call::Remove(0, 0..5)));
    }

    #[test]
    fn blocks_keep_decode_windows_a_kv_map_where_first_fit_does_not() {
        for (p, t, n) in [(32, 32, 8), (128, 32, 8), (128, 32, 32)] {
            let s = shape(p, t, n);
            let most = |layout| {
                let (mut f, all, sets) = setup(s, 512);
                let tokens = Tokens::new(s, 100, 2);
                time_parallel(&mut f, s, &all, sets, &tokens, layout, 1, true, &|_| {}).unwrap();
                f.cells.check().unwrap();
                f.max_runs
            };
            let runs = minfer_engine::KV_MAP_RUNS;
            let blocks = most(KvLayout::Blocks);
            assert!(blocks <= runs, "p {p} t {t} n {n}: {blocks} runs");
            // Control: first fit needs more runs than a map holds (the engine would defrag).
            let ff = most(KvLayout::FirstFit);
            assert!(ff > runs, "first fit p {p} t {t} n {n}: {ff} runs");
        }
    }

    #[test]
    fn slots_hold_for_many_shapes_and_batch_sizes() {
        for (p, t, n, nb) in [(7, 4, 5, 8), (128, 32, 16, 512), (3, 9, 4, 5), (1, 1, 1, 1)] {
            let s = shape(p, t, n);
            let (mut f, all, sets) = setup(s, nb);
            let tokens = Tokens::new(s, 100, 2);
            time_parallel(
                &mut f,
                s,
                &all,
                sets,
                &tokens,
                KvLayout::Slots,
                2,
                true,
                &|_| {},
            )
            .unwrap();
            assert_eq!(f.max_runs, 1, "p {p} t {t} n {n} nb {nb}");
            // Everything was cleared at the end.
            assert_eq!(f.cells.n_free(), s.n_kv());
        }
    }

    #[test]
    fn more_sequences_than_one_forward_holds_are_refused() {
        let s = shape(4, 2, 3);
        let (mut f, all, sets) = setup(s, 2);
        let tokens = Tokens::new(s, 1000, 1);
        let e = time_parallel(
            &mut f,
            s,
            &all,
            sets,
            &tokens,
            KvLayout::Slots,
            1,
            true,
            &|_| {},
        )
        .unwrap_err();
        assert!(e.to_string().contains("batch size 2"), "{e}");
    }

    #[test]
    fn rows_report_aggregate_rates_and_medians() {
        let facts = ModelFacts {
            filename: "m.gguf".into(),
            model_type: "qwen2 Q4_K - Medium".into(),
            model_size: 1 << 30,
            model_n_params: 1,
            vocab: 100,
            weight_bytes_per_token: 1,
        };
        let rf = RowFacts {
            facts: &facts,
            backend: "CPU",
            threads: 2,
            type_kv: "f16",
            n_batch: 512,
            kv_layout: KvLayout::Slots,
        };
        let shape = Shape {
            n_prompt: 128,
            n_gen: 32,
            n_parallel: 4,
        };
        // Prefill 512 tokens in 2, 4, 1 s; decode 128 tokens in 1, 2, 4 s.
        let s = Samples {
            pp_ns: vec![2_000_000_000, 4_000_000_000, 1_000_000_000],
            tg_ns: vec![1_000_000_000, 2_000_000_000, 4_000_000_000],
            defrags: 0,
        };
        let r = ParRow::new(&rf, shape, s);
        assert_eq!(r.n_kv, 640);
        assert_eq!((r.t_pp_s, r.s_pp_ts), (2.0, 256.0));
        assert_eq!((r.t_tg_s, r.s_tg_ts, r.s_tg_per_seq_ts), (2.0, 64.0, 16.0));
        // Totals 3, 6, 5 s for 640 tokens: median 5 s, 128 t/s.
        assert_eq!((r.t_s, r.s_ts), (5.0, 128.0));
        let one = ParRow::new(
            &rf,
            Shape {
                n_parallel: 1,
                ..shape
            },
            Samples {
                pp_ns: vec![1_000_000_000],
                tg_ns: vec![1_000_000_000],
                defrags: 0,
            },
        );
        assert_eq!(one.s_tg_ts, 32.0);
        let rows = vec![one, r];
        assert_eq!(over_single(&rows[1], &rows), Some(2.0));
        let sys = super::super::sysinfo::detect();
        let mut buf = Vec::new();
        write(&mut buf, Format::Md, &sys, Some(&facts), &[], &rows).unwrap();
        let text = String::from_utf8(buf).unwrap();
        assert!(
            text.contains("| 2 | 128 | 32 | 4 | 640 | 2.000 | 256.00 | 2.000 | 64.00 | 16.00 | 2.00x | 5.000 | 128.00 |"),
            "{text}"
        );
    }
}
