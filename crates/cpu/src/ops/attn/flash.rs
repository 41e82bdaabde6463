//! Tiled flash attention over the KV regions: online softmax, K and V read in their storage
//! type by the row kernels of [`crate::simd::attn`].
//!
//! Work is cut into (KV head, query tile) pairs: a tile is up to [`TILE_TOKENS`] consecutive
//! tokens whose windows start at the same cell (in practice: of one sequence) times the query
//! heads of one GQA group, so every K/V cell a block loads serves all of them while it is in
//! L1. Each row (token, head) reads only the cells its window lists.
//!
//! Float order, and why a row's result depends on nothing but its query and the K/V values its
//! window lists, in order: the row's cells are indexed logically, `0..len` along its runs
//! concatenated, and cut into windows of [`WINDOW`] and blocks of [`BLOCK`] at logical
//! multiples (never at cell multiples, so the same values at other cells, or split into other
//! runs, give the same bits). Within a window the online softmax runs block by block: scores,
//! block max, a rescale of the accumulator when the max grows, `exp`, sum, weighted V. A block
//! that crosses a run boundary is one list of cells for the row kernels, which treat a list
//! exactly as a contiguous run (the scores' 4-cell grouping counts from the block's start; the
//! accumulation is one chain per lane in list order). Each window starts from an empty state,
//! and the window states are merged in logical order. Other rows share loads, never
//! arithmetic, so neither the tiles nor the rows around a row, nor splitting a long context's
//! windows across threads (decode), change a bit. With one run starting at cell 0 (cell ==
//! position, as before kv maps) the blocks and windows are the absolute ones of that layout.
//!
//! Scores are f64 (products of f32 values are exact there; the row kernels sum them in f64):
//! real models have large query/key components (Qwen2.5's queries reach ~82), where an f32
//! score's own rounding (ulp 8e-6 at 64) is a relative error of the softmax weight (measured:
//! up to 3.7e-5 of max |V| off exact attention on the greedy prompts with f32 scores). With
//! f32 scores the greedy gate against llama.cpp (`engine/tests/greedy_real.rs`) moved one
//! probability by 0.06 (qwen `chinese_ai_future` step 3); with f64 scores it gives the value of
//! an all-f64 attention. Weights, the accumulator and V stay f32.

use super::{Call, KResult};
use crate::threads::{par_tasks, SharedOut};
use std::cell::RefCell;
use std::sync::Mutex;

/// Cells per score block.
pub const BLOCK: usize = 32;
/// Cells per softmax window (the unit of the cross-thread split).
pub const WINDOW: usize = 512;
/// Consecutive tokens per query tile.
const TILE_TOKENS: usize = 8;

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

    /// Token `t`'s cells in grid coordinates: logical indices plus its phase.
    fn grid(&self, t: usize) -> (usize, usize) {
        let ph = self.phase.get(t).copied().unwrap_or(0);
        (ph, ph + self.windows[t].len())
    }

    /// The windows some row of `tile` reaches (empty when every window is).
    fn windows(&self, tile: Tile) -> std::ops::Range<usize> {
        let live = (tile.t0..tile.t1)
            .map(|t| self.grid(t))
            .filter(|g| g.0 < g.1);
        let lo = live.clone().map(|g| g.0).min();
        let hi = live.map(|g| g.1).max();
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
            let (lo, hi) = self.grid(t);
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
                // The block's cells, as byte offsets of KV head `g`, in logical order.
                let ph = self.grid(t).0;
                let mut j = 0;
                for (cell, len) in self.windows[t].pieces(a - ph..z - ph) {
                    for (o, c) in buf.cells[j..j + len].iter_mut().zip(cell..) {
                        *o = c * self.cell_bytes + head_off;
                    }
                    j += len;
                }
                let cells = &buf.cells[..n];
                for hh in 0..group {
                    let r = (t - tile.t0) * group + hh;
                    let h = tile.g * group + hh;
                    let q = &self.q[t * row_len + h * hd..t * row_len + (h + 1) * hd];
                    let s = &mut buf.scores[..n];
                    (self.kern.scores)(q, self.k, cells, s);
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
                    (self.kern.accum)(acc, self.v, cells, w);
                }
            }
            b0 = b1;
        }
    }

    /// Writes `tile`'s rows of the normalised result from the merged state.
    fn write(&self, tile: Tile, st: &State, out: &SharedOut) {
        let (hd, group) = (self.hd(), self.group());
        let row_len = self.p.n_head * hd;
        for t in tile.t0..tile.t1 {
            for hh in 0..group {
                let r = (t - tile.t0) * group + hh;
                let h = tile.g * group + hh;
                // SAFETY: row (t, h) of `out` belongs to this tile alone (tiles partition
                // tokens x KV heads) and every task writes only its tile's rows.
                let o = unsafe { out.part(t * row_len + h * hd, hd) };
                let l = st.l[r];
                let acc = &st.acc[r * hd..(r + 1) * hd];
                if l > 0.0 {
                    let inv = (1.0 / l) as f32;
                    o.iter_mut().zip(acc).for_each(|(o, &a)| *o = a * inv);
                } else {
                    // An empty window (or all weights underflowed): no cell contributes.
                    o.fill(0.0);
                }
            }
        }
    }
}

/// One block's cells (byte offsets), scores (f64: see the module notes) and weights.
struct Buffers {
    cells: [usize; BLOCK],
    scores: [f64; BLOCK],
    weights: [f32; BLOCK],
}

thread_local! {
    /// A window's state, the merged state, and one block's buffers, reused across tasks.
    static SCRATCH: RefCell<(State, State, Buffers)> = const {
        RefCell::new((
            State { m: Vec::new(), l: Vec::new(), acc: Vec::new() },
            State { m: Vec::new(), l: Vec::new(), acc: Vec::new() },
            Buffers { cells: [0; BLOCK], scores: [0.0; BLOCK], weights: [0.0; BLOCK] },
        ))
    };
}

/// The query tiles: per KV head, runs of up to [`TILE_TOKENS`] consecutive tokens whose
/// windows begin at the same cell (rows that can share the loads of a block).
fn tiles(c: &Call) -> Vec<Tile> {
    let first = |t: usize| c.windows[t].runs().first().map(|r| r.cell);
    let mut spans = Vec::new();
    let mut t0 = 0;
    for t in 1..=c.n_tokens() {
        if t == c.n_tokens() || t - t0 == TILE_TOKENS || first(t) != first(t0) {
            spans.push((t0, t));
            t0 = t;
        }
    }
    (0..c.p.n_head_kv)
        .flat_map(|g| spans.iter().map(move |&(t0, t1)| Tile { g, t0, t1 }))
        .collect()
}

/// Runs the attention of `c` into `out` (`[n_tokens][n_head * head_dim]`) on up to `threads`
/// threads.
pub(super) fn run(c: &Call, out: &mut [f32], threads: usize) -> KResult<()> {
    c.check_out(out)?;
    let hd = c.hd();
    let tiles = tiles(c);
    let outp = SharedOut::new(out);
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
                c.write(tiles[i], total, &outp);
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
        c.write(tiles[i], &total, &outp);
    });
    Ok(())
}
