use super::{encode, need_len, to_u32};
use crate::device::{as_bytes, Arg, Device};
use crate::error::Result;
use crate::params::ElementwiseParams;

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
