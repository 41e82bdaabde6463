//! Quantized matmul: `out[t][o] = Σ_i w[o][i] · x[t][i]`.
//!
//! Activations are encoded once per op in the weight type's `vec_dot_type` (Q8_0, Q8_1 or
//! Q8_K for quantized weights, as llama.cpp does) into a reused scratch; output rows are split
//! across the thread pool in cache-line-aligned tasks that write the output in place, and each
//! task walks its weight rows once per tile of tokens, so the rows stay in cache for the batch.

use super::{KResult, KernelError};
use crate::dot;
use crate::simd::{finish_tile, RowSideFn, TileAcc, TileFn, TileMut, TileSide, TILE};
use crate::threads::par_tasks;
use minfer_gguf::{quants, GgmlType};
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

pub struct Weight<'a> {
    pub ty: GgmlType,
    /// Input dim (elements per row).
    pub k: usize,
    /// Output dim (rows).
    pub m: usize,
    pub bytes: &'a [u8],
}

/// Output rows per task: 16 f32 outputs fill one 64-byte cache line, so two threads never
/// write the same line of a token's output row.
const ROWS_PER_TASK: usize = 16;
/// Tokens per tile in prefill: a task's weight rows (16 rows, ~10 KiB for Q5_0 at k = 896)
/// stay in cache while a tile of activations (~8 KiB) streams past them; it is also the
/// width of the tile kernels ([`TILE`]).
const TOKENS_PER_TILE: usize = TILE;
/// Activation bytes of one block range of the tile kernels: with the task's weight rows of
/// that range (~9 KiB for Q4_K) they fit the 32 KiB L1 data cache.
const TILE_ACT_BYTES: usize = 12 * 1024;

/// Encodes `n_tokens` rows of `k` activations in `ty`'s vec_dot type into `out` (resized).
/// Returns the bytes per encoded row.
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

/// Reused per-thread buffers of the matmul's submitting thread.
#[derive(Default)]
struct Scratch {
    /// Encoded activations (grows to the largest batch seen).
    act: Vec<u8>,
    /// The tile kernels' per-block activation facts.
    side: TileSide,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Encodes the activations in `at` into `sc.act` (rows of `arb` bytes) and, when `tiles`,
/// fills `sc.side` for every full tile, in tasks of [`TILE`] tokens over the pool. Returns
/// whether the tile kernels may run (the side table is complete and the rows fit them).
fn prepare(
    at: GgmlType,
    x: &[f32],
    k: usize,
    arb: usize,
    sc: &mut Scratch,
    tiles: bool,
    threads: usize,
) -> KResult<bool> {
    let nt = x.len() / k;
    sc.act.clear();
    sc.act.resize(arb * nt, 0);
    let tiled = tiles && nt >= TILE && sc.side.reset(at, arb, nt);
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
        let xs = &x[task * TILE * k..((task + 1) * TILE).min(nt) * k];
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

/// A raw output pointer shared by tasks that write disjoint elements.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: tasks write disjoint (row, token) elements, and `par_tasks` returns only after every
// task has finished, while the `&mut` the pointer came from is still borrowed.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// The element at `i` (a method, so closures capture the whole `Sync` wrapper).
    fn at(self, i: usize) -> *mut f32 {
        self.0.wrapping_add(i)
    }
}

/// `x`: `[n_tokens][k]`, `out`: `[n_tokens][m]`, optional f32 `bias` of `m`.
pub fn matmul(
    w: &Weight,
    x: &[f32],
    bias: Option<&[f32]>,
    out: &mut [f32],
    threads: usize,
) -> KResult<()> {
    let (k, m) = (w.k, w.m);
    let nt = x.len() / k;
    let wrb =
        w.ty.row_bytes(k as u64)
            .ok_or_else(|| KernelError(format!("{k} is not a whole number of {} blocks", w.ty)))?
            as usize;
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
    let at = quants::vec_dot_type(w.ty);
    let arb = at
        .row_bytes(k as u64)
        .ok_or_else(|| KernelError(format!("{k} activations do not fill whole {at} blocks")))?
        as usize;
    let kernel = dot::RowKernel::for_type(w.ty);
    let tile = kernel.tile(k, wrb, arb);
    // Decode (no full tile): the side kernel with per-row activation facts, where one exists.
    let side = kernel.side(k, wrb, arb).filter(|_| nt < TILE);
    let mut sc = SCRATCH.with(|s| std::mem::take(&mut *s.borrow_mut()));
    let res = prepare(at, x, k, arb, &mut sc, tile.is_some(), threads).and_then(|fit| {
        let side = side.filter(|_| sc.side.fill_rows(at, &sc.act, arb));
        let tile = tile.filter(|_| fit).map(|f| (f, &sc.side));
        let side = side.map(|f| (f, &sc.side));
        rows_times_tokens(w, wrb, &sc.act, arb, nt, (tile, side), out, threads)
    });
    SCRATCH.with(|s| *s.borrow_mut() = sc);
    res?;
    if let Some(b) = bias {
        for row in out.chunks_exact_mut(m) {
            for (o, bv) in row.iter_mut().zip(b) {
                *o += bv;
            }
        }
    }
    Ok(())
}

/// Weight rows per task, a multiple of [`ROWS_PER_TASK`]. Decode (fewer tokens than a tile):
/// [`DECODE_TASKS_PER_THREAD`] tasks per thread, so that each thread streams long contiguous
/// runs of weight rows (the hardware prefetchers start over at every jump, and a 16-row task
/// of a 896-wide Q5_0 matrix is only ~10 KiB) while a preempted thread still holds only a
/// fraction of the work. Prefill: [`ROWS_PER_TASK`], the rows stay in cache for the tokens.
fn rows_per_task(m: usize, nt: usize, threads: usize) -> usize {
    if nt >= TOKENS_PER_TILE || threads <= 1 {
        return ROWS_PER_TASK;
    }
    m.div_ceil(threads * DECODE_TASKS_PER_THREAD)
        .next_multiple_of(ROWS_PER_TASK)
        .max(ROWS_PER_TASK)
}

/// See [`rows_per_task`].
const DECODE_TASKS_PER_THREAD: usize = 8;

/// The tile kernel (full tiles of prefill) and the side kernel (decode), each with the side
/// table it reads, where the matmul uses them.
type SideKernels<'a> = (
    Option<(TileFn, &'a TileSide)>,
    Option<(RowSideFn, &'a TileSide)>,
);

/// Every (weight row, token) dot, one task per [`rows_per_task`] weight rows, tokens in tiles:
/// full tiles through the tile kernel when there is one, the rest per row and token.
#[allow(clippy::too_many_arguments)]
fn rows_times_tokens(
    w: &Weight,
    wrb: usize,
    act: &[u8],
    arb: usize,
    nt: usize,
    (tile, side): SideKernels<'_>,
    out: &mut [f32],
    threads: usize,
) -> KResult<()> {
    let (k, m) = (w.k, w.m);
    let kernel = dot::RowKernel::for_type(w.ty);
    let bare = kernel.bare(k, wrb, arb);
    let bare4 = kernel.bare4(k, wrb, arb);
    // Weight blocks per range of the tile kernels: ~12 KiB of activations (8 tokens).
    let blocks = k / w.ty.block_size() as usize;
    let tile_blocks = (TILE_ACT_BYTES / (TILE * (arb / blocks.max(1)).max(1))).max(1);
    // Enough rows per thread to amortise waking it.
    let threads = threads.min(m.div_ceil(64)).max(1);
    let rows_per_task = rows_per_task(m, nt, threads);
    let n_tasks = m.div_ceil(rows_per_task);
    let outp = OutPtr(out.as_mut_ptr());
    let err: Mutex<Option<KernelError>> = Mutex::new(None);
    par_tasks(n_tasks, threads, |task| {
        let rows = task * rows_per_task..((task + 1) * rows_per_task).min(m);
        let run = || -> KResult<()> {
            for t0 in (0..nt).step_by(TOKENS_PER_TILE) {
                let tokens = t0..(t0 + TOKENS_PER_TILE).min(nt);
                if let Some((f, side)) = tile.filter(|_| tokens.len() == TILE) {
                    let acts = &act[t0 * arb..(t0 + TILE) * arb];
                    let side = side.tile(t0 / TILE);
                    // Blocks in ranges whose activations stay in L1 while every row of the
                    // task uses them; each (row, token) still adds its blocks in order.
                    let mut states = [TileAcc::default(); ROWS_PER_TASK];
                    for b0 in (0..blocks).step_by(tile_blocks) {
                        let range = b0..(b0 + tile_blocks).min(blocks);
                        for (o, state) in rows.clone().zip(states.iter_mut()) {
                            let wr = &w.bytes[o * wrb..(o + 1) * wrb];
                            f(wr, acts, arb, side, range.clone(), state);
                        }
                    }
                    for (o, state) in rows.clone().zip(&states) {
                        for (i, v) in finish_tile(state).into_iter().enumerate() {
                            // SAFETY: as below.
                            unsafe { *outp.at((t0 + i) * m + o) = v };
                        }
                    }
                    continue;
                }
                if let Some((f, table)) = side {
                    // Decode: all of the task's rows per token in one call.
                    let wrs = &w.bytes[rows.start * wrb..rows.end * wrb];
                    for t in tokens.clone() {
                        let a = &act[t * arb..(t + 1) * arb];
                        let (d, sums) = table.row(t);
                        // SAFETY: t < nt and rows.end <= m (see below), so the elements
                        // t * m + rows lie within `out`, and this task alone owns them.
                        let o = unsafe {
                            std::slice::from_raw_parts_mut(outp.at(t * m + rows.start), rows.len())
                        };
                        f(wrs, a, d, sums, o);
                    }
                    continue;
                }
                for o in rows.clone() {
                    let wr = &w.bytes[o * wrb..(o + 1) * wrb];
                    let mut t = tokens.start;
                    if let Some(f4) = bare4 {
                        // 4 tokens per call: the weight row's blocks are unpacked once.
                        while t + 4 <= tokens.end {
                            let a = |i: usize| &act[(t + i) * arb..(t + i + 1) * arb];
                            let v = f4(wr, [a(0), a(1), a(2), a(3)]);
                            for (i, v) in v.into_iter().enumerate() {
                                // SAFETY: as below.
                                unsafe { *outp.at((t + i) * m + o) = v };
                            }
                            t += 4;
                        }
                    }
                    for t in t..tokens.end {
                        let a = &act[t * arb..(t + 1) * arb];
                        let v = match bare {
                            Some(f) => f(wr, a),
                            None => kernel.dot(k, wr, a)?,
                        };
                        // SAFETY: t < nt and o < m, checked `out.len() >= nt * m` above; this
                        // task alone owns rows `rows` of every token.
                        unsafe { *outp.at(t * m + o) = v };
                    }
                }
            }
            Ok(())
        };
        if let Err(e) = run() {
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
