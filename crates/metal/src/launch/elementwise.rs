use super::{encode, need_len, to_u32};
use crate::device::{as_bytes, Arg, Device};
use crate::error::Result;
use crate::params::{AddRowsParams, ElementwiseParams};

fn binary<D: Device>(
    dev: &D,
    kernel: &str,
    op: &'static str,
    a: &D::Buffer,
    b: &D::Buffer,
    dst: &D::Buffer,
    n: usize,
) -> Result<()> {
    for (what, buf) in [("a", a), ("b", b), ("dst", dst)] {
        need_len(dev, op, what, buf, 0, n as u64 * 4)?;
    }
    let p = ElementwiseParams {
        n: to_u32(op, "n", n)?,
    };
    let groups = to_u32(op, "threadgroups", n.div_ceil(256).max(1))?;
    encode(
        dev,
        kernel,
        [groups, 1, 1],
        [256, 1, 1],
        &[
            Arg::Buffer(a, 0),
            Arg::Buffer(b, 0),
            Arg::Buffer(dst, 0),
            Arg::Bytes(as_bytes(&p)),
        ],
        &[],
    )
}

/// `dst = a + b` over `n` f32 (dst may alias a or b).
pub fn launch_add<D: Device>(
    dev: &D,
    a: &D::Buffer,
    b: &D::Buffer,
    dst: &D::Buffer,
    n: usize,
) -> Result<()> {
    binary(dev, "kernel_add_f32", "add", a, b, dst, n)
}

/// `dst = a * b` over `n` f32.
pub fn launch_mul<D: Device>(
    dev: &D,
    a: &D::Buffer,
    b: &D::Buffer,
    dst: &D::Buffer,
    n: usize,
) -> Result<()> {
    binary(dev, "kernel_mul_f32", "mul", a, b, dst, n)
}

/// `dst = silu(gate) * up` over `n` f32.
pub fn launch_swiglu<D: Device>(
    dev: &D,
    gate: &D::Buffer,
    up: &D::Buffer,
    dst: &D::Buffer,
    n: usize,
) -> Result<()> {
    binary(dev, "kernel_swiglu_f32", "swiglu", gate, up, dst, n)
}

/// `dst = silu(x) = x / (1 + e^-x)` over `n` f32 (dst may alias x).
pub fn launch_silu<D: Device>(dev: &D, x: &D::Buffer, dst: &D::Buffer, n: usize) -> Result<()> {
    const OP: &str = "silu";
    need_len(dev, OP, "x", x, 0, n as u64 * 4)?;
    need_len(dev, OP, "dst", dst, 0, n as u64 * 4)?;
    let p = ElementwiseParams {
        n: to_u32(OP, "n", n)?,
    };
    encode(
        dev,
        "kernel_silu_f32",
        [to_u32(OP, "threadgroups", n.div_ceil(256).max(1))?, 1, 1],
        [256, 1, 1],
        &[
            Arg::Buffer(x, 0),
            Arg::Buffer(dst, 0),
            Arg::Bytes(as_bytes(&p)),
        ],
        &[],
    )
}

/// `dst[t][i] = x[t][i] + b[i]` over `nrows` rows of `ncols` f32, `b` a `[ncols]` vector (a
/// matmul bias); dst may alias x. Nothing is encoded for an empty shape.
pub fn launch_add_rows<D: Device>(
    dev: &D,
    x: &D::Buffer,
    b: &D::Buffer,
    dst: &D::Buffer,
    ncols: usize,
    nrows: usize,
) -> Result<()> {
    const OP: &str = "add_rows";
    let bytes = (ncols * nrows) as u64 * 4;
    need_len(dev, OP, "x", x, 0, bytes)?;
    need_len(dev, OP, "dst", dst, 0, bytes)?;
    need_len(dev, OP, "b", b, 0, ncols as u64 * 4)?;
    if ncols == 0 || nrows == 0 {
        return Ok(());
    }
    let p = AddRowsParams {
        ncols: to_u32(OP, "ncols", ncols)?,
        nrows: to_u32(OP, "nrows", nrows)?,
    };
    encode(
        dev,
        "kernel_add_rows_f32",
        [to_u32(OP, "threadgroups", ncols.div_ceil(256))?, p.nrows, 1],
        [256, 1, 1],
        &[
            Arg::Buffer(x, 0),
            Arg::Buffer(b, 0),
            Arg::Buffer(dst, 0),
            Arg::Bytes(as_bytes(&p)),
        ],
        &[],
    )
}
