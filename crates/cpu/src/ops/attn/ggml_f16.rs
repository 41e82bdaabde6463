//! An F16 cache with fewer query rows than llama.cpp's tile: one task per (token, head), each
//! computed by [`attn_f16::attend_head`] (llama.cpp's CPU flash-attention arithmetic: f16 Q,
//! f16 V accumulator, online softmax), so short prompts and decode steps round like the peer.

use super::flash::Call;
use crate::ggml_x86::GgmlSimd;
use crate::ops::{attn_f16, KResult, KernelError};
use crate::threads::par_tasks;

/// A raw output pointer shared by tasks that write disjoint slices.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: tasks write disjoint `head_dim`-long slices and finish before `run` returns.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// The element at `i` (a method, so closures capture the whole `Sync` wrapper).
    fn at(self, i: usize) -> *mut f32 {
        self.0.wrapping_add(i)
    }
}

/// The K and V regions as f16 bits (the backend's regions are f32 buffers, so aligned).
fn as_f16(b: &[u8]) -> KResult<&[u16]> {
    // SAFETY: every bit pattern is a valid u16; align_to only yields aligned elements.
    let (pre, vals, _) = unsafe { b.align_to::<u16>() };
    if pre.is_empty() && cfg!(target_endian = "little") {
        Ok(vals)
    } else {
        Err(KernelError("f16 KV region is not 2-byte aligned".into()))
    }
}

pub(super) fn run(c: &Call, out: &mut [f32], threads: usize) -> KResult<()> {
    run_with(None, c, out, threads)
}

/// Attention as the given llama.cpp x86 build computes it over an F16 cache: its one-chunk
/// kernel below [`attn_f16::GGML_FA_TILE_Q`] query rows, its tiled f32 kernel from there on.
pub(super) fn run_ggml(simd: GgmlSimd, c: &Call, out: &mut [f32], threads: usize) -> KResult<()> {
    run_with(Some(simd), c, out, threads)
}

fn run_with(simd: Option<GgmlSimd>, c: &Call, out: &mut [f32], threads: usize) -> KResult<()> {
    let (p, hd) = (c.p, c.p.head_dim);
    let nt = c.spans.len();
    let needed = nt * p.n_head * hd;
    if out.len() < needed {
        return Err(KernelError(format!(
            "attention output holds {} values, {nt} tokens need {needed}",
            out.len()
        )));
    }
    let (k16, v16) = (as_f16(c.k)?, as_f16(c.v)?);
    let group = p.n_head / p.n_head_kv;
    let outp = OutPtr(out.as_mut_ptr());
    // One task per (token, head); task `t * n_head + h` owns `out[task * hd..][..hd]`.
    par_tasks(nt * p.n_head, threads, |task| {
        // SAFETY: tasks own disjoint `hd`-long slices inside `out` (length checked above), and
        // `par_tasks` returns only after every task is done, while `out` is still borrowed.
        let o = unsafe { std::slice::from_raw_parts_mut(outp.at(task * hd), hd) };
        let (t, h) = (task / p.n_head, task % p.n_head);
        let head_off = (h / group) * c.head_bytes;
        // Cell c's head, in f16 elements (cell and head offsets are in bytes).
        let at = |cell: usize| {
            let o = (cell * c.cell_bytes + head_off) / 2;
            o..o + hd
        };
        let (lo, hi) = c.spans[t];
        let q = &c.q[(t * p.n_head + h) * hd..][..hd];
        if let Some(simd) = simd.filter(|_| nt >= attn_f16::GGML_FA_TILE_Q) {
            attn_f16::attend_head_tiled(
                simd,
                q,
                p.scale,
                lo..hi,
                |cell| &k16[at(cell)],
                |cell| &v16[at(cell)],
                o,
            );
            return;
        }
        if simd == Some(GgmlSimd::Avx512) {
            attn_f16::attend_head_with(
                attn_f16::dot16_ref,
                q,
                p.scale,
                lo..hi,
                |cell| &k16[at(cell)],
                |cell| &v16[at(cell)],
                o,
            );
            return;
        }
        attn_f16::attend_head(
            q,
            p.scale,
            lo..hi,
            |cell| &k16[at(cell)],
            |cell| &v16[at(cell)],
            o,
        );
    });
    Ok(())
}
