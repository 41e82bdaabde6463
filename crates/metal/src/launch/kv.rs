use super::{encode, need_len, read_i32s, to_u32};
use crate::device::{as_bytes, Arg, Device};
use crate::error::{Error, Result};
use crate::params::KvStoreParams;

/// Row stride of a packed Q8_0 KV region: 34 bytes per 32 elements, padded to whole f32
/// words so a row move is a plain word copy.
pub fn q8_0_row_bytes(row_elems: usize) -> usize {
    (row_elems / 32 * 34).div_ceil(4) * 4
}

/// Stores `n_tokens` f32 rows of `row_elems` into a KV region of `n_ctx` rows (element type
/// `kv`: f32, f16 or packed q8_0) at the i32 `cells`. Every cell is checked on the host
/// first: a cell past the region is an error naming it, never a silent skip.
#[allow(clippy::too_many_arguments)]
pub fn launch_store_kv<D: Device>(
    dev: &D,
    kv: super::KvType,
    src: &D::Buffer,
    cells: &D::Buffer,
    region: &D::Buffer,
    row_elems: usize,
    n_tokens: usize,
    n_ctx: usize,
) -> Result<()> {
    const OP: &str = "store_kv";
    let (kernel, row_bytes, per_thread) = match kv {
        super::KvType::F32 => ("kernel_store_kv_f32", row_elems * 4, 1),
        super::KvType::F16 => ("kernel_store_kv_f16", row_elems * 2, 1),
        super::KvType::Q8_0 => {
            if !row_elems.is_multiple_of(32) {
                return Err(Error::Shape {
                    op: OP,
                    reason: format!("q8_0 KV rows need a multiple of 32 elements, got {row_elems}"),
                });
            }
            ("kernel_store_kv_q8_0", q8_0_row_bytes(row_elems), 32)
        }
    };
    need_len(dev, OP, "src", src, 0, (row_elems * n_tokens) as u64 * 4)?;
    need_len(dev, OP, "region", region, 0, (row_bytes * n_ctx) as u64)?;
    for (t, c) in read_i32s(dev, cells, n_tokens)?.into_iter().enumerate() {
        if c < 0 || c as usize >= n_ctx {
            return Err(Error::Shape {
                op: OP,
                reason: format!("token {t} stores to cell {c}, region has n_ctx {n_ctx}"),
            });
        }
    }
    let p = KvStoreParams {
        row_elems: to_u32(OP, "row_elems", row_elems)?,
        n_tokens: to_u32(OP, "n_tokens", n_tokens)?,
        n_ctx: to_u32(OP, "n_ctx", n_ctx)?,
        dst_row_bytes: to_u32(OP, "row bytes", row_bytes)?,
    };
    let items = row_elems / per_thread;
    encode(
        dev,
        kernel,
        [
            to_u32(OP, "groups", items.div_ceil(64).max(1))?,
            p.n_tokens.max(1),
            1,
        ],
        [64, 1, 1],
        &[
            Arg::Buffer(src, 0),
            Arg::Buffer(cells, 0),
            Arg::Buffer(region, 0),
            Arg::Bytes(as_bytes(&p)),
        ],
        &[],
    )
}
