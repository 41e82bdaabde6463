//! Matmul: `out[t][o] = Σ_i w[o][i] · x[t][i] (+ bias[o])`, one driver for both arithmetics.
//!
//! The driver does everything that does not depend on the float order:
//! - [`Shape::check`]: the weight, output and bias lengths against `k` and `m`;
//! - [`encode_activations`]: the activations encoded once per op in the weight type's
//!   `vec_dot_type` (Q8_0, Q8_1 or Q8_K for quantized weights, as llama.cpp does) into a
//!   reused per-thread [`Scratch`], in tasks over the pool, by the SIMD quantizers of
//!   [`crate::simd`] (byte-identical to the scalar reference, `tests/simd_exact.rs`);
//! - [`Split`] and [`par_row_tasks`]: the output rows cut into cache-line-aligned tasks over
//!   the thread pool, each task writing its rows of every token in place through [`RowsOut`];
//! - [`add_bias`]: one f32 add per output after the products (what ggml does too).
//!
//! An arithmetic plugs in its per-task kernel, a closure that fills one [`RowsOut`]: minfer's
//! own order in [`native`] ([`matmul`]), llama.cpp's x86 order in [`crate::llamacpp_x86`]. Which
//! task or thread computes an output never changes its bits.

mod native;
pub mod packed;

pub use native::matmul;
pub use packed::Layout;

use super::{KResult, KernelError};
use crate::simd::{TileMut, TileSide, TILE};
use crate::threads::{par_tasks, SharedOut};
use minfer_gguf::{quants, GgmlType};
use std::cell::RefCell;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

#[derive(Clone, Copy, Debug)]
pub struct Weight<'a> {
    pub ty: GgmlType,
    /// Input dim (elements per row).
    pub k: usize,
    /// Output dim (rows).
    pub m: usize,
    pub bytes: &'a [u8],
    /// How `bytes` holds the rows ([`Layout::Rows`] unless the backend packed them at load).
    pub layout: Layout,
}

/// The checked geometry of one matmul.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shape {
    /// Elements per weight row and per token.
    pub k: usize,
    /// Weight rows (outputs per token).
    pub m: usize,
    /// Tokens: the whole rows of `k` in the activations.
    pub nt: usize,
    /// Bytes per weight row.
    pub wrb: usize,
}

impl Shape {
    /// Checks that `w` holds `m` whole rows of `k`, that `out` holds `nt` rows of `m` for the
    /// `nt = x.len() / k` whole rows of `x`, and that a bias has `m` values.
    pub(crate) fn check(
        w: &Weight,
        x: &[f32],
        bias: Option<&[f32]>,
        out: &[f32],
    ) -> KResult<Shape> {
        let (k, m) = (w.k, w.m);
        let nt = x.len().checked_div(k).unwrap_or(0);
        let wrb = w
            .ty
            .row_bytes(k as u64)
            .map(|b| b as usize)
            .ok_or_else(|| KernelError(format!("{k} is not a whole number of {} blocks", w.ty)))?;
        if w.bytes.len() < wrb * m {
            return Err(KernelError(format!(
                "weight holds {} bytes, {m} rows of {k} {} need {}",
                w.bytes.len(),
                w.ty,
                wrb * m
            )));
        }
        if out.len() < nt * m {
            return Err(KernelError(format!(
                "output holds {} values, {nt} tokens of {m} need {}",
                out.len(),
                nt * m
            )));
        }
        if let Some(b) = bias.filter(|b| b.len() != m) {
            return Err(KernelError(format!(
                "bias holds {} values, {m} outputs need {m}",
                b.len()
            )));
        }
        Ok(Shape { k, m, nt, wrb })
    }

    /// Bytes per activation row encoded in `at`.
    pub(crate) fn act_row_bytes(&self, at: GgmlType) -> KResult<usize> {
        let k = self.k;
        at.row_bytes(k as u64)
            .map(|b| b as usize)
            .ok_or_else(|| KernelError(format!("{k} activations do not fill whole {at} blocks")))
    }
}

/// Output rows per task (and the unit of every split): 16 f32 outputs fill one 64-byte
/// cache line, so two threads never write the same line of a token's output row.
pub(crate) const ROWS_PER_TASK: usize = 16;
/// Decode (fewer tokens than a tile): tasks per thread, see [`Split::new`].
const DECODE_TASKS_PER_THREAD: usize = 8;

/// How a matmul's output rows are cut into tasks over the pool.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Split {
    threads: usize,
    /// A multiple of [`ROWS_PER_TASK`]; tasks start at multiples of it.
    rows_per_task: usize,
}

impl Split {
    /// At least 64 rows per thread (enough work to amortise waking it). Prefill (a tile of
    /// [`TILE`] tokens or more): [`ROWS_PER_TASK`] rows per task, so the rows stay in cache
    /// while the tokens stream past them. Decode: [`DECODE_TASKS_PER_THREAD`] tasks per
    /// thread, so that each thread streams long contiguous runs of weight rows (the hardware
    /// prefetchers start over at every jump, and a 16-row task of a 896-wide Q5_0 matrix is
    /// only ~10 KiB) while a preempted thread still holds only a fraction of the work.
    pub(crate) fn new(m: usize, nt: usize, threads: usize) -> Split {
        let threads = threads.min(m.div_ceil(64)).max(1);
        let rows_per_task = if nt >= TILE || threads <= 1 {
            ROWS_PER_TASK
        } else {
            m.div_ceil(threads * DECODE_TASKS_PER_THREAD)
                .next_multiple_of(ROWS_PER_TASK)
                .max(ROWS_PER_TASK)
        };
        Split {
            threads,
            rows_per_task,
        }
    }

    /// As [`Split::new`], but batches of up to [`DECODE_BATCH_TOKENS`] tokens (a decode step
    /// of several sequences) get decode's long tasks too: their weights come from memory once
    /// per step, so long contiguous runs per thread matter more than rows staying in cache
    /// across many tiles (the native kernel walks a long task 16 rows at a time).
    pub(crate) fn batched(m: usize, nt: usize, threads: usize) -> Split {
        if nt > DECODE_BATCH_TOKENS {
            return Split::new(m, nt, threads);
        }
        let threads = threads.min(m.div_ceil(64)).max(1);
        Split {
            threads,
            rows_per_task: m
                .div_ceil(threads * DECODE_TASKS_PER_THREAD)
                .next_multiple_of(ROWS_PER_TASK)
                .max(ROWS_PER_TASK),
        }
    }
}

/// The most tokens per matmul that [`Split::batched`] still splits as decode.
const DECODE_BATCH_TOKENS: usize = 4 * TILE;

/// The outputs one task owns: weight rows [`RowsOut::rows`] of every token of an `[nt][m]`
/// output. Only [`par_row_tasks`] makes one, one per task, with pairwise disjoint rows.
pub(crate) struct RowsOut<'a> {
    out: SharedOut<'a>,
    m: usize,
    nt: usize,
    rows: Range<usize>,
}

impl RowsOut<'_> {
    /// This task's weight rows (a sub-range of `0..m`).
    pub(crate) fn rows(&self) -> Range<usize> {
        self.rows.clone()
    }

    /// `out[t][o] = v`. Panics unless `t < nt` and `o` is one of this task's rows.
    #[inline]
    pub(crate) fn set(&mut self, t: usize, o: usize, v: f32) {
        assert!(
            t < self.nt && self.rows.contains(&o),
            "output ({t}, {o}) is not this task's"
        );
        // SAFETY: row o of every token belongs to this task alone, and `&mut self` keeps
        // any slice of `token` from aliasing the write (`part` checks the bounds).
        unsafe { self.out.part(t * self.m + o, 1)[0] = v };
    }

    /// This task's outputs of token `t`: `out[t][rows]`. Panics unless `t < nt`.
    #[inline]
    pub(crate) fn token(&mut self, t: usize) -> &mut [f32] {
        assert!(t < self.nt, "token {t} of {}", self.nt);
        // SAFETY: as in `set`: the elements t * m + rows belong to this task alone; the slice
        // borrows `self` mutably, so it is the only live access.
        unsafe { self.out.part(t * self.m + self.rows.start, self.rows.len()) }
    }
}

/// Runs `task` over the `m` output rows of `out` (`[nt][m]`) cut by `split`, on up to its
/// threads; returns the first error a task reported (the other tasks still run).
pub(crate) fn par_row_tasks(
    out: &mut [f32],
    m: usize,
    nt: usize,
    split: Split,
    task: impl Fn(&mut RowsOut<'_>) -> KResult<()> + Sync,
) -> KResult<()> {
    if out.len() < nt * m {
        return Err(KernelError(format!(
            "output holds {} values, {nt} tokens of {m} need {}",
            out.len(),
            nt * m
        )));
    }
    let shared = SharedOut::new(out);
    let rpt = split.rows_per_task;
    let err: Mutex<Option<KernelError>> = Mutex::new(None);
    par_tasks(m.div_ceil(rpt), split.threads, |i| {
        let mut rows = RowsOut {
            out: shared,
            m,
            nt,
            rows: i * rpt..((i + 1) * rpt).min(m),
        };
        if let Err(e) = task(&mut rows) {
            err.lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_or_insert(e);
        }
    });
    match err.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// `out[t][o] += bias[o]` for every token of `out` (`[nt][m]`).
pub(crate) fn add_bias(bias: Option<&[f32]>, m: usize, out: &mut [f32]) {
    let Some(b) = bias.filter(|_| m > 0) else {
        return;
    };
    for row in out.chunks_exact_mut(m) {
        for (o, bv) in row.iter_mut().zip(b) {
            *o += bv;
        }
    }
}

/// Reused per-thread buffers of a matmul's submitting thread.
#[derive(Default)]
pub(crate) struct Scratch {
    /// Encoded activations (grows to the largest batch seen).
    pub act: Vec<u8>,
    /// The native tile kernels' per-block activation facts.
    pub side: TileSide,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Runs `f` with this thread's [`Scratch`] (taken out for the call, so that nothing else on
/// this thread can observe it half-filled).
pub(crate) fn with_scratch<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
    let mut sc = SCRATCH.with(|s| std::mem::take(&mut *s.borrow_mut()));
    let r = f(&mut sc);
    SCRATCH.with(|s| *s.borrow_mut() = sc);
    r
}

/// Encodes the `x.len() / k` rows of `x` in `at` into `sc.act` (rows of `arb` bytes) with
/// [`crate::simd::quantize_act`], in tasks of [`TILE`] tokens over the pool, followed by
/// zero bytes up to `rows` rows (`rows` >= the rows of `x`: a last tile padded for the tile
/// kernels; a zero row is a valid encoded row of every activation type, all scales and
/// quants 0); with `tiles`, also fills `sc.side` for every full tile of the `rows` rows (the
/// native tile kernels read it). Returns whether the side table is complete and the rows fit
/// the tile kernels (`false` without `tiles`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn encode_activations(
    at: GgmlType,
    x: &[f32],
    k: usize,
    arb: usize,
    rows: usize,
    sc: &mut Scratch,
    tiles: bool,
    threads: usize,
) -> KResult<bool> {
    let nt = x.len() / k;
    let rows = rows.max(nt);
    sc.act.clear();
    sc.act.resize(arb * rows, 0);
    let tiled = tiles && rows >= TILE && sc.side.reset(at, arb, rows);
    let acts: Vec<Mutex<&mut [u8]>> = sc.act.chunks_mut(TILE * arb).map(Mutex::new).collect();
    let sides: Vec<Mutex<TileMut>> = if tiled {
        sc.side.tiles_mut().map(Mutex::new).collect()
    } else {
        Vec::new()
    };
    let fit = AtomicBool::new(tiled);
    let err: Mutex<Option<KernelError>> = Mutex::new(None);
    // Enough work per thread to amortise waking it (~8 K activations).
    let threads = threads.min((nt * k).div_ceil(8192)).max(1);
    par_tasks(acts.len(), threads, |task| {
        let mut a = acts[task].lock().unwrap_or_else(|p| p.into_inner());
        let xs = &x[(task * TILE).min(nt) * k..((task + 1) * TILE).min(nt) * k];
        for (xr, or) in xs.chunks_exact(k).zip(a.chunks_exact_mut(arb)) {
            if let Err(e) = crate::simd::quantize_act(at, xr, or) {
                err.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_or_insert(KernelError(e.to_string()));
                return;
            }
        }
        if let Some(side) = sides.get(task) {
            let mut side = side.lock().unwrap_or_else(|p| p.into_inner());
            if !TileSide::fill(at, &a, arb, &mut side) {
                fit.store(false, Ordering::Relaxed);
            }
        }
    });
    match err.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => Ok(fit.into_inner()),
    }
}

/// Encodes `n_tokens` rows of `k` activations in `ty`'s vec_dot type into `out` (resized),
/// on the calling thread. Returns the bytes per encoded row.
pub fn quantize_activations(
    ty: GgmlType,
    x: &[f32],
    k: usize,
    out: &mut Vec<u8>,
) -> KResult<usize> {
    let at = quants::vec_dot_type(ty);
    let arb = at
        .row_bytes(k as u64)
        .ok_or_else(|| KernelError(format!("{k} activations do not fill whole {at} blocks")))?
        as usize;
    let nt = x.len() / k;
    out.clear();
    out.resize(arb * nt, 0);
    for (xr, or) in x.chunks_exact(k).zip(out.chunks_exact_mut(arb)) {
        crate::simd::quantize_act(at, xr, or)?;
    }
    Ok(arb)
}
