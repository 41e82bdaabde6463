//! Tiled flash attention over the KV regions: online softmax, K and V read in their storage
//! type by the row kernels of [`crate::simd::attn`].
//!
//! Work is cut into (KV head, query tile) pairs: a tile is up to [`TILE_TOKENS`] consecutive
//! tokens times the query heads of one GQA group, so every K/V cell a block loads serves all of
//! them while it is in L1. Each row (token, head) has its own span `[lo, hi)`; cells outside
//! it are never read for that row, and a block no row of the tile needs is skipped.
//!
//! Float order, and why results do not depend on threads or tiles: a row's cells are cut into
//! windows of [`WINDOW`] cells at absolute cell multiples. Within a window the online softmax
//! runs block by block ([`BLOCK`] cells, also at absolute multiples): scores, block max, a
//! rescale of the accumulator when the max grows, `exp`, sum, weighted V. Each window starts
//! from an empty state, and the window states are merged in cell order. A row's result is
//! therefore a function of its query, its span and the cells alone, so splitting a long
//! context's windows across threads (decode) gives the same bits as running them in one task.
//!
//! Scores are f64 (products of f32 values are exact there; the row kernels sum them in f64):
//! real models have large query/key components (Qwen2.5's queries reach ~82), where an f32
//! score's own rounding (ulp 8e-6 at 64) is a relative error of the softmax weight (measured:
//! up to 3.7e-5 of max |V| off exact attention on the greedy prompts with f32 scores). With
//! f32 scores the greedy gate against llama.cpp (`engine/tests/greedy_real.rs`) moved one
//! probability by 0.06 (qwen `chinese_ai_future` step 3); with f64 scores it gives the value of
//! an all-f64 attention. Weights, the accumulator and V stay f32.

use super::{AttnParams, KResult, KernelError};
use crate::simd::attn::KvKernels;
use crate::threads::par_tasks;
use std::cell::RefCell;
use std::sync::Mutex;

/// Cells per score block.
pub const BLOCK: usize = 32;
/// Cells per softmax window (the unit of the cross-thread split).
pub const WINDOW: usize = 512;
/// Consecutive tokens per query tile.
const TILE_TOKENS: usize = 8;

/// One attention call, validated.
pub(super) struct Call<'a> {
    pub p: &'a AttnParams,
    pub kern: KvKernels,
    pub q: &'a [f32],
    /// Per token `[lo, hi)`, inside the regions.
    pub spans: Vec<(usize, usize)>,
    pub k: &'a [u8],
    pub v: &'a [u8],
    /// Bytes of one cell (all KV heads) and of one head.
    pub cell_bytes: usize,
    pub head_bytes: usize,
}

/// Online-softmax state of a tile's rows: running max, sum of weights, weighted V sum.
#[derive(Default)]
struct State {
    m: Vec<f64>,
    l: Vec<f64>,
    acc: Vec<f32>,
}

impl State {
    fn reset(&mut self, rows: usize, hd: usize) {
        self.m.clear();
        self.m.resize(rows, f64::NEG_INFINITY);
        self.l.clear();
        self.l.resize(rows, 0.0);
        self.acc.clear();
        self.acc.resize(rows * hd, 0.0);
    }

    /// Folds `part` (a later window of the same rows) into `self`. Merging into an empty
    /// state copies `part` exactly (its weights are scaled by `exp(0) = 1`).
    fn merge(&mut self, part: &State, hd: usize) {
        for r in 0..self.m.len() {
            if part.l[r] == 0.0 {
                continue;
            }
            let m = self.m[r].max(part.m[r]);
            let (a, b) = ((self.m[r] - m).exp(), (part.m[r] - m).exp());
            self.m[r] = m;
            self.l[r] = self.l[r] * a + part.l[r] * b;
            let (a, b) = (a as f32, b as f32);
            let acc = &mut self.acc[r * hd..(r + 1) * hd];
            for (x, &y) in acc.iter_mut().zip(&part.acc[r * hd..(r + 1) * hd]) {
                *x = *x * a + y * b;
            }
        }
    }
}

/// A tile: KV head `g`, tokens `t0..t1`; rows are `(t - t0) * group + (h - g * group)`.
#[derive(Clone, Copy)]
struct Tile {
    g: usize,
    t0: usize,
    t1: usize,
}

impl Call<'_> {
    fn hd(&self) -> usize {
        self.p.head_dim
    }

    fn group(&self) -> usize {
        self.p.n_head / self.p.n_head_kv
    }

    fn rows(&self, tile: Tile) -> usize {
        (tile.t1 - tile.t0) * self.group()
    }

    /// The windows some row of `tile` reaches (empty when every span is empty).
    fn windows(&self, tile: Tile) -> std::ops::Range<usize> {
        let live = self.spans[tile.t0..tile.t1].iter().filter(|s| s.0 < s.1);
        let lo = live.clone().map(|s| s.0).min();
        let hi = live.map(|s| s.1).max();
        match (lo, hi) {
            (Some(lo), Some(hi)) => lo / WINDOW..(hi - 1) / WINDOW + 1,
            _ => 0..0,
        }
    }

    /// The state of `tile`'s rows over window `w` alone, into `st`.
    fn window(&self, tile: Tile, w: usize, st: &mut State, buf: &mut Buffers) {
        let (hd, group) = (self.hd(), self.group());
        st.reset(self.rows(tile), hd);
        let head_off = tile.g * self.head_bytes;
        let row_len = self.p.n_head * hd;
        let clip = |t: usize| {
            let (lo, hi) = self.spans[t];
            (lo.max(w * WINDOW), hi.min((w + 1) * WINDOW))
        };
        let (mut first, mut last) = (usize::MAX, 0);
        for t in tile.t0..tile.t1 {
            let (lo, hi) = clip(t);
            if lo < hi {
                first = first.min(lo);
                last = last.max(hi);
            }
        }
        if first >= last {
            return;
        }
        let mut b0 = first / BLOCK * BLOCK;
        while b0 < last {
            let b1 = b0 + BLOCK;
            for t in tile.t0..tile.t1 {
                let (lo, hi) = clip(t);
                let (a, z) = (lo.max(b0), hi.min(b1));
                if a >= z {
                    continue;
                }
                let n = z - a;
                let k = &self.k[a * self.cell_bytes + head_off..];
                let v = &self.v[a * self.cell_bytes + head_off..];
                for hh in 0..group {
                    let r = (t - tile.t0) * group + hh;
                    let h = tile.g * group + hh;
                    let q = &self.q[t * row_len + h * hd..t * row_len + (h + 1) * hd];
                    let s = &mut buf.scores[..n];
                    (self.kern.scores)(q, k, self.cell_bytes, s);
                    let scale = self.p.scale as f64;
                    let mut mx = f64::NEG_INFINITY;
                    for x in s.iter_mut() {
                        *x *= scale;
                        mx = mx.max(*x);
                    }
                    let acc = &mut st.acc[r * hd..(r + 1) * hd];
                    if mx > st.m[r] {
                        // The running max grew: earlier weights were relative to the old one.
                        let alpha = (st.m[r] - mx).exp();
                        if st.l[r] != 0.0 {
                            let alpha = alpha as f32;
                            acc.iter_mut().for_each(|x| *x *= alpha);
                        }
                        st.l[r] *= alpha;
                        st.m[r] = mx;
                    }
                    let m = st.m[r];
                    let mut sum = 0f64;
                    let w = &mut buf.weights[..n];
                    for (x, w) in s.iter().zip(w.iter_mut()) {
                        let e = (x - m).exp();
                        sum += e;
                        *w = e as f32;
                    }
                    st.l[r] += sum;
                    (self.kern.accum)(acc, v, self.cell_bytes, w);
                }
            }
            b0 = b1;
        }
    }

    /// Writes `tile`'s rows of the normalised result from the merged state.
    fn write(&self, tile: Tile, st: &State, out: OutPtr) {
        let (hd, group) = (self.hd(), self.group());
        let row_len = self.p.n_head * hd;
        for t in tile.t0..tile.t1 {
            for hh in 0..group {
                let r = (t - tile.t0) * group + hh;
                let h = tile.g * group + hh;
                // SAFETY: row (t, h) of `out` belongs to this tile alone (tiles partition
                // tokens x KV heads), `attention` checked `out` holds every row, and the tasks
                // finish before `attention` returns.
                let o = unsafe { std::slice::from_raw_parts_mut(out.at(t * row_len + h * hd), hd) };
                let l = st.l[r];
                let acc = &st.acc[r * hd..(r + 1) * hd];
                if l > 0.0 {
                    let inv = (1.0 / l) as f32;
                    o.iter_mut().zip(acc).for_each(|(o, &a)| *o = a * inv);
                } else {
                    // An empty span (or all weights underflowed): no cell contributes.
                    o.fill(0.0);
                }
            }
        }
    }
}

/// One block's scores (f64: see the module notes) and weights.
struct Buffers {
    scores: [f64; BLOCK],
    weights: [f32; BLOCK],
}

thread_local! {
    /// A window's state, the merged state, and one block's buffers, reused across tasks.
    static SCRATCH: RefCell<(State, State, Buffers)> = const {
        RefCell::new((
            State { m: Vec::new(), l: Vec::new(), acc: Vec::new() },
            State { m: Vec::new(), l: Vec::new(), acc: Vec::new() },
            Buffers { scores: [0.0; BLOCK], weights: [0.0; BLOCK] },
        ))
    };
}

/// Runs the attention of `c` into `out` (`[n_tokens][n_head * head_dim]`, length checked by
/// the caller) on up to `threads` threads.
pub(super) fn run(c: &Call, out: &mut [f32], threads: usize) -> KResult<()> {
    let nt = c.spans.len();
    let hd = c.hd();
    let mut tiles = Vec::new();
    for g in 0..c.p.n_head_kv {
        for t0 in (0..nt).step_by(TILE_TOKENS) {
            tiles.push(Tile {
                g,
                t0,
                t1: (t0 + TILE_TOKENS).min(nt),
            });
        }
    }
    let needed = nt * c.p.n_head * hd;
    if out.len() < needed {
        return Err(KernelError(format!(
            "attention output holds {} values, {nt} tokens need {needed}",
            out.len()
        )));
    }
    let outp = OutPtr(out.as_mut_ptr());
    let longest = tiles.iter().map(|&t| c.windows(t).len()).max().unwrap_or(0);
    if threads <= 1 || tiles.len() >= 2 * threads || longest <= 1 {
        // Enough tiles to keep every thread busy: one task per tile, windows in order.
        par_tasks(tiles.len(), threads, |i| {
            SCRATCH.with(|s| {
                let mut s = s.borrow_mut();
                let (part, total, buf) = &mut *s;
                total.reset(c.rows(tiles[i]), hd);
                for w in c.windows(tiles[i]) {
                    c.window(tiles[i], w, part, buf);
                    total.merge(part, hd);
                }
                c.write(tiles[i], total, outp);
            })
        });
        return Ok(());
    }
    // Few tiles over a long context (decode): one task per (tile, window), then the same
    // in-order merge per tile.
    let items: Vec<(usize, usize)> = tiles
        .iter()
        .enumerate()
        .flat_map(|(i, &t)| c.windows(t).map(move |w| (i, w)))
        .collect();
    let parts: Vec<Mutex<State>> = items.iter().map(|_| Mutex::default()).collect();
    par_tasks(items.len(), threads, |j| {
        let (i, w) = items[j];
        let mut part = parts[j].lock().unwrap_or_else(|e| e.into_inner());
        SCRATCH.with(|s| c.window(tiles[i], w, &mut part, &mut s.borrow_mut().2));
    });
    par_tasks(tiles.len(), threads, |i| {
        let mut total = State::default();
        total.reset(c.rows(tiles[i]), hd);
        for (j, _) in items.iter().enumerate().filter(|(_, it)| it.0 == i) {
            total.merge(&parts[j].lock().unwrap_or_else(|e| e.into_inner()), hd);
        }
        c.write(tiles[i], &total, outp);
    });
    Ok(())
}

/// A raw output pointer shared by tasks that write disjoint rows.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: see `Call::write`: tasks write disjoint rows and finish before `run` returns.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// The element at `i` (a method, so closures capture the whole `Sync` wrapper).
    fn at(self, i: usize) -> *mut f32 {
        self.0.wrapping_add(i)
    }
}
