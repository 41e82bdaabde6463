//! Operations on a KV region's cells that the engine asks the backend for: moves (defrag,
//! copy-on-write, prefix copies) and the re-rope of a position shift.

use super::{rope, KResult, KernelError};
use minfer_gguf::{quants, GgmlType};
use minfer_graph::{KvLayout, RopeSpec};

fn check(region: &[u8], cell_bytes: usize, start: usize, n: usize) -> KResult<()> {
    let n_cells = region.len().checked_div(cell_bytes).unwrap_or(0);
    if start + n > n_cells {
        return Err(KernelError(format!(
            "cells {start}..{} outside the region's {n_cells}",
            start + n
        )));
    }
    Ok(())
}

/// Copies cells `src..src + n` to `dst..dst + n` with memmove semantics: the rows arrive bit
/// for bit even when the ranges overlap.
pub fn copy_cells(
    region: &mut [u8],
    cell_bytes: usize,
    src: usize,
    dst: usize,
    n: usize,
) -> KResult<()> {
    check(region, cell_bytes, src, n)?;
    check(region, cell_bytes, dst, n)?;
    region.copy_within(src * cell_bytes..(src + n) * cell_bytes, dst * cell_bytes);
    Ok(())
}

/// Whether a KV element type can shift positions: rotating a quantized row means
/// re-quantizing every block, and that rounding compounds with each shift.
pub fn can_shift(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::F32 | GgmlType::F16)
}

/// Rotates the K rows of cells `cell..cell + n` by `delta` positions. RoPE is a rotation
/// per pair, so `R(p + δ) = R(δ)·R(p)`: the rotated row is what a fresh store at `p + δ`
/// would hold, up to f32 rounding of the composed angle (and for f16 one more rounding).
pub fn rope_shift(
    region: &mut [u8],
    layout: &KvLayout,
    spec: &RopeSpec,
    cell: usize,
    n: usize,
    delta: i64,
) -> KResult<()> {
    let ty = layout.cache_type;
    if !can_shift(ty) {
        return Err(KernelError(format!(
            "a {ty} KV cache cannot shift positions (re-quantizing rotated K rows compounds \
             rounding); only f32 and f16 can"
        )));
    }
    let cb = layout.cell_bytes;
    check(region, cb, cell, n)?;
    let delta = i32::try_from(delta)
        .map_err(|_| KernelError(format!("shift by {delta} positions is out of range")))?;
    let n_embd_kv = layout.n_head_kv * layout.head_dim;
    let params = rope::RopeParams {
        style: spec.style,
        n_head: layout.n_head_kv,
        head_dim: spec.head_dim,
        freq_base: spec.freq_base,
        freq_scale: spec.freq_scale,
        fused: false,
    };
    // The rope kernel reads positions as i32 bits in f32 slots.
    let pos = [f32::from_bits(delta as u32)];
    let mut row = vec![0f32; n_embd_kv];
    let mut rotated = vec![0f32; n_embd_kv];
    for c in cell..cell + n {
        let raw = &mut region[c * cb..(c + 1) * cb];
        quants::dequantize_row(ty, raw, &mut row)?;
        rope::rope(&params, &row, &pos, &mut rotated);
        quants::quantize_row(ty, &rotated, raw)?;
    }
    Ok(())
}
