//! Launchers of the fused decode kernels (`kernels/fused.metal`): they finish the one-token
//! q|k|v and gate|up rows a single mat-vec over the concatenated weights produced.

use minfer_graph::RopeStyle;

use super::{encode, need_len, read_i32s, to_u32, KvType};
use crate::device::{as_bytes, Arg, Device};
use crate::error::{Error, Result};
use crate::params::{ElementwiseParams, QkvNormParams, QkvStoreParams};

/// Per-head RMSNorm, in place, of the `n_q` q heads (gain `wq`) and the `n_k` k heads (gain
/// `wk`) at the start of the q|k|v row `x` (heads of `head_dim`).
#[allow(clippy::too_many_arguments)]
pub fn launch_qkv_norm<D: Device>(
    dev: &D,
    x: &D::Buffer,
    wq: &D::Buffer,
    wk: &D::Buffer,
    head_dim: usize,
    n_q: usize,
    n_k: usize,
    eps: f32,
) -> Result<()> {
    const OP: &str = "qkv_norm";
    need_len(dev, OP, "x", x, 0, ((n_q + n_k) * head_dim) as u64 * 4)?;
    need_len(dev, OP, "wq", wq, 0, head_dim as u64 * 4)?;
    need_len(dev, OP, "wk", wk, 0, head_dim as u64 * 4)?;
    let p = QkvNormParams {
        head_dim: to_u32(OP, "head_dim", head_dim)?,
        n_q: to_u32(OP, "n_q", n_q)?,
        n_k: to_u32(OP, "n_k", n_k)?,
        eps,
    };
    encode(
        dev,
        "kernel_qkv_norm_f32",
        [to_u32(OP, "groups", (n_q + n_k).div_ceil(4).max(1))?, 1, 1],
        [128, 1, 1],
        &[
            Arg::Buffer(x, 0),
            Arg::Buffer(wq, 0),
            Arg::Buffer(wk, 0),
            Arg::Bytes(as_bytes(&p)),
        ],
        &[],
    )
}

/// The shape of a fused bias + RoPE + KV store.
#[derive(Clone, Copy, Debug)]
pub struct QkvStore {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub freq_base: f32,
    pub freq_scale: f32,
    pub style: RopeStyle,
    pub kv: KvType,
    /// Rows of each KV region.
    pub n_cells: usize,
}

/// Finishes one token's q|k|v row `qkv` (`[q | k | v]`, f32): adds the biases `(bq, bk, bv)`
/// when given, RoPE on q and k at `pos[0]`, q to `q_out`, k and v to row `cells[0]` of the
/// regions. The cell is checked on the host first (an error naming it, never a silent skip).
#[allow(clippy::too_many_arguments)]
pub fn launch_qkv_rope_store<D: Device>(
    dev: &D,
    s: &QkvStore,
    qkv: &D::Buffer,
    bias: Option<[&D::Buffer; 3]>,
    pos: &D::Buffer,
    cells: &D::Buffer,
    q_out: &D::Buffer,
    k_region: &D::Buffer,
    v_region: &D::Buffer,
) -> Result<()> {
    const OP: &str = "qkv_rope_store";
    let (q_dim, kv_dim) = (s.n_head * s.head_dim, s.n_head_kv * s.head_dim);
    if s.head_dim == 0 || !s.head_dim.is_multiple_of(2) {
        return Err(Error::Shape {
            op: OP,
            reason: format!("RoPE over a head dim of {}", s.head_dim),
        });
    }
    let kernel = match s.kv {
        KvType::F32 => "kernel_qkv_rope_store_f32",
        KvType::F16 => "kernel_qkv_rope_store_f16",
        KvType::Q8_0 if kv_dim.is_multiple_of(32) => "kernel_qkv_rope_store_q8_0",
        KvType::Q8_0 => {
            return Err(Error::Shape {
                op: OP,
                reason: format!("q8_0 KV rows need a multiple of 32 elements, got {kv_dim}"),
            })
        }
    };
    let row_bytes = s.kv.row_bytes(kv_dim);
    need_len(dev, OP, "qkv", qkv, 0, (q_dim + 2 * kv_dim) as u64 * 4)?;
    need_len(dev, OP, "q", q_out, 0, q_dim as u64 * 4)?;
    for (what, r) in [("k region", k_region), ("v region", v_region)] {
        need_len(dev, OP, what, r, 0, (row_bytes * s.n_cells) as u64)?;
    }
    if let Some([bq, bk, bv]) = bias {
        need_len(dev, OP, "q bias", bq, 0, q_dim as u64 * 4)?;
        need_len(dev, OP, "k bias", bk, 0, kv_dim as u64 * 4)?;
        need_len(dev, OP, "v bias", bv, 0, kv_dim as u64 * 4)?;
    }
    let cell = read_i32s(dev, cells, 1)?[0];
    if cell < 0 || cell as usize >= s.n_cells {
        return Err(Error::Shape {
            op: OP,
            reason: format!(
                "the token stores to cell {cell}, the region has n_ctx {}",
                s.n_cells
            ),
        });
    }
    let p = QkvStoreParams {
        n_head: to_u32(OP, "n_head", s.n_head)?,
        n_head_kv: to_u32(OP, "n_head_kv", s.n_head_kv)?,
        head_dim: to_u32(OP, "head_dim", s.head_dim)?,
        has_bias: bias.is_some() as u32,
        freq_base: s.freq_base,
        freq_scale: s.freq_scale,
        style: super::rope::style_code(s.style),
        dst_row_bytes: to_u32(OP, "row bytes", row_bytes)?,
    };
    // Without biases the bias slots are bound to the row itself and never read.
    let [bq, bk, bv] = bias.unwrap_or([qkv, qkv, qkv]);
    encode(
        dev,
        kernel,
        [to_u32(OP, "groups", q_dim.max(kv_dim).div_ceil(64))?, 3, 1],
        [64, 1, 1],
        &[
            Arg::Buffer(qkv, 0),
            Arg::Buffer(bq, 0),
            Arg::Buffer(bk, 0),
            Arg::Buffer(bv, 0),
            Arg::Buffer(pos, 0),
            Arg::Buffer(cells, 0),
            Arg::Buffer(q_out, 0),
            Arg::Buffer(k_region, 0),
            Arg::Buffer(v_region, 0),
            Arg::Bytes(as_bytes(&p)),
        ],
        &[],
    )
}

/// `dst[i] = silu(gu[i]) * gu[n + i]` over one token's gate|up row of `2n` f32.
pub fn launch_swiglu_split<D: Device>(
    dev: &D,
    gu: &D::Buffer,
    dst: &D::Buffer,
    n: usize,
) -> Result<()> {
    const OP: &str = "swiglu_split";
    need_len(dev, OP, "gate|up", gu, 0, 2 * n as u64 * 4)?;
    need_len(dev, OP, "dst", dst, 0, n as u64 * 4)?;
    let p = ElementwiseParams {
        n: to_u32(OP, "n", n)?,
    };
    encode(
        dev,
        "kernel_swiglu_split_f32",
        [to_u32(OP, "threadgroups", n.div_ceil(256).max(1))?, 1, 1],
        [256, 1, 1],
        &[
            Arg::Buffer(gu, 0),
            Arg::Buffer(dst, 0),
            Arg::Bytes(as_bytes(&p)),
        ],
        &[],
    )
}
