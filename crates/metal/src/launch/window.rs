//! Attention over explicit windows (the graph's attention op): every query lists the KV cells
//! it attends, as a span `(lo, hi)` (cells `lo..hi`) or a kv map of
//! [`minfer_graph::KV_MAP_RUNS`] `(cell, len)` runs; the listed cells, concatenated in order,
//! are the query's logical rows `0..len`. Scores use the op's `scale`. An empty window gives
//! zeros (as the CPU's flash kernel does).
//!
//! Five kernel families ([`WindowKernel`]): the executor picks one per row class
//! ([`window_class_kernel`]); [`window_kernel`] is the seed's §4.4.1 choice by the number of
//! queries (direct launches, and the gates' control). Batch invariance: within a family, a query's output bits depend only on
//! its q row and the K/V values its window lists, in logical order. Every family walks the
//! logical rows in blocks at fixed logical multiples (classic: 32 rows; flash: chunks of
//! [`FLASH_WINDOW_CHUNK`] combined in chunk order; split: [`SPLIT_WINDOW_ROWS`]-row splits
//! combined in split order; prefill flash: 64-row blocks; three-pass: single rows in order);
//! no boundary depends on the cells, the other queries of the launch, their number, or the
//! region's size. Across families a row's bits may differ (different summation orders), so
//! the executor never lets the family follow the forward's shape: each run of one row class
//! takes its class's family (docs/PRECISION.md, "Row classes").

use std::sync::OnceLock;

use super::{encode, need_len, read_i32s, to_u32, window_fast, KvType};
use crate::device::{as_bytes, Arg, Device};
use crate::error::{Error, Result};
use crate::params::WindowAttnParams;
use minfer_graph::{RowClass, KV_MAP_RUNS};

/// Logical rows per flash chunk: chunk `c` of every query covers its rows
/// `[c * FLASH_WINDOW_CHUNK, (c + 1) * FLASH_WINDOW_CHUNK)`.
pub const FLASH_WINDOW_CHUNK: usize = 256;

/// Logical rows per split of the KV-split family (one simdgroup per split): split `s` of
/// every query covers its rows `[s * SPLIT_WINDOW_ROWS, (s + 1) * SPLIT_WINDOW_ROWS)`.
pub const SPLIT_WINDOW_ROWS: usize = 64;

/// Layout of the window buffer (i32): `[n_tokens][2]` spans or `[n_tokens][2 * KV_MAP_RUNS]`
/// kv-map runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WindowKind {
    Span,
    Map,
}

impl WindowKind {
    /// i32 values per query.
    pub fn width(self) -> usize {
        match self {
            WindowKind::Span => 2,
            WindowKind::Map => 2 * KV_MAP_RUNS,
        }
    }
}

/// Shape of one windowed attention: q/out `[n_tokens][n_head * head_dim]` f32, K/V regions of
/// `n_cells` rows of `n_head_kv * head_dim` elements of `kv`.
#[derive(Clone, Copy, Debug)]
pub struct WindowAttn {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_tokens: usize,
    /// Rows of each K/V region.
    pub n_cells: usize,
    pub kv: KvType,
    pub scale: f32,
    pub window: WindowKind,
}

/// The kernel family a windowed attention runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WindowKernel {
    /// `attn_window.metal`: any head dim up to 512, every KV type (the correctness kernel).
    Classic,
    /// `fa_window.metal`: chunked flash decode + in-order combine (head dim 64/128, f32/f16).
    Flash,
    /// `attn_split.metal`: KV-split two-pass, one simdgroup per split (head dim 64/128).
    Split,
    /// `fa_window_prefill.metal`: 8-query tiles over 64-row blocks with the tail pad.
    PrefillFlash,
    /// `attn_3pass.metal`: scores, masked softmax, output (head dim 64/128).
    ThreePass,
}

/// The dispatch switches of §4.4.1, read from the environment once per process
/// ([`AttnEnv::get`]). A switch is on when its variable is set to a non-empty value other
/// than `0`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AttnEnv {
    /// `MINFER_NO_FLASH_ATTN`: decode skips the flash family.
    pub no_flash: bool,
    /// `MINFER_NO_SPLIT_ATTN`: decode skips the split family.
    pub no_split: bool,
    /// `MINFER_NO_PREFILL_FLASH`: prefill skips the flash prefill family.
    pub no_prefill_flash: bool,
    /// `MINFER_NO_MATMUL_ATTN`: prefill skips the three-pass family.
    pub no_matmul: bool,
}

impl AttnEnv {
    /// The switches as the environment sets them now.
    pub fn from_env() -> AttnEnv {
        crate::settings::attn_from_env()
    }

    /// The switches read at the first call, for the rest of the process.
    pub fn get() -> &'static AttnEnv {
        static ENV: OnceLock<AttnEnv> = OnceLock::new();
        ENV.get_or_init(AttnEnv::from_env)
    }
}

const OP: &str = "attention_window";

pub(super) fn shape(reason: String) -> Error {
    Error::Shape { op: OP, reason }
}

/// Reads the window buffer on the host (it is host-written input), only its first
/// `n_tokens` windows (a longer buffer's tail is never read), and checks every run lies in
/// `0..n_cells` (span: `0 <= lo <= hi <= n_cells`; map: `len >= 0` and, for a non-empty run,
/// `0 <= cell`, `cell + len <= n_cells`; overlap is not checked). Returns the values and the
/// longest window length. Errors are [`Error::Shape`] naming the query and run.
pub(super) fn read_windows<D: Device>(
    dev: &D,
    s: &WindowAttn,
    window: &D::Buffer,
) -> Result<(Vec<i32>, usize)> {
    read_windows_from(dev, s, window, 0)
}

/// [`read_windows`] of the `s.n_tokens` windows from query `row0` on.
fn read_windows_from<D: Device>(
    dev: &D,
    s: &WindowAttn,
    window: &D::Buffer,
    row0: usize,
) -> Result<(Vec<i32>, usize)> {
    let width = s.window.width();
    let (first, n) = (row0 * width, s.n_tokens * width);
    need_len(dev, OP, "window", window, 0, (first + n) as u64 * 4)?;
    let vals = read_i32s(dev, window, first + n)?.split_off(first);
    let n_cells = s.n_cells as i64;
    let mut longest = 0usize;
    for (t, w) in vals.chunks_exact(width.max(1)).enumerate() {
        let len = match s.window {
            WindowKind::Span => {
                let (lo, hi) = (w[0] as i64, w[1] as i64);
                if lo < 0 || hi < lo || hi > n_cells {
                    return Err(shape(format!(
                        "query {t}: span [{lo}, {hi}) outside the region's cells 0..{n_cells}"
                    )));
                }
                (hi - lo) as usize
            }
            WindowKind::Map => {
                let mut len = 0usize;
                for (r, run) in w.chunks_exact(2).enumerate() {
                    let (cell, n) = (run[0] as i64, run[1] as i64);
                    if n < 0 {
                        return Err(shape(format!(
                            "query {t}: kv map run {r} has negative length {n}"
                        )));
                    }
                    if n > 0 && (cell < 0 || cell + n > n_cells) {
                        return Err(shape(format!(
                            "query {t}: kv map run {r} (cell {cell}, {n} cells) outside the \
                             region's cells 0..{n_cells}"
                        )));
                    }
                    len += n as usize;
                }
                len
            }
        };
        longest = longest.max(len);
    }
    Ok((vals, longest))
}

/// Checks the first `n_tokens` windows ([`read_windows`]'s rules), returns the longest
/// window length.
pub fn check_windows<D: Device>(dev: &D, s: &WindowAttn, window: &D::Buffer) -> Result<usize> {
    read_windows(dev, s, window).map(|(_, longest)| longest)
}

/// Chunks per (query, head) the flash launch provides for windows up to `max_len` (>= 1).
fn flash_chunks(max_len: usize) -> usize {
    max_len.div_ceil(FLASH_WINDOW_CHUNK).max(1)
}

/// Split slots per (query, head) for windows up to `max_len` (>= 1).
pub(super) fn split_slots(max_len: usize) -> usize {
    max_len.div_ceil(SPLIT_WINDOW_ROWS).max(1)
}

/// Scratch bytes the family [`window_kernel`] picks for `s` needs for windows up to
/// `max_len` (what [`launch_attention_window`] asks of its `scratch`).
pub fn window_scratch_bytes(s: &WindowAttn, max_len: usize) -> usize {
    window_family_scratch_bytes(window_kernel(s), s, max_len)
}

/// Scratch bytes family `kernel` needs for windows up to `max_len`: classic 0; flash the
/// chunk partials; split the split partials; three-pass the score rows; prefill flash the
/// tail pads of one wave of tiles (the tile table itself travels as constant bytes).
pub fn window_family_scratch_bytes(kernel: WindowKernel, s: &WindowAttn, max_len: usize) -> usize {
    let rows = s.n_tokens * s.n_head;
    match kernel {
        WindowKernel::Classic => 0,
        WindowKernel::Flash => rows * flash_chunks(max_len) * (s.head_dim + 2) * 4,
        WindowKernel::Split => rows * split_slots(max_len) * (s.head_dim + 2) * 4,
        WindowKernel::ThreePass => rows * max_len.max(1) * 4,
        WindowKernel::PrefillFlash => window_fast::prefill_pad_bytes(s, s.n_tokens),
    }
}

/// Which family a shape takes with the process's switches ([`AttnEnv::get`]).
pub fn window_kernel(s: &WindowAttn) -> WindowKernel {
    window_kernel_for(s, AttnEnv::get())
}

/// The §4.4.1 choice: head dim 64/128 over f32/f16 KV: decode (one query) takes flash, else
/// split, else classic; prefill takes flash prefill, else three-pass, else classic. Other
/// head dims and q8_0 regions take classic.
pub fn window_kernel_for(s: &WindowAttn, env: &AttnEnv) -> WindowKernel {
    let fast = matches!(s.head_dim, 64 | 128) && s.kv != KvType::Q8_0;
    match (fast, s.n_tokens) {
        (false, _) => WindowKernel::Classic,
        (true, 1) if !env.no_flash => WindowKernel::Flash,
        (true, 1) if !env.no_split => WindowKernel::Split,
        (true, 1) => WindowKernel::Classic,
        (true, _) if !env.no_prefill_flash => WindowKernel::PrefillFlash,
        (true, _) if !env.no_matmul => WindowKernel::ThreePass,
        (true, _) => WindowKernel::Classic,
    }
}

/// The family of a run of one row class (docs/PRECISION.md, "Row classes"), whatever its
/// number of queries: head dim 64/128 over f32/f16 KV: generation rows take the decode
/// families (flash, else split, else classic), prompt rows the prefill ones (flash prefill,
/// else three-pass, else classic), a 1-token prompt remainder and a forward of many
/// generation rows included. Other head dims and q8_0 regions take classic. Each family is
/// batch invariant on its own (`window_*_is_batch_invariant`), so a row's bits then depend
/// only on its class, its q row and the K/V values its window lists.
pub fn window_class_kernel(s: &WindowAttn, class: RowClass, env: &AttnEnv) -> WindowKernel {
    let fast = matches!(s.head_dim, 64 | 128) && s.kv != KvType::Q8_0;
    match (fast, class) {
        (false, _) => WindowKernel::Classic,
        (true, RowClass::Generation) if !env.no_flash => WindowKernel::Flash,
        (true, RowClass::Generation) if !env.no_split => WindowKernel::Split,
        (true, RowClass::Prompt) if !env.no_prefill_flash => WindowKernel::PrefillFlash,
        (true, RowClass::Prompt) if !env.no_matmul => WindowKernel::ThreePass,
        (true, _) => WindowKernel::Classic,
    }
}

/// Checks windows ([`check_windows`]), needs `scratch` to hold [`window_scratch_bytes`],
/// encodes the dispatches (no buffer allocation inside), returns the kernel it ran.
#[allow(clippy::too_many_arguments)]
pub fn launch_attention_window<D: Device>(
    dev: &D,
    s: &WindowAttn,
    q: &D::Buffer,
    k: &D::Buffer,
    v: &D::Buffer,
    window: &D::Buffer,
    scratch: &D::Buffer,
    out: &D::Buffer,
) -> Result<WindowKernel> {
    let kernel = window_kernel(s);
    launch_attention_window_with(dev, kernel, s, q, k, v, window, scratch, out)?;
    Ok(kernel)
}

/// The buffers of one windowed launch, and the byte offsets of its first query's q row,
/// window and output row (non-zero for a run of one row class inside a node's rows).
pub(super) struct Bufs<'a, B> {
    pub q: &'a B,
    pub k: &'a B,
    pub v: &'a B,
    pub window: &'a B,
    pub scratch: &'a B,
    pub out: &'a B,
    pub q_off: u64,
    pub win_off: u64,
    pub out_off: u64,
}

/// [`launch_attention_window`] forcing one kernel family (tests), with `scratch` holding
/// [`window_family_scratch_bytes`] of it. Every family but classic refuses head dims other
/// than 64/128 and q8_0 regions; classic takes head dims 1..=512 and every KV type.
#[allow(clippy::too_many_arguments)]
pub fn launch_attention_window_with<D: Device>(
    dev: &D,
    kernel: WindowKernel,
    s: &WindowAttn,
    q: &D::Buffer,
    k: &D::Buffer,
    v: &D::Buffer,
    window: &D::Buffer,
    scratch: &D::Buffer,
    out: &D::Buffer,
) -> Result<()> {
    let b = Bufs {
        q,
        k,
        v,
        window,
        scratch,
        out,
        q_off: 0,
        win_off: 0,
        out_off: 0,
    };
    launch_family(dev, kernel, s, &b, false)
}

/// [`launch_attention_window_with`] for the prefill flash family with the tail pad reading
/// the leader's last 64 rows: the seed's #314 double-counting bug, for the tail gate's
/// control arm only.
#[doc(hidden)]
#[allow(clippy::too_many_arguments)]
pub fn launch_window_prefill_with_tail_bug<D: Device>(
    dev: &D,
    s: &WindowAttn,
    q: &D::Buffer,
    k: &D::Buffer,
    v: &D::Buffer,
    window: &D::Buffer,
    scratch: &D::Buffer,
    out: &D::Buffer,
) -> Result<()> {
    let b = Bufs {
        q,
        k,
        v,
        window,
        scratch,
        out,
        q_off: 0,
        win_off: 0,
        out_off: 0,
    };
    launch_family(dev, WindowKernel::PrefillFlash, s, &b, true)
}

/// Family `kernel` over queries `row0..row0 + s.n_tokens` of the node's q, window and out
/// buffers, with the scratch asked of `scratch(bytes)` once the windows are read: the
/// executor's path, so each run reads and checks its windows once (the bytes are
/// [`window_family_scratch_bytes`] of the run's longest window).
#[allow(clippy::too_many_arguments)]
pub fn launch_attention_window_sized<D: Device>(
    dev: &D,
    kernel: WindowKernel,
    s: &WindowAttn,
    q: &D::Buffer,
    k: &D::Buffer,
    v: &D::Buffer,
    window: &D::Buffer,
    out: &D::Buffer,
    row0: usize,
    scratch: impl FnOnce(usize) -> Result<D::Buffer>,
) -> Result<()> {
    let q_off = (row0 * s.n_head * s.head_dim) as u64 * 4;
    check_shapes(dev, kernel, s, q, k, v, out, q_off)?;
    let (vals, max_len) = read_windows_from(dev, s, window, row0)?;
    let scratch = scratch(window_family_scratch_bytes(kernel, s, max_len))?;
    let b = Bufs {
        q,
        k,
        v,
        window,
        scratch: &scratch,
        out,
        q_off,
        win_off: (row0 * s.window.width()) as u64 * 4,
        out_off: q_off,
    };
    encode_family(dev, kernel, s, &b, false, &vals, max_len)
}

fn launch_family<D: Device>(
    dev: &D,
    kernel: WindowKernel,
    s: &WindowAttn,
    b: &Bufs<'_, D::Buffer>,
    tail_bug: bool,
) -> Result<()> {
    check_shapes(dev, kernel, s, b.q, b.k, b.v, b.out, 0)?;
    let (vals, max_len) = read_windows(dev, s, b.window)?;
    encode_family(dev, kernel, s, b, tail_bug, &vals, max_len)
}

/// The launch's shape checks against the family and the buffers (before the windows are
/// read); the queries' q and out rows start at byte `q_off`.
#[allow(clippy::too_many_arguments)]
fn check_shapes<D: Device>(
    dev: &D,
    kernel: WindowKernel,
    s: &WindowAttn,
    q: &D::Buffer,
    k: &D::Buffer,
    v: &D::Buffer,
    out: &D::Buffer,
    q_off: u64,
) -> Result<()> {
    if s.n_head == 0 || s.n_head_kv == 0 || !s.n_head.is_multiple_of(s.n_head_kv) {
        return Err(shape(format!(
            "n_head {} must be a non-zero multiple of n_head_kv {}",
            s.n_head, s.n_head_kv
        )));
    }
    if s.head_dim == 0 || s.head_dim > 512 {
        return Err(shape(format!("head_dim {} outside 1..=512", s.head_dim)));
    }
    if kernel != WindowKernel::Classic {
        if s.head_dim != 64 && s.head_dim != 128 {
            return Err(shape(format!(
                "{kernel:?} window kernels exist for head dim 64 and 128, got {}",
                s.head_dim
            )));
        }
        if s.kv == KvType::Q8_0 {
            return Err(Error::UnsupportedType {
                op: OP,
                ty: format!(
                    "q8_0 KV (the {kernel:?} window kernels read f32/f16 regions; use the \
                     classic kernel)"
                ),
            });
        }
    }
    let kv_stride = s.n_head_kv * s.head_dim;
    if s.kv == KvType::Q8_0 && !kv_stride.is_multiple_of(32) {
        return Err(shape(format!(
            "q8_0 KV rows need a multiple of 32 elements, got {kv_stride}"
        )));
    }
    let row_bytes = s.kv.row_bytes(kv_stride);
    let q_bytes = (s.n_tokens * s.n_head * s.head_dim) as u64 * 4;
    need_len(dev, OP, "q", q, q_off, q_bytes)?;
    need_len(dev, OP, "out", out, q_off, q_bytes)?;
    need_len(dev, OP, "k region", k, 0, (s.n_cells * row_bytes) as u64)?;
    need_len(dev, OP, "v region", v, 0, (s.n_cells * row_bytes) as u64)?;
    Ok(())
}

/// Encodes one family's dispatches over windows already read and checked.
#[allow(clippy::too_many_arguments)]
fn encode_family<D: Device>(
    dev: &D,
    kernel: WindowKernel,
    s: &WindowAttn,
    b: &Bufs<'_, D::Buffer>,
    tail_bug: bool,
    vals: &[i32],
    max_len: usize,
) -> Result<()> {
    let kv_stride = s.n_head_kv * s.head_dim;
    let row_bytes = s.kv.row_bytes(kv_stride);
    if s.n_tokens == 0 {
        return Ok(());
    }
    if kernel != WindowKernel::PrefillFlash {
        // (prefill flash checks the pads of its actual tiles, at most this bound)
        let need = window_family_scratch_bytes(kernel, s, max_len);
        need_len(dev, OP, "scratch", b.scratch, 0, need as u64)?;
    }
    let n_chunks = match kernel {
        WindowKernel::Split => split_slots(max_len),
        _ => flash_chunks(max_len),
    };
    let p = WindowAttnParams {
        n_head: to_u32(OP, "n_head", s.n_head)?,
        n_head_kv: to_u32(OP, "n_head_kv", s.n_head_kv)?,
        head_dim: to_u32(OP, "head_dim", s.head_dim)?,
        n_tokens: to_u32(OP, "n_tokens", s.n_tokens)?,
        kv_stride: to_u32(OP, "kv_stride", kv_stride)?,
        kv_row_bytes: to_u32(OP, "kv row bytes", row_bytes)?,
        window_width: s.window.width() as u32,
        n_chunks: to_u32(OP, "n_chunks", n_chunks)?,
        chunk_len: FLASH_WINDOW_CHUNK as u32,
        scale: s.scale,
        row_stride: to_u32(OP, "score row stride", max_len.max(1))?,
        n_tiles: 0,
        tail_bug: tail_bug as u32,
    };
    let suffix = match s.kv {
        KvType::F32 => "f32",
        KvType::F16 => "f16",
        KvType::Q8_0 => "q8_0",
    };
    match kernel {
        WindowKernel::Classic => encode(
            dev,
            &format!("kernel_attn_window_{suffix}"),
            [p.n_head, p.n_tokens, 1],
            [128, 1, 1],
            &[
                Arg::Buffer(b.q, b.q_off),
                Arg::Buffer(b.k, 0),
                Arg::Buffer(b.v, 0),
                Arg::Buffer(b.window, b.win_off),
                Arg::Buffer(b.out, b.out_off),
                Arg::Bytes(as_bytes(&p)),
            ],
            &[],
        ),
        WindowKernel::Flash => {
            encode(
                dev,
                &format!("kernel_flash_window_{suffix}_hd{}", s.head_dim),
                [p.n_chunks, p.n_head, p.n_tokens],
                [128, 1, 1],
                &[
                    Arg::Buffer(b.q, b.q_off),
                    Arg::Buffer(b.k, 0),
                    Arg::Buffer(b.v, 0),
                    Arg::Buffer(b.window, b.win_off),
                    Arg::Buffer(b.scratch, 0),
                    Arg::Bytes(as_bytes(&p)),
                ],
                &[],
            )?;
            encode(
                dev,
                "kernel_flash_window_combine",
                [p.n_head, p.n_tokens, 1],
                [128, 1, 1],
                &[
                    Arg::Buffer(b.scratch, 0),
                    Arg::Buffer(b.window, b.win_off),
                    Arg::Buffer(b.out, b.out_off),
                    Arg::Bytes(as_bytes(&p)),
                ],
                &[],
            )
        }
        WindowKernel::Split => window_fast::split(dev, s, b, &p, suffix),
        WindowKernel::ThreePass => window_fast::three_pass(dev, b, &p, suffix),
        WindowKernel::PrefillFlash => window_fast::prefill(dev, s, b, &p, suffix, vals),
    }
}
