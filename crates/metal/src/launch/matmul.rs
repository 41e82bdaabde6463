use minfer_gguf::GgmlType;
use minfer_graph::RowClass;

use super::{encode, need_len, read_i32s, to_u32};
use crate::device::{as_bytes, Arg, Device};
use crate::error::{Error, Result};
use crate::params::{GetRowsParams, MatmulParams};

/// The kernel-name suffix of a weight type; every type has its own kernels. Anything else
/// is refused by name (never run through another type's kernel).
pub fn matmul_kernel_suffix(op: &'static str, ty: GgmlType) -> Result<&'static str> {
    Ok(match ty {
        GgmlType::F32 => "f32",
        GgmlType::F16 => "f16",
        GgmlType::Bf16 => "bf16",
        GgmlType::Q4_0 => "q4_0",
        GgmlType::Q4_1 => "q4_1",
        GgmlType::Q5_0 => "q5_0",
        GgmlType::Q5_1 => "q5_1",
        GgmlType::Q8_0 => "q8_0",
        GgmlType::Q8_1 => "q8_1",
        GgmlType::Q2K => "q2_k",
        GgmlType::Q3K => "q3_k",
        GgmlType::Q4K => "q4_k",
        GgmlType::Q5K => "q5_k",
        GgmlType::Q6K => "q6_k",
        GgmlType::Q8K => "q8_k",
        GgmlType::Iq4Nl => "iq4_nl",
        GgmlType::Iq4Xs => "iq4_xs",
        other => {
            return Err(Error::UnsupportedType {
                op,
                ty: other.name().to_string(),
            })
        }
    })
}

/// Which matmul kernel runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatmulTier {
    /// Single token.
    Mv,
    /// Few tokens: two output rows per threadgroup, tokens looped inside.
    Multi,
    /// Prefill: the 64x32 simdgroup GEMM.
    Gemm,
}

const GEMM_TG_MEM: u64 = 8192;

/// The weight-type geometry check shared by the tiers: k must split into whole blocks and
/// 16-element chunks (32 for the GEMM's K step).
fn row_bytes(op: &'static str, ty: GgmlType, k: usize, k_align: usize) -> Result<usize> {
    let block = ty.block_size() as usize;
    if !k.is_multiple_of(block) || !k.is_multiple_of(k_align) {
        return Err(Error::Shape {
            op,
            reason: format!(
                "k = {k} must be a multiple of {} ({} block) and {k_align}",
                block,
                ty.name()
            ),
        });
    }
    ty.row_bytes(k as u64)
        .map(|b| b as usize)
        .ok_or_else(|| Error::Shape {
            op,
            reason: format!("row of {k} {} elements", ty.name()),
        })
}

/// The matmul of one tier: `out[t, r] = dot(W[r, :], x[t, :])`, W `[n, k]` of type `ty` at
/// byte offset `w_offset` of `w`, x `[nt, k]` f32, out `[nt, n]` f32.
#[allow(clippy::too_many_arguments)]
pub fn launch_matmul_tier<D: Device>(
    dev: &D,
    tier: MatmulTier,
    ty: GgmlType,
    w: &D::Buffer,
    w_offset: u64,
    x: &D::Buffer,
    out: &D::Buffer,
    k: usize,
    n: usize,
    nt: usize,
) -> Result<()> {
    launch_matmul_rows(dev, tier, ty, w, w_offset, x, out, k, n, 0, nt)
}

/// [`launch_matmul_tier`] over rows `row0..row0 + nt` of x and out (a run of one row class
/// inside a node's rows): the kernels see the run as rows `0..nt` through buffer offsets.
#[allow(clippy::too_many_arguments)]
pub fn launch_matmul_rows<D: Device>(
    dev: &D,
    tier: MatmulTier,
    ty: GgmlType,
    w: &D::Buffer,
    w_offset: u64,
    x: &D::Buffer,
    out: &D::Buffer,
    k: usize,
    n: usize,
    row0: usize,
    nt: usize,
) -> Result<()> {
    const OP: &str = "matmul";
    let suffix = matmul_kernel_suffix(OP, ty)?;
    let rb = row_bytes(OP, ty, k, if tier == MatmulTier::Gemm { 32 } else { 16 })?;
    if n == 0 || nt == 0 {
        return Err(Error::Shape {
            op: OP,
            reason: format!("empty matmul n = {n}, nt = {nt}"),
        });
    }
    if tier == MatmulTier::Mv && nt != 1 {
        return Err(Error::Shape {
            op: OP,
            reason: format!("the mat-vec kernel takes one token, got {nt}"),
        });
    }
    let (x_off, out_off) = ((row0 * k) as u64 * 4, (row0 * n) as u64 * 4);
    need_len(dev, OP, "weight", w, w_offset, (rb * n) as u64)?;
    need_len(dev, OP, "x", x, x_off, (k * nt) as u64 * 4)?;
    need_len(dev, OP, "out", out, out_off, (n * nt) as u64 * 4)?;
    let p = MatmulParams {
        k: to_u32(OP, "k", k)?,
        n: to_u32(OP, "n", n)?,
        nt: to_u32(OP, "nt", nt)?,
        row_bytes: to_u32(OP, "row bytes", rb)?,
    };
    let args = [
        Arg::Buffer(w, w_offset),
        Arg::Buffer(x, x_off),
        Arg::Buffer(out, out_off),
        Arg::Bytes(as_bytes(&p)),
    ];
    let rows2 = to_u32(OP, "row pairs", n.div_ceil(2))?;
    match tier {
        MatmulTier::Mv => encode(
            dev,
            &format!("kernel_mv_{suffix}_f32"),
            [rows2, 1, 1],
            [64, 1, 1],
            &args,
            &[],
        ),
        MatmulTier::Multi => encode(
            dev,
            &format!("kernel_mv_multi_{suffix}_f32"),
            [rows2, 1, 1],
            [64, 1, 1],
            &args,
            &[],
        ),
        MatmulTier::Gemm => encode(
            dev,
            &format!("kernel_mm_{suffix}_f32"),
            [
                to_u32(OP, "token tiles", nt.div_ceil(32))?,
                to_u32(OP, "row tiles", n.div_ceil(64))?,
                1,
            ],
            [128, 1, 1],
            &args,
            &[GEMM_TG_MEM],
        ),
    }
}

/// Single-token mat-vec.
#[allow(clippy::too_many_arguments)]
pub fn launch_mv<D: Device>(
    dev: &D,
    ty: GgmlType,
    w: &D::Buffer,
    w_offset: u64,
    x: &D::Buffer,
    out: &D::Buffer,
    k: usize,
    n: usize,
) -> Result<()> {
    launch_matmul_tier(dev, MatmulTier::Mv, ty, w, w_offset, x, out, k, n, 1)
}

/// Multi-row kernel (any token count).
#[allow(clippy::too_many_arguments)]
pub fn launch_mv_multi<D: Device>(
    dev: &D,
    ty: GgmlType,
    w: &D::Buffer,
    w_offset: u64,
    x: &D::Buffer,
    out: &D::Buffer,
    k: usize,
    n: usize,
    nt: usize,
) -> Result<()> {
    launch_matmul_tier(dev, MatmulTier::Multi, ty, w, w_offset, x, out, k, n, nt)
}

/// Simdgroup GEMM (any token count; meant for prefill).
#[allow(clippy::too_many_arguments)]
pub fn launch_mm<D: Device>(
    dev: &D,
    ty: GgmlType,
    w: &D::Buffer,
    w_offset: u64,
    x: &D::Buffer,
    out: &D::Buffer,
    k: usize,
    n: usize,
    nt: usize,
) -> Result<()> {
    launch_matmul_tier(dev, MatmulTier::Gemm, ty, w, w_offset, x, out, k, n, nt)
}

/// Whether the GEMM can run a matrix with rows of `k` on `dev`: its K step of 32 and its
/// 8 KiB of threadgroup memory (a property of the matrix and the device, never of a forward).
pub fn gemm_fits<D: Device>(dev: &D, k: usize) -> bool {
    k.is_multiple_of(32) && dev.limits().max_threadgroup_memory >= GEMM_TG_MEM
}

/// The tier of a run of `nt` rows of one class (docs/PRECISION.md, "Row classes"): prompt
/// rows on the GEMM whatever their number (a 1-token remainder included), where the matrix
/// and the device allow it, else on the multi-row kernel; generation rows on the mat-vec
/// (one row) or the multi-row kernel (more), which compute a row with the same arithmetic
/// (the same chunk order per lane, then one `simd_sum`), so their bits never depend on the
/// run's length.
pub fn class_tier<D: Device>(dev: &D, class: RowClass, k: usize, nt: usize) -> MatmulTier {
    match class {
        RowClass::Prompt if gemm_fits(dev, k) => MatmulTier::Gemm,
        RowClass::Prompt => MatmulTier::Multi,
        RowClass::Generation if nt == 1 => MatmulTier::Mv,
        RowClass::Generation => MatmulTier::Multi,
    }
}

/// The tier chosen by the forward's row count (the choice before row classes): GEMM when
/// `nt >= 2 && (n >= 2048 || nt >= 9)` and [`gemm_fits`]; the multi-row kernel for other
/// `nt > 1`; the mat-vec for one token. Only the gates' control
/// (`MINFER_METAL_TIER_CONTROL=by-rows`) runs it: a row's bits then depend on its batch.
pub fn rows_tier<D: Device>(dev: &D, k: usize, n: usize, nt: usize) -> MatmulTier {
    if nt == 1 {
        MatmulTier::Mv
    } else if (n >= 2048 || nt >= 9) && gemm_fits(dev, k) {
        MatmulTier::Gemm
    } else {
        MatmulTier::Multi
    }
}

/// The matmul of a run of `nt` rows of `class` ([`class_tier`]); returns the tier it ran.
#[allow(clippy::too_many_arguments)]
pub fn launch_matmul<D: Device>(
    dev: &D,
    class: RowClass,
    ty: GgmlType,
    w: &D::Buffer,
    w_offset: u64,
    x: &D::Buffer,
    out: &D::Buffer,
    k: usize,
    n: usize,
    nt: usize,
) -> Result<MatmulTier> {
    let tier = class_tier(dev, class, k, nt);
    launch_matmul_tier(dev, tier, ty, w, w_offset, x, out, k, n, nt)?;
    Ok(tier)
}

/// Gathers rows `ids[n_ids]` (i32, checked on the host against `n_rows`) of a `[n_rows, ncols]`
/// table of type `ty` into f32 `dst[n_ids, ncols]`.
#[allow(clippy::too_many_arguments)]
pub fn launch_get_rows<D: Device>(
    dev: &D,
    ty: GgmlType,
    w: &D::Buffer,
    w_offset: u64,
    ids: &D::Buffer,
    dst: &D::Buffer,
    ncols: usize,
    n_rows: usize,
    n_ids: usize,
) -> Result<()> {
    const OP: &str = "get_rows";
    let suffix = matmul_kernel_suffix(OP, ty)?;
    let rb = row_bytes(OP, ty, ncols, 16)?;
    need_len(dev, OP, "table", w, w_offset, (rb * n_rows) as u64)?;
    need_len(dev, OP, "dst", dst, 0, (ncols * n_ids) as u64 * 4)?;
    for (i, id) in read_i32s(dev, ids, n_ids)?.into_iter().enumerate() {
        if id < 0 || id as usize >= n_rows {
            return Err(Error::Shape {
                op: OP,
                reason: format!("id[{i}] = {id} outside the table's {n_rows} rows"),
            });
        }
    }
    let p = GetRowsParams {
        ncols: to_u32(OP, "ncols", ncols)?,
        n_ids: to_u32(OP, "n_ids", n_ids)?,
        row_bytes: to_u32(OP, "row bytes", rb)?,
        n_rows: to_u32(OP, "n_rows", n_rows)?,
    };
    encode(
        dev,
        &format!("kernel_get_rows_{suffix}"),
        [
            p.n_ids,
            to_u32(OP, "chunk groups", (ncols / 16).div_ceil(64))?,
            1,
        ],
        [64, 1, 1],
        &[
            Arg::Buffer(w, w_offset),
            Arg::Buffer(ids, 0),
            Arg::Buffer(dst, 0),
            Arg::Bytes(as_bytes(&p)),
        ],
        &[],
    )
}
