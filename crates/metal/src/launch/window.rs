//! Attention over explicit windows (the graph's attention op): every query lists the KV cells
//! it attends, as a span `(lo, hi)` (cells `lo..hi`) or a kv map of
//! [`minfer_graph::KV_MAP_RUNS`] `(cell, len)` runs; the listed cells, concatenated in order,
//! are the query's logical rows `0..len`. Scores use the op's `scale`. An empty window gives
//! zeros (as the CPU's flash kernel does).
//!
//! Batch invariance: a query's output bits depend only on its q row and the K/V values its
//! window lists, in logical order. Both kernels walk the logical rows in blocks/chunks at
//! fixed logical multiples (classic: 32-row blocks; flash: [`FLASH_WINDOW_CHUNK`]-row chunks,
//! combined in chunk order); no boundary depends on the cells, the other queries of the
//! launch, their number, or the region's size.

use super::{encode, need_len, read_i32s, to_u32, KvType};
use crate::device::{as_bytes, Arg, Device};
use crate::error::{Error, Result};
use crate::params::WindowAttnParams;
use minfer_graph::KV_MAP_RUNS;

/// Logical rows per flash chunk: chunk `c` of every query covers its rows
/// `[c * FLASH_WINDOW_CHUNK, (c + 1) * FLASH_WINDOW_CHUNK)`.
pub const FLASH_WINDOW_CHUNK: usize = 256;

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
    Classic,
    Flash,
}

const OP: &str = "attention_window";

fn shape(reason: String) -> Error {
    Error::Shape { op: OP, reason }
}

/// Reads the window buffer on the host (it is host-written input), checks every run lies in
/// `0..n_cells` (span: `0 <= lo <= hi <= n_cells`; map: `len >= 0` and, for a non-empty run,
/// `0 <= cell`, `cell + len <= n_cells`; overlap is not checked), returns the longest window
/// length. Errors are [`Error::Shape`] naming the query and run.
pub fn check_windows<D: Device>(dev: &D, s: &WindowAttn, window: &D::Buffer) -> Result<usize> {
    let width = s.window.width();
    need_len(
        dev,
        OP,
        "window",
        window,
        0,
        (s.n_tokens * width) as u64 * 4,
    )?;
    let vals = read_i32s(dev, window, s.n_tokens * width)?;
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
    Ok(longest)
}

/// Chunks per (query, head) the flash launch provides for windows up to `max_len` (>= 1).
fn flash_chunks(max_len: usize) -> usize {
    max_len.div_ceil(FLASH_WINDOW_CHUNK).max(1)
}

/// Scratch bytes the launch needs for windows up to `max_len` (0 for the classic kernel).
pub fn window_scratch_bytes(s: &WindowAttn, max_len: usize) -> usize {
    match window_kernel(s) {
        WindowKernel::Classic => 0,
        WindowKernel::Flash => s.n_tokens * s.n_head * flash_chunks(max_len) * (s.head_dim + 2) * 4,
    }
}

/// Which kernel a shape takes: Flash for head_dim 64/128 with f32/f16 KV, else Classic.
pub fn window_kernel(s: &WindowAttn) -> WindowKernel {
    match (s.head_dim, s.kv) {
        (64 | 128, KvType::F32 | KvType::F16) => WindowKernel::Flash,
        _ => WindowKernel::Classic,
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

/// [`launch_attention_window`] forcing one kernel family (tests). Flash refuses head dims
/// other than 64/128 and q8_0 regions; classic takes head dims 1..=512 and every KV type.
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
    if s.n_head == 0 || s.n_head_kv == 0 || !s.n_head.is_multiple_of(s.n_head_kv) {
        return Err(shape(format!(
            "n_head {} must be a non-zero multiple of n_head_kv {}",
            s.n_head, s.n_head_kv
        )));
    }
    if s.head_dim == 0 || s.head_dim > 512 {
        return Err(shape(format!("head_dim {} outside 1..=512", s.head_dim)));
    }
    if kernel == WindowKernel::Flash {
        if s.head_dim != 64 && s.head_dim != 128 {
            return Err(shape(format!(
                "flash window kernels exist for head dim 64 and 128, got {}",
                s.head_dim
            )));
        }
        if s.kv == KvType::Q8_0 {
            return Err(Error::UnsupportedType {
                op: OP,
                ty: "q8_0 KV (the flash window kernels read f32/f16 regions; use the classic \
                     kernel)"
                    .into(),
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
    need_len(dev, OP, "q", q, 0, q_bytes)?;
    need_len(dev, OP, "out", out, 0, q_bytes)?;
    need_len(dev, OP, "k region", k, 0, (s.n_cells * row_bytes) as u64)?;
    need_len(dev, OP, "v region", v, 0, (s.n_cells * row_bytes) as u64)?;
    let max_len = check_windows(dev, s, window)?;
    if s.n_tokens == 0 {
        return Ok(());
    }
    let n_chunks = flash_chunks(max_len);
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
                Arg::Buffer(q, 0),
                Arg::Buffer(k, 0),
                Arg::Buffer(v, 0),
                Arg::Buffer(window, 0),
                Arg::Buffer(out, 0),
                Arg::Bytes(as_bytes(&p)),
            ],
            &[],
        ),
        WindowKernel::Flash => {
            let need = s.n_tokens * s.n_head * n_chunks * (s.head_dim + 2) * 4;
            need_len(dev, OP, "scratch", scratch, 0, need as u64)?;
            encode(
                dev,
                &format!("kernel_flash_window_{suffix}_hd{}", s.head_dim),
                [p.n_chunks, p.n_head, p.n_tokens],
                [128, 1, 1],
                &[
                    Arg::Buffer(q, 0),
                    Arg::Buffer(k, 0),
                    Arg::Buffer(v, 0),
                    Arg::Buffer(window, 0),
                    Arg::Buffer(scratch, 0),
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
                    Arg::Buffer(scratch, 0),
                    Arg::Buffer(window, 0),
                    Arg::Buffer(out, 0),
                    Arg::Bytes(as_bytes(&p)),
                ],
                &[],
            )
        }
    }
}
