//! KV storage and GQA attention over the persistent K/V regions.
//!
//! A region holds `n_ctx` cells; a cell is one row of `n_head_kv * head_dim` values in the
//! cache type (F32, F16 or Q8_0; Q8_0 needs `head_dim % 32 == 0` so heads are whole blocks).

use super::{as_i32, attn_f16, KResult, KernelError};
use crate::threads::par_tasks;
use minfer_gguf::{quants, GgmlType};
use std::cell::RefCell;
use std::sync::Mutex;

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
    let outp = OutPtr(out.as_mut_ptr());
    if out.len() < nt * row {
        return Err(KernelError(format!(
            "attention output holds {} values, {nt} tokens need {}",
            out.len(),
            nt * row
        )));
    }
    // An f16 cache with fewer rows than llama.cpp's query tile gets its flash-attention
    // arithmetic (f16 Q and V accumulator, online softmax): see `attn_f16`.
    let ggml_f16 = p.cache_type == GgmlType::F16 && nt < attn_f16::GGML_FA_TILE_Q;
    let err: Mutex<Option<KernelError>> = Mutex::new(None);
    // One task per (token, head); task `t * n_head + h` owns `out[task * hd..][..hd]`.
    par_tasks(nt * p.n_head, threads, |task| {
        // SAFETY: tasks own disjoint `hd`-long slices inside `out` (length checked above), and
        // `par_tasks` returns only after every task is done, while `out` is still borrowed.
        let o = unsafe { std::slice::from_raw_parts_mut(outp.at(task * hd), hd) };
        let (t, h) = (task / p.n_head, task % p.n_head);
        let cx = HeadCtx {
            p,
            q: &q[t * row + h * hd..t * row + (h + 1) * hd],
            k,
            v,
            cb,
            head_off: (h / group) * head_bytes,
            head_bytes,
            lo: as_i32(span[2 * t]) as usize,
            hi: as_i32(span[2 * t + 1]) as usize,
        };
        if ggml_f16 {
            let r = f16_head(&cx).map(|(k16, v16)| {
                // Cell c's head, in f16 elements (cell and head offsets are in bytes).
                let at = |c: usize| {
                    let o = (c * cx.cb + cx.head_off) / 2;
                    o..o + hd
                };
                attn_f16::attend_head(
                    cx.q,
                    p.scale,
                    cx.lo..cx.hi,
                    |c| &k16[at(c)],
                    |c| &v16[at(c)],
                    o,
                )
            });
            if let Err(e) = r {
                err.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_or_insert(e);
            }
            return;
        }
        let r = SCRATCH.with(|s| {
            let mut s = s.borrow_mut();
            let (kh, scores) = &mut *s;
            kh.resize(hd, 0.0);
            attend_head(&cx, kh, scores, o)
        });
        if let Err(e) = r {
            err.lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_or_insert(e);
        }
    });
    match err.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

thread_local! {
    /// A dequantized K/V head and the scores of one (token, head), reused across tasks.
    static SCRATCH: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// A raw output pointer shared by tasks that write disjoint slices.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: see the use in `attention`: tasks write disjoint slices and finish before return.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// The element at `i` (a method, so closures capture the whole `Sync` wrapper).
    fn at(self, i: usize) -> *mut f32 {
        self.0.wrapping_add(i)
    }
}

/// One (token, head) of attention: the cells `lo..hi` of KV head bytes at `head_off`.
struct HeadCtx<'a> {
    p: &'a AttnParams,
    q: &'a [f32],
    k: &'a [u8],
    v: &'a [u8],
    cb: usize,
    head_off: usize,
    head_bytes: usize,
    lo: usize,
    hi: usize,
}

impl HeadCtx<'_> {
    /// Cell `c`'s head in `region` as f32: read in place for an F32 cache (the regions are
    /// f32 buffers, so aligned), else dequantized into `scratch`. Same values either way.
    fn head<'s>(&self, region: &'s [u8], c: usize, scratch: &'s mut [f32]) -> KResult<&'s [f32]> {
        let off = c * self.cb + self.head_off;
        let bytes = &region[off..off + self.head_bytes];
        if self.p.cache_type == GgmlType::F32 {
            // SAFETY: every bit pattern is a valid f32; align_to only yields aligned elements.
            let (pre, vals, _) = unsafe { bytes.align_to::<f32>() };
            if pre.is_empty() && cfg!(target_endian = "little") {
                return Ok(&vals[..scratch.len()]);
            }
        }
        quants::dequantize_row(self.p.cache_type, bytes, scratch)?;
        Ok(scratch)
    }
}

/// Two-pass softmax attention for one (token, head) into `o` (the arithmetic of the
/// reference: f32 scores, f64 normaliser, f32 weighted sum in cell order).
fn attend_head(cx: &HeadCtx, kh: &mut [f32], scores: &mut Vec<f32>, o: &mut [f32]) -> KResult<()> {
    scores.clear();
    let mut max = f32::NEG_INFINITY;
    for c in cx.lo..cx.hi {
        let kv = cx.head(cx.k, c, kh)?;
        let s: f32 = cx.q.iter().zip(kv).map(|(a, b)| a * b).sum::<f32>() * cx.p.scale;
        max = max.max(s);
        scores.push(s);
    }
    let mut sum = 0f64;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        sum += *s as f64;
    }
    let inv = if sum > 0.0 { (1.0 / sum) as f32 } else { 0.0 };
    o.fill(0.0);
    for (ci, c) in (cx.lo..cx.hi).enumerate() {
        let vv = cx.head(cx.v, c, kh)?;
        let w = scores[ci] * inv;
        for (ov, x) in o.iter_mut().zip(vv) {
            *ov += w * x;
        }
    }
    Ok(())
}

/// The K and V regions of an F16 cache as f16 bits (the regions are f32 buffers, so aligned).
fn f16_head<'a>(cx: &HeadCtx<'a>) -> KResult<(&'a [u16], &'a [u16])> {
    let as_u16 = |b: &'a [u8]| -> KResult<&'a [u16]> {
        // SAFETY: every bit pattern is a valid u16; align_to only yields aligned elements.
        let (pre, vals, _) = unsafe { b.align_to::<u16>() };
        if pre.is_empty() && cfg!(target_endian = "little") {
            Ok(vals)
        } else {
            Err(KernelError("f16 KV region is not 2-byte aligned".into()))
        }
    };
    Ok((as_u16(cx.k)?, as_u16(cx.v)?))
}
