use super::KvType;
use super::{encode, need_len, read_i32s, to_u32};
use crate::device::{as_bytes, Arg, Device};
use crate::error::{Error, Result};
use crate::params::{RopeParams, RopeShiftParams};
use minfer_graph::RopeStyle;

/// The kernel's code for a pairing (`RopeParams::style`, read by `kernels/rope.metal`).
pub(super) fn style_code(style: RopeStyle) -> u32 {
    match style {
        // (i, i + n_rot/2): NeoX / Qwen2.
        RopeStyle::Neox => 0,
        // (2i, 2i + 1): LLaMA GGUF.
        RopeStyle::Normal => 1,
    }
}

/// RoPE over `[n_tokens, n_heads, head_dim]` f32 at i32 `positions[n_tokens]`; `dst` may be `x`.
/// Pair `i < n_rot / 2` turns by `freq_scale * pos * base^(-2i/n_rot)`, the angle computed as
/// the CPU does (`crates/cpu/src/ops/rope.rs`: a running f32 product); the rest is copied.
#[allow(clippy::too_many_arguments)]
pub fn launch_rope<D: Device>(
    dev: &D,
    x: &D::Buffer,
    positions: &D::Buffer,
    dst: &D::Buffer,
    head_dim: usize,
    n_heads: usize,
    n_tokens: usize,
    n_rot: usize,
    freq_base: f32,
    freq_scale: f32,
    style: RopeStyle,
) -> Result<()> {
    const OP: &str = "rope";
    if !head_dim.is_multiple_of(2) || !n_rot.is_multiple_of(2) || n_rot > head_dim || n_rot == 0 {
        return Err(Error::Shape {
            op: OP,
            reason: format!(
                "head_dim {head_dim} and n_rot {n_rot} must be even with 0 < n_rot <= head_dim"
            ),
        });
    }
    let bytes = (head_dim * n_heads * n_tokens) as u64 * 4;
    need_len(dev, OP, "x", x, 0, bytes)?;
    need_len(dev, OP, "dst", dst, 0, bytes)?;
    if let Some(p) = read_i32s(dev, positions, n_tokens)?
        .into_iter()
        .find(|&p| p < 0)
    {
        return Err(Error::Shape {
            op: OP,
            reason: format!("negative position {p}"),
        });
    }
    let p = RopeParams {
        head_dim: to_u32(OP, "head_dim", head_dim)?,
        n_heads: to_u32(OP, "n_heads", n_heads)?,
        n_tokens: to_u32(OP, "n_tokens", n_tokens)?,
        n_rot: to_u32(OP, "n_rot", n_rot)?,
        freq_base,
        freq_scale,
        style: style_code(style),
    };
    encode(
        dev,
        "kernel_rope_f32",
        [
            to_u32(OP, "pair groups", (head_dim / 2).div_ceil(32))?,
            p.n_heads,
            p.n_tokens,
        ],
        [32, 1, 1],
        &[
            Arg::Buffer(x, 0),
            Arg::Buffer(positions, 0),
            Arg::Buffer(dst, 0),
            Arg::Bytes(as_bytes(&p)),
        ],
        &[],
    )
}

/// Rotates the K rows of cells `cell..cell + n` of a K region (`n_cells` rows of `n_head_kv`
/// heads of `head_dim`, element type `kv`) by `delta` positions, in place: the semantics of
/// `crates/cpu/src/ops/kv_cells.rs` `rope_shift` (every dimension of a head rotated, angle
/// `freq_scale * delta * base^(-2i/head_dim)`, f16 rows rounded back to nearest even). A no-op
/// (`n == 0` or `delta == 0`) encodes nothing and succeeds for every type; a packed q8_0
/// region cannot shift (re-quantizing compounds rounding, as the CPU refuses it) and is an
/// `UnsupportedType` error naming q8_0.
#[allow(clippy::too_many_arguments)]
pub fn launch_kv_rope_shift<D: Device>(
    dev: &D,
    kv: KvType,
    k_region: &D::Buffer,
    n_head_kv: usize,
    head_dim: usize,
    n_cells: usize,
    cell: usize,
    n: usize,
    delta: i64,
    freq_base: f32,
    freq_scale: f32,
    style: RopeStyle,
) -> Result<()> {
    const OP: &str = "kv_rope_shift";
    let shape = |reason: String| Error::Shape { op: OP, reason };
    let row_elems = n_head_kv * head_dim;
    if row_elems == 0 {
        return Err(shape(format!(
            "{n_head_kv} heads of {head_dim}: a cell of 0 elements"
        )));
    }
    if cell.checked_add(n).is_none_or(|end| end > n_cells) {
        return Err(shape(format!(
            "cells {cell}..{} are outside the region's {n_cells} cells",
            cell.saturating_add(n)
        )));
    }
    let (kernel, elem) = match kv {
        KvType::F32 => ("kernel_kv_rope_shift_f32", 4),
        KvType::F16 => ("kernel_kv_rope_shift_f16", 2),
        KvType::Q8_0 => {
            if n == 0 || delta == 0 {
                return Ok(());
            }
            return Err(Error::UnsupportedType {
                op: OP,
                ty: "q8_0 KV (re-quantizing rotated K rows compounds rounding; only f32 and \
                     f16 regions can shift)"
                    .into(),
            });
        }
    };
    need_len(
        dev,
        OP,
        "k region",
        k_region,
        0,
        (n_cells * row_elems * elem) as u64,
    )?;
    if n == 0 || delta == 0 {
        return Ok(());
    }
    if !head_dim.is_multiple_of(2) {
        return Err(shape(format!(
            "RoPE needs an even head_dim, not {head_dim}"
        )));
    }
    let delta = i32::try_from(delta).map_err(|_| {
        shape(format!(
            "a shift of {delta} positions does not fit a position (i32)"
        ))
    })?;
    let p = RopeShiftParams {
        head_dim: to_u32(OP, "head_dim", head_dim)?,
        n_heads: to_u32(OP, "n_head_kv", n_head_kv)?,
        n_cells: to_u32(OP, "n", n)?,
        cell0: to_u32(OP, "cell", cell)?,
        delta,
        freq_base,
        freq_scale,
        style: style_code(style),
    };
    encode(
        dev,
        kernel,
        [
            to_u32(OP, "pair groups", (head_dim / 2).div_ceil(32))?,
            p.n_heads,
            p.n_cells,
        ],
        [32, 1, 1],
        &[Arg::Buffer(k_region, 0), Arg::Bytes(as_bytes(&p))],
        &[],
    )
}
