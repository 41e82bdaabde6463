//! One plain launch fn per kernel family: buffers and sizes in, one dispatch (plus the
//! buffer-scope barrier after it) out. Shapes and device limits are checked here and refused
//! with a typed error; kernels assume what these fns guarantee.

mod attention;
mod elementwise;
mod fused;
mod kv;
mod matmul;
mod norm;
mod rope;
mod window;
mod window_fast;

pub use attention::{
    attention_scratch_bytes, decode_chunks, flash_decode_scratch_bytes,
    flash_prefill_scratch_bytes, launch_attention, launch_attn_classic, launch_flash_decode,
    launch_flash_prefill, launch_flash_prefill_with_tail_origin, AttnShape, KvType,
};
pub use elementwise::{launch_add, launch_add_rows, launch_mul, launch_silu, launch_swiglu};
pub use fused::{launch_qkv_norm, launch_qkv_rope_store, launch_swiglu_split, QkvStore};
pub use kv::{launch_store_kv, q8_0_row_bytes};
pub use matmul::{
    class_tier, gemm_fits, launch_get_rows, launch_matmul, launch_matmul_rows, launch_matmul_tier,
    launch_mm, launch_mv, launch_mv_multi, matmul_kernel_suffix, rows_tier, MatmulTier,
};
pub use norm::{launch_qk_norm, launch_rms_norm, launch_rms_norm_256};
pub use rope::{launch_kv_rope_shift, launch_rope};
pub use window::{
    check_windows, launch_attention_window, launch_attention_window_sized,
    launch_attention_window_with, launch_window_prefill_with_tail_bug, window_class_kernel,
    window_family_scratch_bytes, window_kernel, window_kernel_for, window_scratch_bytes, AttnEnv,
    WindowAttn, WindowKernel, WindowKind, FLASH_WINDOW_CHUNK, SPLIT_WINDOW_ROWS,
};
pub use window_fast::{prefill_tiles, PREFILL_TILE_QUERIES, PREFILL_WAVE_TILES};

use crate::device::{Arg, Device, Dispatch};
use crate::error::{Error, Result};

/// Encodes one dispatch after checking it against the queried limits, then the barrier.
pub(crate) fn encode<D: Device>(
    dev: &D,
    kernel: &str,
    grid: [u32; 3],
    threadgroup: [u32; 3],
    args: &[Arg<'_, D::Buffer>],
    threadgroup_memory: &[u64],
) -> Result<()> {
    let limits = dev.limits();
    if limits.simd_width != 32 {
        return Err(Error::Limit {
            what: "simdgroup width (kernels need 32)",
            requested: 32,
            limit: limits.simd_width as u64,
        });
    }
    let threads: u64 = threadgroup.iter().map(|&v| v as u64).product();
    if threads > limits.max_threads_per_threadgroup as u64 {
        return Err(Error::Limit {
            what: "threads per threadgroup",
            requested: threads,
            limit: limits.max_threads_per_threadgroup as u64,
        });
    }
    let mem: u64 = threadgroup_memory.iter().sum();
    if mem > limits.max_threadgroup_memory {
        return Err(Error::Limit {
            what: "threadgroup memory bytes",
            requested: mem,
            limit: limits.max_threadgroup_memory,
        });
    }
    let pipeline = dev.pipeline(kernel)?;
    dev.dispatch(
        &pipeline,
        &Dispatch {
            label: kernel,
            grid,
            threadgroup,
            args,
            threadgroup_memory,
        },
    )?;
    dev.barrier()
}

pub(crate) fn to_u32(op: &'static str, what: &str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| Error::Shape {
        op,
        reason: format!("{what} = {v} does not fit in u32"),
    })
}

pub(crate) fn need_len<D: Device>(
    dev: &D,
    op: &'static str,
    what: &str,
    buf: &D::Buffer,
    offset: u64,
    bytes: u64,
) -> Result<()> {
    let have = dev.buffer_len(buf) as u64;
    if offset + bytes > have {
        return Err(Error::Shape {
            op,
            reason: format!("{what} needs {bytes} bytes at offset {offset}, buffer has {have}"),
        });
    }
    Ok(())
}

/// Reads an i32 index buffer on the host (shared storage). Indices are host-written inputs,
/// so this is the bound check the design asks for before any dispatch that uses them.
pub(crate) fn read_i32s<D: Device>(dev: &D, buf: &D::Buffer, n: usize) -> Result<Vec<i32>> {
    let mut bytes = vec![0u8; n * 4];
    dev.read_bytes(buf, 0, &mut bytes)?;
    Ok(bytes
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}
