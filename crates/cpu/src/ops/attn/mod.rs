//! KV storage and GQA attention over the persistent K/V regions.
//!
//! A region holds `n_ctx` cells; a cell is one row of `n_head_kv * head_dim` values in the
//! cache type (F32, F16 or Q8_0; Q8_0 needs `head_dim % 32 == 0` so heads are whole blocks).
//!
//! # Windows
//!
//! Each query attends to its window: a list of [`Run`]s of cells (at most
//! [`KV_MAP_RUNS`]), in position order. The graph gives it in one of two layouts, told apart
//! by the window input's size ([`parse_windows`]): a span `[2, n]` (per query `[lo, hi)`, one
//! run) or a kv map `[2 * KV_MAP_RUNS, n]` (per query `(cell, len)` runs, unused ones of length
//! 0). The cells a window lists, concatenated, are the row's *logical* sequence `0..len`.
//!
//! # Which kernel runs
//!
//! | numerics | cache | query rows in the call | kernel | batch invariant |
//! |---|---|---|---|---|
//! | native | F32, Q8_0 | any | [`flash`]: blocks and windows at logical multiples, f64 scores | yes |
//! | native | F16 | any | `llamacpp_x86::attn_f16::attend_head` (run as `attend_group` per GQA group, a group cut into parts of heads when (token, KV head) pairs are fewer than the threads; AVX-512 kernels for head sizes that are multiples of 32, else AVX2: the same bits; a prompt's rows, whose windows are prefixes of one another, by tiles of up to `attn_f16::TILE_ROWS` rows sharing each cell's K/V loads, `attend_tile_on`: the same bits again): llama.cpp's one-chunk arithmetic (f16 Q, f16 V accumulator), cells in logical order | yes |
//! | llamacpp-x86-* | F16 | < 64 ([`attn_f16::GGML_FA_TILE_Q`]) | `attend_head` / `attend_group` (AVX2 build), `attend_head_with(dot16_ref)` (AVX-512 build) | no: switches at 64 rows |
//! | llamacpp-x86-* | F16 | >= 64 | `attend_head_tiled`: llama.cpp's tiled f32 kernel, 64-cell tiles at logical multiples | no: switches at 64 rows |
//! | llamacpp-x86-* | F32, Q8_0 | any | refused (typed error) | - |
//!
//! "Batch invariant": a row's output bits are a function of its query and of the K/V values
//! its window lists, in order, alone: not of which cells hold them, of the other rows of the
//! call, their number or order, nor of the thread count. The llama.cpp arithmetic copies
//! llama.cpp, which picks its kernel by the batch's row count, so the same row rounds
//! differently in a forward of 63 rows and one of 64 (see docs/PRECISION.md).

mod flash;

pub use flash::{BLOCK, WINDOW};
pub use minfer_graph::KV_MAP_RUNS;

use super::{as_i32, KResult, KernelError};
use crate::llamacpp_x86::attn_f16;
use crate::simd::attn::KvKernels;
use crate::simd::Isa;
use minfer_gguf::{quants, GgmlType};
use std::fmt;

/// Values per query of the span layout (`InputKind::AttnSpan`: `[lo, hi)`).
pub const SPAN_WIDTH: usize = 2;
/// Values per query of the kv-map layout (`InputKind::KvMap`: `KV_MAP_RUNS` `(cell, len)`).
pub const KV_MAP_WIDTH: usize = 2 * KV_MAP_RUNS;

/// Bytes of one cell.
pub fn cell_bytes(ty: GgmlType, n_embd_kv: usize) -> KResult<usize> {
    ty.row_bytes(n_embd_kv as u64)
        .map(|b| b as usize)
        .ok_or_else(|| KernelError(format!("KV row of {n_embd_kv} is not whole {ty} blocks")))
}

/// Writes `x` rows (`[n_tokens][n_embd_kv]`) into `region` at `cells`.
pub fn kv_store(
    ty: GgmlType,
    x: &[f32],
    n_embd_kv: usize,
    cells: &[f32],
    region: &mut [u8],
) -> KResult<()> {
    let cb = cell_bytes(ty, n_embd_kv)?;
    let n_cells = region.len() / cb;
    for (xr, &c) in x.chunks_exact(n_embd_kv).zip(cells) {
        let c = as_i32(c);
        if c < 0 || c as usize >= n_cells {
            return Err(KernelError(format!(
                "KV cell {c} out of range 0..{n_cells}"
            )));
        }
        let c = c as usize;
        quants::quantize_row(ty, xr, &mut region[c * cb..(c + 1) * cb])?;
    }
    Ok(())
}

/// `len` consecutive cells from `cell`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Run {
    pub cell: usize,
    pub len: usize,
}

/// One query's window: up to [`KV_MAP_RUNS`] disjoint non-empty runs, in the order the row
/// reads them (position order). Its logical index `i` (in `0..len()`) is the `i`-th cell of
/// the runs concatenated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Window {
    /// `runs[..n_runs]` are used; the rest are `Run::default()` (so `==` compares windows).
    runs: [Run; KV_MAP_RUNS],
    n_runs: usize,
    len: usize,
}

impl Window {
    /// The cells `[lo, hi)` (empty when `hi <= lo`).
    pub fn span(lo: usize, hi: usize) -> Window {
        let mut w = Window::default();
        if hi > lo {
            w.runs[0] = Run {
                cell: lo,
                len: hi - lo,
            };
            w.n_runs = 1;
            w.len = hi - lo;
        }
        w
    }

    /// The window of `runs` in order; empty runs are dropped. Refuses more than
    /// [`KV_MAP_RUNS`] non-empty runs and runs that share a cell.
    pub fn from_runs(runs: &[Run]) -> Result<Window, WindowError> {
        let live: Vec<Run> = runs.iter().copied().filter(|r| r.len > 0).collect();
        if live.len() > KV_MAP_RUNS {
            return Err(WindowError::TooManyRuns { runs: live.len() });
        }
        for (i, a) in live.iter().enumerate() {
            for (j, b) in live.iter().enumerate().skip(i + 1) {
                if a.cell < b.cell + b.len && b.cell < a.cell + a.len {
                    return Err(WindowError::Overlap {
                        token: None,
                        first: (i, *a),
                        second: (j, *b),
                    });
                }
            }
        }
        let mut w = Window::default();
        for (slot, r) in w.runs.iter_mut().zip(&live) {
            *slot = *r;
        }
        w.n_runs = live.len();
        w.len = live.iter().map(|r| r.len).sum();
        Ok(w)
    }

    /// The non-empty runs, in order.
    pub fn runs(&self) -> &[Run] {
        &self.runs[..self.n_runs]
    }

    /// Cells listed (the logical length).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// One past the highest cell listed (0 when empty).
    pub fn end(&self) -> usize {
        self.runs()
            .iter()
            .map(|r| r.cell + r.len)
            .max()
            .unwrap_or(0)
    }

    /// Whether this window's cells are the first `len()` of `other`'s, in order (judged by
    /// the runs: a window cut into other runs than `other`'s may be answered `false`).
    pub fn is_prefix_of(&self, other: &Window) -> bool {
        let (a, b) = (self.runs(), other.runs());
        let Some((last, init)) = a.split_last() else {
            return true;
        };
        a.len() <= b.len()
            && init == &b[..init.len()]
            && b[init.len()].cell == last.cell
            && b[init.len()].len >= last.len
    }

    /// The cells in logical order.
    pub fn cells(&self) -> Cells<'_> {
        Cells {
            runs: self.runs(),
            cur: 0,
            end: 0,
        }
    }

    /// The cell of logical index `i`.
    ///
    /// # Panics
    /// When `i >= len()`.
    pub fn cell(&self, i: usize) -> usize {
        let mut i = i;
        for r in self.runs() {
            if i < r.len {
                return r.cell + i;
            }
            i -= r.len;
        }
        panic!("logical index past a window of {} cells", self.len)
    }

    /// The logical range `range` as pieces `(first cell, cells)` of consecutive cells, in
    /// order (a piece ends where a run does).
    pub fn pieces(
        &self,
        range: std::ops::Range<usize>,
    ) -> impl Iterator<Item = (usize, usize)> + '_ {
        let mut start = 0;
        self.runs().iter().filter_map(move |r| {
            let (s, e) = (start, start + r.len);
            start = e;
            let (a, z) = (range.start.max(s), range.end.min(e));
            (a < z).then(|| (r.cell + (a - s), z - a))
        })
    }
}

/// The cells of a [`Window`] in logical order (one compare per cell within a run).
#[derive(Clone, Debug)]
pub struct Cells<'a> {
    /// The runs after the current one.
    runs: &'a [Run],
    /// The current run's next cell and end.
    cur: usize,
    end: usize,
}

impl Iterator for Cells<'_> {
    type Item = usize;

    #[inline]
    fn next(&mut self) -> Option<usize> {
        if self.cur == self.end {
            let (r, rest) = self.runs.split_first()?;
            self.runs = rest;
            (self.cur, self.end) = (r.cell, r.cell + r.len);
        }
        self.cur += 1;
        Some(self.cur - 1)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.end - self.cur + self.runs.iter().map(|r| r.len).sum::<usize>();
        (n, Some(n))
    }
}

impl ExactSizeIterator for Cells<'_> {}

/// A window input the kernels refuse.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WindowError {
    /// The input is neither `[2, n]` nor `[2 * KV_MAP_RUNS, n]` for the call's `n` queries.
    Layout { values: usize, n_tokens: usize },
    /// A span with `lo < 0`, `hi < lo` or `hi` past the region.
    Span {
        token: usize,
        lo: i32,
        hi: i32,
        n_cells: usize,
    },
    /// A kv-map run with a negative length.
    NegativeRun { token: usize, run: usize, len: i32 },
    /// A kv-map run that does not lie inside the region.
    RunOutside {
        token: usize,
        run: usize,
        cell: i32,
        len: i32,
        n_cells: usize,
    },
    /// Two runs of one window share cells (`(index, run)` each; `token` when from an input).
    Overlap {
        token: Option<usize>,
        first: (usize, Run),
        second: (usize, Run),
    },
    /// More than [`KV_MAP_RUNS`] non-empty runs.
    TooManyRuns { runs: usize },
}

impl fmt::Display for WindowError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WindowError::Layout { values, n_tokens } => write!(
                f,
                "attention window of {values} values for {n_tokens} queries: neither a span \
                 ({SPAN_WIDTH} per query) nor a kv map ({KV_MAP_WIDTH} per query)"
            ),
            WindowError::Span {
                token,
                lo,
                hi,
                n_cells,
            } => write!(
                f,
                "query {token}: attention span [{lo}, {hi}) outside the region's cells \
                 0..{n_cells}"
            ),
            WindowError::NegativeRun { token, run, len } => {
                write!(
                    f,
                    "query {token}: kv map run {run} has negative length {len}"
                )
            }
            WindowError::RunOutside {
                token,
                run,
                cell,
                len,
                n_cells,
            } => write!(
                f,
                "query {token}: kv map run {run} (cell {cell}, {len} cells) outside the \
                 region's cells 0..{n_cells}"
            ),
            WindowError::Overlap {
                token,
                first,
                second,
            } => {
                if let Some(t) = token {
                    write!(f, "query {t}: ")?;
                }
                write!(
                    f,
                    "kv map runs {} (cells {}..{}) and {} (cells {}..{}) overlap",
                    first.0,
                    first.1.cell,
                    first.1.cell + first.1.len,
                    second.0,
                    second.1.cell,
                    second.1.cell + second.1.len
                )
            }
            WindowError::TooManyRuns { runs } => write!(
                f,
                "a window of {runs} runs: at most {KV_MAP_RUNS} are supported"
            ),
        }
    }
}

impl std::error::Error for WindowError {}

impl From<WindowError> for KernelError {
    fn from(e: WindowError) -> Self {
        KernelError(e.to_string())
    }
}

/// The windows of `n_tokens` queries from the window input `values` (i32 bits in f32 slots):
/// `2 * n_tokens` values are spans, `2 * KV_MAP_RUNS * n_tokens` a kv map. Every run must lie
/// inside the `n_cells` cells of the region.
pub fn parse_windows(
    values: &[f32],
    n_tokens: usize,
    n_cells: usize,
) -> Result<Vec<Window>, WindowError> {
    let layout = WindowError::Layout {
        values: values.len(),
        n_tokens,
    };
    if n_tokens == 0 {
        return if values.is_empty() {
            Ok(Vec::new())
        } else {
            Err(layout)
        };
    }
    if values.len() == SPAN_WIDTH * n_tokens {
        return values
            .chunks_exact(SPAN_WIDTH)
            .enumerate()
            .map(|(token, s)| {
                let (lo, hi) = (as_i32(s[0]), as_i32(s[1]));
                if lo < 0 || hi < lo || hi as usize > n_cells {
                    return Err(WindowError::Span {
                        token,
                        lo,
                        hi,
                        n_cells,
                    });
                }
                Ok(Window::span(lo as usize, hi as usize))
            })
            .collect();
    }
    if values.len() != KV_MAP_WIDTH * n_tokens {
        return Err(layout);
    }
    values
        .chunks_exact(KV_MAP_WIDTH)
        .enumerate()
        .map(|(token, m)| {
            let mut runs = [Run::default(); KV_MAP_RUNS];
            for (run, (slot, pair)) in runs.iter_mut().zip(m.chunks_exact(2)).enumerate() {
                let (cell, len) = (as_i32(pair[0]), as_i32(pair[1]));
                if len < 0 {
                    return Err(WindowError::NegativeRun { token, run, len });
                }
                if len == 0 {
                    continue;
                }
                if cell < 0 || cell as usize + len as usize > n_cells {
                    return Err(WindowError::RunOutside {
                        token,
                        run,
                        cell,
                        len,
                        n_cells,
                    });
                }
                *slot = Run {
                    cell: cell as usize,
                    len: len as usize,
                };
            }
            Window::from_runs(&runs).map_err(|e| match e {
                WindowError::Overlap { first, second, .. } => WindowError::Overlap {
                    token: Some(token),
                    first,
                    second,
                },
                e => e,
            })
        })
        .collect()
}

pub struct AttnParams {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub scale: f32,
    pub cache_type: GgmlType,
    /// `Some`: llama.cpp's x86 flash-attention arithmetic of that build (f16 caches only).
    pub llamacpp: Option<crate::llamacpp_x86::LlamaCppX86>,
}

/// `q`/`out`: `[n_tokens][n_head * head_dim]`; `window`: the window input, `[n_tokens][2]`
/// spans or `[n_tokens][2 * KV_MAP_RUNS]` kv-map runs (see [`parse_windows`]). The kernel is
/// chosen by the table in the module docs.
///
/// Flash (native F32 / Q8_0) is a tolerance class, not bit-identical to a two-pass softmax:
/// scores are f64 sums of exact products, but the online softmax rescales its f32 accumulator
/// when the running max grows, merges per-window states and accumulates V in FMA lanes, so
/// results differ from exact attention over the stored K/V values by f32 rounding (relative
/// ~1e-7 to 1e-6, `tests/attn_flash.rs`). No kernel's result depends on the thread count.
pub fn attention(
    p: &AttnParams,
    q: &[f32],
    window: &[f32],
    k: &[u8],
    v: &[u8],
    out: &mut [f32],
    threads: usize,
) -> KResult<()> {
    if let Some(simd) = p.llamacpp {
        if p.cache_type != GgmlType::F16 {
            return Err(KernelError(format!(
                "llama.cpp x86 numerics cover attention over an f16 KV cache, not {}",
                p.cache_type
            )));
        }
        let call = prepare(Isa::Scalar, p, q, window, k, v)?;
        return attn_f16::run(Some(simd), &call, out, threads);
    }
    if p.cache_type == GgmlType::F16 {
        // One arithmetic for every row count (batch invariance): llama.cpp's one-chunk kernel.
        let call = prepare(Isa::Scalar, p, q, window, k, v)?;
        return attn_f16::run(None, &call, out, threads);
    }
    attention_on(crate::simd::detected(), p, q, window, k, v, out, threads)
}

/// The [`flash`] kernel with the row kernels of `isa`, whatever the cache type (tests,
/// benchmarks); an instruction set this machine lacks is an error.
#[allow(clippy::too_many_arguments)]
pub fn attention_on(
    isa: Isa,
    p: &AttnParams,
    q: &[f32],
    window: &[f32],
    k: &[u8],
    v: &[u8],
    out: &mut [f32],
    threads: usize,
) -> KResult<()> {
    let call = prepare(isa, p, q, window, k, v)?;
    flash::run(&call, out, threads)
}

/// A control for tests, not a kernel to use: [`attention_on`] with each row's blocks and
/// windows counted from its first run's absolute cell (the layout-dependent blocking the
/// flash kernel had when cell and position were the same), so that a test can show that this
/// blocking changes results with the placement. For windows starting at cell 0 it is
/// [`attention_on`].
#[doc(hidden)]
#[allow(clippy::too_many_arguments)]
pub fn attention_absolute_blocks_control(
    isa: Isa,
    p: &AttnParams,
    q: &[f32],
    window: &[f32],
    k: &[u8],
    v: &[u8],
    out: &mut [f32],
    threads: usize,
) -> KResult<()> {
    let mut call = prepare(isa, p, q, window, k, v)?;
    call.phase = call
        .windows
        .iter()
        .map(|w| w.runs().first().map_or(0, |r| r.cell % WINDOW))
        .collect();
    flash::run(&call, out, threads)
}

/// One attention call, validated: what every kernel needs.
pub(crate) struct Call<'a> {
    pub p: &'a AttnParams,
    pub kern: KvKernels,
    pub q: &'a [f32],
    /// Per token its window, inside the regions.
    pub windows: Vec<Window>,
    /// Per token an offset added to its logical indices before they are cut into blocks and
    /// windows (empty: 0 for every token; only [`attention_absolute_blocks_control`] sets it).
    pub phase: Vec<usize>,
    pub k: &'a [u8],
    pub v: &'a [u8],
    /// Bytes of one cell (all KV heads) and of one head.
    pub cell_bytes: usize,
    pub head_bytes: usize,
}

impl Call<'_> {
    pub fn n_tokens(&self) -> usize {
        self.windows.len()
    }

    /// Checks that `out` holds every row of the call.
    pub fn check_out(&self, out: &[f32]) -> KResult<()> {
        let nt = self.n_tokens();
        let needed = nt * self.p.n_head * self.p.head_dim;
        if out.len() < needed {
            return Err(KernelError(format!(
                "attention output holds {} values, {nt} tokens need {needed}",
                out.len()
            )));
        }
        Ok(())
    }
}

/// Checks shapes and windows and gathers what a kernel needs.
fn prepare<'a>(
    isa: Isa,
    p: &'a AttnParams,
    q: &'a [f32],
    window: &[f32],
    k: &'a [u8],
    v: &'a [u8],
) -> KResult<Call<'a>> {
    let hd = p.head_dim;
    if p.n_head_kv == 0 || hd == 0 || !p.n_head.is_multiple_of(p.n_head_kv) {
        return Err(KernelError(format!(
            "attention needs n_head a multiple of n_head_kv and head_dim > 0, got {} heads, \
             {} KV heads, head_dim {hd}",
            p.n_head, p.n_head_kv
        )));
    }
    let kern = KvKernels::on(isa, p.cache_type)?;
    let n_embd_kv = p.n_head_kv * hd;
    let cb = cell_bytes(p.cache_type, n_embd_kv)?;
    let head_bytes = cell_bytes(p.cache_type, hd)?;
    let n_cells = k.len() / cb;
    if v.len() / cb != n_cells {
        return Err(KernelError(format!(
            "K region holds {n_cells} cells, V region {}",
            v.len() / cb
        )));
    }
    let row = p.n_head * hd;
    if !q.len().is_multiple_of(row) {
        return Err(KernelError(format!(
            "attention of {} query values, not whole rows of {row}",
            q.len()
        )));
    }
    let windows = parse_windows(window, q.len() / row, n_cells)?;
    Ok(Call {
        p,
        kern,
        q,
        windows,
        phase: Vec::new(),
        k,
        v,
        cell_bytes: cb,
        head_bytes,
    })
}
