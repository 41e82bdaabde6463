use super::{encode, need_len, read_i32s, to_u32};
use crate::device::{as_bytes, Arg, Device};
use crate::error::{Error, Result};
use crate::params::RopeParams;
use minfer_graph::RopeStyle;

/// The kernel's code for a pairing (`RopeParams::style`, read by `kernels/rope.metal`).
fn style_code(style: RopeStyle) -> u32 {
    match style {
        // (i, i + n_rot/2): NeoX / Qwen2.
        RopeStyle::Neox => 0,
        // (2i, 2i + 1): LLaMA GGUF.
        RopeStyle::Normal => 1,
    }
}

/// RoPE over `[n_tokens, n_heads, head_dim]` f32 at i32 `positions[n_tokens]`; `dst` may be `x`.
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
