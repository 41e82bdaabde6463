use super::{encode, need_len, to_u32};
use crate::device::{as_bytes, Arg, Device};
use crate::error::{Error, Result};
use crate::params::RmsNormParams;

fn check<D: Device>(
    dev: &D,
    op: &'static str,
    x: &D::Buffer,
    w: &D::Buffer,
    dst: &D::Buffer,
    ncols: usize,
    nrows: usize,
) -> Result<RmsNormParams> {
    if ncols == 0 {
        return Err(Error::Shape {
            op,
            reason: "ncols = 0".into(),
        });
    }
    let bytes = (ncols * nrows) as u64 * 4;
    need_len(dev, op, "x", x, 0, bytes)?;
    need_len(dev, op, "dst", dst, 0, bytes)?;
    need_len(dev, op, "weight", w, 0, ncols as u64 * 4)?;
    Ok(RmsNormParams {
        ncols: to_u32(op, "ncols", ncols)?,
        nrows: to_u32(op, "nrows", nrows)?,
        eps: 0.0,
    })
}

/// RMSNorm of `nrows` rows of `ncols` f32 with gain `w[ncols]`; one threadgroup per row,
/// sized to the row (a multiple of 32, at most the device limit and 1024).
pub fn launch_rms_norm<D: Device>(
    dev: &D,
    x: &D::Buffer,
    w: &D::Buffer,
    dst: &D::Buffer,
    ncols: usize,
    nrows: usize,
    eps: f32,
) -> Result<()> {
    let mut p = check(dev, "rms_norm", x, w, dst, ncols, nrows)?;
    p.eps = eps;
    let limit = dev.limits().max_threads_per_threadgroup.min(1024) as usize;
    let threads = (ncols.div_ceil(4).div_ceil(32) * 32).clamp(32, limit / 32 * 32);
    encode(
        dev,
        "kernel_rms_norm_f32",
        [to_u32("rms_norm", "nrows", nrows)?, 1, 1],
        [threads as u32, 1, 1],
        &[
            Arg::Buffer(x, 0),
            Arg::Buffer(w, 0),
            Arg::Buffer(dst, 0),
            Arg::Bytes(as_bytes(&p)),
        ],
        &[],
    )
}

/// The 256-thread RMSNorm variant.
pub fn launch_rms_norm_256<D: Device>(
    dev: &D,
    x: &D::Buffer,
    w: &D::Buffer,
    dst: &D::Buffer,
    ncols: usize,
    nrows: usize,
    eps: f32,
) -> Result<()> {
    let mut p = check(dev, "rms_norm_256", x, w, dst, ncols, nrows)?;
    p.eps = eps;
    encode(
        dev,
        "kernel_rms_norm_256_f32",
        [to_u32("rms_norm_256", "nrows", nrows)?, 1, 1],
        [256, 1, 1],
        &[
            Arg::Buffer(x, 0),
            Arg::Buffer(w, 0),
            Arg::Buffer(dst, 0),
            Arg::Bytes(as_bytes(&p)),
        ],
        &[],
    )
}

/// Per-head QK norm: `n_rows` head rows of `head_dim`, gain `w[head_dim]` shared by heads.
pub fn launch_qk_norm<D: Device>(
    dev: &D,
    x: &D::Buffer,
    w: &D::Buffer,
    dst: &D::Buffer,
    head_dim: usize,
    n_rows: usize,
    eps: f32,
) -> Result<()> {
    let mut p = check(dev, "qk_norm", x, w, dst, head_dim, n_rows)?;
    p.eps = eps;
    encode(
        dev,
        "kernel_qk_norm_f32",
        [
            to_u32("qk_norm", "row groups", n_rows.div_ceil(4).max(1))?,
            1,
            1,
        ],
        [128, 1, 1],
        &[
            Arg::Buffer(x, 0),
            Arg::Buffer(w, 0),
            Arg::Buffer(dst, 0),
            Arg::Bytes(as_bytes(&p)),
        ],
        &[],
    )
}
