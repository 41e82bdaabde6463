//! KV storage and GQA attention over the persistent K/V regions.
//!
//! A region holds `n_ctx` cells; a cell is one row of `n_head_kv * head_dim` values in the
//! cache type (F32, F16 or Q8_0; Q8_0 needs `head_dim % 32 == 0` so heads are whole blocks).
//! Attention itself is the tiled online-softmax kernel of [`flash`], except for an F16 cache
//! with fewer query rows than llama.cpp's tile ([`attn_f16::GGML_FA_TILE_Q`]), which gets
//! llama.cpp's own flash-attention arithmetic ([`ggml_f16`], see docs/PRECISION.md).

mod flash;
mod ggml_f16;

pub use flash::{BLOCK, WINDOW};

use super::{as_i32, attn_f16, KResult, KernelError};
use crate::simd::attn::KvKernels;
use crate::simd::Isa;
use minfer_gguf::{quants, GgmlType};

/// Bytes of one cell.
pub fn cell_bytes(ty: GgmlType, n_embd_kv: usize) -> KResult<usize> {
    ty.row_bytes(n_embd_kv as u64)
        .map(|b| b as usize)
        .ok_or_else(|| KernelError(format!("KV row of {n_embd_kv} is not whole {ty} blocks")))
}

/// Writes `x` rows (`[n_tokens][n_embd_kv]`) into `region` at `cells`.
pub fn kv_store(
    ty: GgmlType,
    x: &[f32],
    n_embd_kv: usize,
    cells: &[f32],
    region: &mut [u8],
) -> KResult<()> {
    let cb = cell_bytes(ty, n_embd_kv)?;
    let n_cells = region.len() / cb;
    for (xr, &c) in x.chunks_exact(n_embd_kv).zip(cells) {
        let c = as_i32(c);
        if c < 0 || c as usize >= n_cells {
            return Err(KernelError(format!(
                "KV cell {c} out of range 0..{n_cells}"
            )));
        }
        let c = c as usize;
        quants::quantize_row(ty, xr, &mut region[c * cb..(c + 1) * cb])?;
    }
    Ok(())
}

pub struct AttnParams {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub scale: f32,
    pub cache_type: GgmlType,
    /// `Some`: llama.cpp's x86 flash-attention arithmetic of that build (f16 caches only).
    pub ggml: Option<crate::ggml_x86::GgmlSimd>,
}

/// `q`/`out`: `[n_tokens][n_head * head_dim]`; `span`: `[n_tokens][2]` `[lo, hi)` cells.
///
/// Tolerance class (not bit-identical to a two-pass softmax): scores are f64 sums of exact
/// products, but the online softmax rescales its f32 accumulator when the running max grows,
/// merges per-window states and accumulates V in FMA lanes, so results differ from exact
/// attention over the stored K/V values by f32 rounding (relative ~1e-7 to 1e-6,
/// `tests/attn_flash.rs`). They do not depend on the thread count.
pub fn attention(
    p: &AttnParams,
    q: &[f32],
    span: &[f32],
    k: &[u8],
    v: &[u8],
    out: &mut [f32],
    threads: usize,
) -> KResult<()> {
    let row = p.n_head * p.head_dim;
    let nt = q.len().checked_div(row).unwrap_or(0);
    if let Some(simd) = p.ggml {
        if p.cache_type != GgmlType::F16 {
            return Err(KernelError(format!(
                "llama.cpp x86 numerics cover attention over an f16 KV cache, not {}",
                p.cache_type
            )));
        }
        let call = prepare(Isa::Scalar, p, q, span, k, v)?;
        return ggml_f16::run_ggml(simd, &call, out, threads);
    }
    if p.cache_type == GgmlType::F16 && nt < attn_f16::GGML_FA_TILE_Q {
        let call = prepare(Isa::Scalar, p, q, span, k, v)?;
        return ggml_f16::run(&call, out, threads);
    }
    attention_on(crate::simd::detected(), p, q, span, k, v, out, threads)
}

/// [`attention`] with the row kernels of `isa` (tests, benchmarks); an instruction set this
/// machine lacks is an error.
#[allow(clippy::too_many_arguments)]
pub fn attention_on(
    isa: Isa,
    p: &AttnParams,
    q: &[f32],
    span: &[f32],
    k: &[u8],
    v: &[u8],
    out: &mut [f32],
    threads: usize,
) -> KResult<()> {
    let call = prepare(isa, p, q, span, k, v)?;
    flash::run(&call, out, threads)
}

/// Checks shapes and spans and gathers what a kernel needs.
fn prepare<'a>(
    isa: Isa,
    p: &'a AttnParams,
    q: &'a [f32],
    span: &[f32],
    k: &'a [u8],
    v: &'a [u8],
) -> KResult<flash::Call<'a>> {
    let hd = p.head_dim;
    if p.n_head_kv == 0 || hd == 0 || !p.n_head.is_multiple_of(p.n_head_kv) {
        return Err(KernelError(format!(
            "attention needs n_head a multiple of n_head_kv and head_dim > 0, got {} heads, \
             {} KV heads, head_dim {hd}",
            p.n_head, p.n_head_kv
        )));
    }
    let kern = KvKernels::on(isa, p.cache_type)?;
    let n_embd_kv = p.n_head_kv * hd;
    let cb = cell_bytes(p.cache_type, n_embd_kv)?;
    let head_bytes = cell_bytes(p.cache_type, hd)?;
    let n_cells = k.len() / cb;
    if v.len() / cb != n_cells {
        return Err(KernelError(format!(
            "K region holds {n_cells} cells, V region {}",
            v.len() / cb
        )));
    }
    let row = p.n_head * hd;
    if !q.len().is_multiple_of(row) || span.len() != 2 * (q.len() / row) {
        return Err(KernelError(format!(
            "attention of {} query values ({row} per token) with {} span values",
            q.len(),
            span.len()
        )));
    }
    let nt = q.len() / row;
    let mut spans = Vec::with_capacity(nt);
    for t in 0..nt {
        let (lo, hi) = (as_i32(span[2 * t]), as_i32(span[2 * t + 1]));
        if lo < 0 || hi < lo || hi as usize > n_cells {
            return Err(KernelError(format!(
                "attention span [{lo}, {hi}) outside 0..{n_cells}"
            )));
        }
        spans.push((lo as usize, hi as usize));
    }
    Ok(flash::Call {
        p,
        kern,
        q,
        spans,
        k,
        v,
        cell_bytes: cb,
        head_bytes,
    })
}
