//! Operations on the cells of one KV region (a layer's K or V bytes, `cell_bytes` per cell),
//! for the backend to run when the host rearranges its sequences:
//!
//! - [`copy_cells`] copies `n` cells from `src` to `dst` with `memmove` semantics (the ranges
//!   may overlap; every copied cell ends bit-identical to the source cell as it was before the
//!   call). It is a raw operation: what the cells mean afterwards is the caller's business.
//! - [`rope_shift`] rotates the K rows of `n` cells by `delta` positions. RoPE is a rotation
//!   per pair, so `R(p + δ) = R(δ)·R(p)`: rotating a stored row by `δ` gives the row a fresh
//!   prefill at `p + δ` would store, up to f32 rounding of the composed angle (and, for F16,
//!   one more rounding to half). V has no position and never shifts.
//!
//! Q8_0 cannot shift: rotating a row means re-quantizing every block, and the rounding
//! compounds with each shift, so [`rope_shift`] refuses it ([`KvCellError::CannotShift`]);
//! [`can_shift`] says which types can.

use super::rope::{rope, RopeParams};
use super::KernelError;
use minfer_gguf::{quants, GgmlType};
use minfer_graph::{KvKind, Op, RopeStyle};
use std::fmt;

/// Runs a cell-op node of the engine's cell-op graph ([`Op::KvCopy`], [`Op::KvRopeShift`])
/// on the layer's K and V regions.
pub fn run_cell_op(op: &Op, k: &mut [u8], v: &mut [u8]) -> Result<(), KernelError> {
    let res = match *op {
        Op::KvCopy {
            kind,
            layout,
            src,
            dst,
            n,
            ..
        } => {
            let region = match kind {
                KvKind::K => k,
                KvKind::V => v,
            };
            copy_cells(region, layout.cell_bytes, src, dst, n)
        }
        Op::KvRopeShift {
            layout,
            rope,
            cell,
            n,
            delta,
            ..
        } => {
            let shift = ShiftRope {
                style: rope.style,
                freq_base: rope.freq_base,
                freq_scale: rope.freq_scale,
                fused: false,
            };
            rope_shift(
                k,
                layout.cache_type,
                layout.n_head_kv,
                layout.head_dim,
                &shift,
                cell,
                n,
                delta,
            )
        }
        _ => return Err(KernelError(format!("{} is not a cell op", op.name()))),
    };
    res.map_err(|e| KernelError(e.to_string()))
}

/// Cells rotated per dequantize / rotate / quantize round (bounds the scratch memory).
const CHUNK_CELLS: usize = 64;

/// The RoPE of the model whose K rows a shift rotates (per KV head; see [`RopeParams`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ShiftRope {
    pub style: RopeStyle,
    pub freq_base: f32,
    pub freq_scale: f32,
    /// As [`RopeParams::fused`]: rotate as llama.cpp's x86 build does (its numerics).
    pub fused: bool,
}

/// A cell operation the region cannot take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KvCellError {
    /// Cells `start..start + n` are not all inside the region's `n_cells`.
    OutOfRegion {
        op: &'static str,
        start: usize,
        n: usize,
        n_cells: usize,
    },
    /// A cell of 0 bytes, or heads that are not whole blocks of the cache type / pairs.
    BadShape { problem: String },
    /// The cache type cannot shift positions (see the module docs).
    CannotShift { ty: GgmlType },
    /// A shift larger than a position can be.
    DeltaRange { delta: i64 },
}

impl fmt::Display for KvCellError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KvCellError::OutOfRegion {
                op,
                start,
                n,
                n_cells,
            } => write!(
                f,
                "{op}: cells {start}..{} are outside the region's {n_cells} cells",
                start.saturating_add(*n)
            ),
            KvCellError::BadShape { problem } => write!(f, "KV cells: {problem}"),
            KvCellError::CannotShift { ty } => write!(
                f,
                "a {ty} KV cache cannot shift positions (re-quantizing rotated K rows \
                 compounds rounding); only f32 and f16 can"
            ),
            KvCellError::DeltaRange { delta } => {
                write!(
                    f,
                    "a shift of {delta} positions does not fit a position (i32)"
                )
            }
        }
    }
}

impl std::error::Error for KvCellError {}

impl From<KvCellError> for KernelError {
    fn from(e: KvCellError) -> Self {
        KernelError(e.to_string())
    }
}

/// Whether a KV cache type can shift positions (see the module docs).
pub fn can_shift(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::F32 | GgmlType::F16)
}

/// The region's whole cells, after checking `start..start + n` lies inside them.
fn check_range(
    op: &'static str,
    region: &[u8],
    cell_bytes: usize,
    start: usize,
    n: usize,
) -> Result<usize, KvCellError> {
    if cell_bytes == 0 {
        return Err(KvCellError::BadShape {
            problem: "a cell of 0 bytes".into(),
        });
    }
    let n_cells = region.len() / cell_bytes;
    if start.checked_add(n).is_none_or(|end| end > n_cells) {
        return Err(KvCellError::OutOfRegion {
            op,
            start,
            n,
            n_cells,
        });
    }
    Ok(n_cells)
}

/// Copies cells `src..src + n` of `region` to `dst..dst + n` as `memmove` does (overlap
/// allowed): afterwards each destination cell holds the bytes its source cell held before.
pub fn copy_cells(
    region: &mut [u8],
    cell_bytes: usize,
    src: usize,
    dst: usize,
    n: usize,
) -> Result<(), KvCellError> {
    check_range("copy_cells (source)", region, cell_bytes, src, n)?;
    check_range("copy_cells (destination)", region, cell_bytes, dst, n)?;
    region.copy_within(src * cell_bytes..(src + n) * cell_bytes, dst * cell_bytes);
    Ok(())
}

/// Rotates the K rows of cells `cell..cell + n` of `region` (a K region of `cache_type`,
/// `n_head_kv` heads of `head_dim` per cell) by `delta` positions: each row is dequantized,
/// rotated by [`rope`] at position `delta`, and stored back in the cache type. A no-op
/// (`n == 0` or `delta == 0`) changes nothing and succeeds for every type.
#[allow(clippy::too_many_arguments)]
pub fn rope_shift(
    region: &mut [u8],
    cache_type: GgmlType,
    n_head_kv: usize,
    head_dim: usize,
    rope_params: &ShiftRope,
    cell: usize,
    n: usize,
    delta: i64,
) -> Result<(), KvCellError> {
    let n_embd_kv = n_head_kv * head_dim;
    let cb = cache_type
        .row_bytes(n_embd_kv as u64)
        .filter(|&b| b > 0)
        .ok_or_else(|| KvCellError::BadShape {
            problem: format!("{n_head_kv} heads of {head_dim} are not whole {cache_type} blocks"),
        })? as usize;
    check_range("rope_shift", region, cb, cell, n)?;
    if n == 0 || delta == 0 {
        return Ok(());
    }
    if !can_shift(cache_type) {
        return Err(KvCellError::CannotShift { ty: cache_type });
    }
    if !head_dim.is_multiple_of(2) {
        return Err(KvCellError::BadShape {
            problem: format!("RoPE needs an even head_dim, not {head_dim}"),
        });
    }
    let delta = i32::try_from(delta).map_err(|_| KvCellError::DeltaRange { delta })?;
    let params = RopeParams {
        style: rope_params.style,
        n_head: n_head_kv,
        head_dim,
        freq_base: rope_params.freq_base,
        freq_scale: rope_params.freq_scale,
        fused: rope_params.fused,
    };
    let chunk = CHUNK_CELLS.min(n);
    let mut rows = vec![0f32; chunk * n_embd_kv];
    let mut rotated = vec![0f32; chunk * n_embd_kv];
    // The rope kernel reads positions as i32 bits in f32 slots.
    let pos = vec![f32::from_bits(delta as u32); chunk];
    let bad = |e: minfer_gguf::Error| KvCellError::BadShape {
        problem: e.to_string(),
    };
    let mut c = cell;
    while c < cell + n {
        let len = chunk.min(cell + n - c);
        let raw = &mut region[c * cb..(c + len) * cb];
        let m = len * n_embd_kv;
        for (src, dst) in raw.chunks_exact(cb).zip(rows.chunks_exact_mut(n_embd_kv)) {
            quants::dequantize_row(cache_type, src, dst).map_err(bad)?;
        }
        rope(&params, &rows[..m], &pos[..len], &mut rotated[..m]);
        for (src, dst) in rotated[..m]
            .chunks_exact(n_embd_kv)
            .zip(raw.chunks_exact_mut(cb))
        {
            quants::quantize_row(cache_type, src, dst).map_err(bad)?;
        }
        c += len;
    }
    Ok(())
}
