//! KV storage and GQA attention over the persistent K/V regions.
//!
//! A region holds `n_ctx` cells; a cell is one row of `n_head_kv * head_dim` values in the
//! cache type (F32, F16 or Q8_0; Q8_0 needs `head_dim % 32 == 0` so heads are whole blocks).

use super::{as_i32, KResult, KernelError};
use crate::threads::par_ranges;
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
}

/// `q`/`out`: `[n_tokens][n_head * head_dim]`; `span`: `[n_tokens][2]` `[lo, hi)` cells.
pub fn attention(
    p: &AttnParams,
    q: &[f32],
    span: &[f32],
    k: &[u8],
    v: &[u8],
    out: &mut [f32],
    threads: usize,
) -> KResult<()> {
    let hd = p.head_dim;
    let n_embd_kv = p.n_head_kv * hd;
    let cb = cell_bytes(p.cache_type, n_embd_kv)?;
    let head_bytes = cell_bytes(p.cache_type, hd)?;
    let n_cells = k.len() / cb;
    let row = p.n_head * hd;
    let nt = q.len() / row;
    let group = p.n_head / p.n_head_kv;
    for t in 0..nt {
        let (lo, hi) = (as_i32(span[2 * t]), as_i32(span[2 * t + 1]));
        if lo < 0 || hi < lo || hi as usize > n_cells {
            return Err(KernelError(format!(
                "attention span [{lo}, {hi}) outside 0..{n_cells}"
            )));
        }
    }
    // One task per (token, head).
    let parts = par_ranges(nt * p.n_head, threads, |tasks| -> KResult<Vec<f32>> {
        let mut res = vec![0f32; tasks.len() * hd];
        let mut kh = vec![0f32; hd];
        let mut scores = Vec::new();
        for (ti, task) in tasks.enumerate() {
            let (t, h) = (task / p.n_head, task % p.n_head);
            let kvh = h / group;
            let (lo, hi) = (
                as_i32(span[2 * t]) as usize,
                as_i32(span[2 * t + 1]) as usize,
            );
            let qh = &q[t * row + h * hd..t * row + (h + 1) * hd];
            scores.clear();
            let mut max = f32::NEG_INFINITY;
            for c in lo..hi {
                let off = c * cb + kvh * head_bytes;
                quants::dequantize_row(p.cache_type, &k[off..off + head_bytes], &mut kh)?;
                let s: f32 = qh.iter().zip(&kh).map(|(a, b)| a * b).sum::<f32>() * p.scale;
                max = max.max(s);
                scores.push(s);
            }
            let mut sum = 0f64;
            for s in scores.iter_mut() {
                *s = (*s - max).exp();
                sum += *s as f64;
            }
            let inv = if sum > 0.0 { (1.0 / sum) as f32 } else { 0.0 };
            let o = &mut res[ti * hd..(ti + 1) * hd];
            for (ci, c) in (lo..hi).enumerate() {
                let off = c * cb + kvh * head_bytes;
                quants::dequantize_row(p.cache_type, &v[off..off + head_bytes], &mut kh)?;
                let w = scores[ci] * inv;
                for (ov, vv) in o.iter_mut().zip(&kh) {
                    *ov += w * vv;
                }
            }
        }
        Ok(res)
    });
    // Tasks are (t, h) in order, which is exactly the output layout.
    let mut off = 0;
    for part in parts {
        let part = part?;
        out[off..off + part.len()].copy_from_slice(&part);
        off += part.len();
    }
    Ok(())
}
