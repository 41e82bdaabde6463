//! Prompt rows (docs/PRECISION.md "Row classes", ADR 0011): the rows of a sequence's prefill
//! run on kernels of their own, chosen per class and per model, never per forward.
//!
//! - Matmuls: the weight matrix dequantized to f16 (bf16) into a scratch right before use,
//!   the rows' activations rounded to the same type, then cuBLASLt with one algorithm pinned
//!   per (outputs, input length, type) (`crate::lt`), then the bias. Matrices whose f16 copy
//!   would pass [`GEMM_MAX_BYTES`] (the output heads) keep the int8 kernels for prompt rows
//!   too, F32 and F16 weights the f32 kernel: a property of the matrix, the same for every
//!   forward.
//! - Attention: FlashAttention-2-shaped tensor-core tiles (kernels/prompt.cu `mf_fa_*`) for
//!   f16 and q8_0 KV caches at head dim 64 or 128 (q8_0 tiles dequantized to f16 in shared
//!   memory as they come in); other models keep the generation rows' kernels.
//!
//! `MINFER_CUDA_PROMPT=gemm` (default) | `gemm-bf16` | `mmq` (prompt rows on the int8
//! kernels, ADR 0008's path), `MINFER_CUDA_PROMPT_ATTN=fa` (default, also named `fa-q8`: f16 and q8_0
//! KV) | `fa-f16` (f16 KV only: a q8_0 cache's prompt rows on the generation rows' kernels, as
//! before the q8_0 tiles were gated) | `rows` (the generation rows' attention kernels).

use minfer_gguf::GgmlType;
use minfer_graph::{RowClass, RowClasses, WeightRef};

use crate::backend::{type_code, CudaBackend, Matrix, Scratch};
use crate::device::{Arg, DResult};
use crate::exec::check_windows;
use crate::lt::{GemmCall, GemmType};

/// Largest f16 copy of a matrix that prompt rows dequantize (bytes): past it (a 150k-vocab
/// output head: 272 MB on a 0.5B, 1.09 GB on a 7B) the int8 kernels read the matrix in place.
pub(crate) const GEMM_MAX_BYTES: usize = 256 << 20;

pub(crate) static STREAMED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Matrices this process's CUDA backends multiplied for prompt rows without holding them
/// (streamed blocks, ADR 0014): the gates' check that the path ran.
pub fn streamed_matmuls() -> u64 {
    STREAMED.load(std::sync::atomic::Ordering::Relaxed)
}

/// Query rows per block of the prompt attention (kernels/prompt.cu `MF_FA_Q`).
const FA_Q: usize = 64;
/// Logical keys per split of a long window (kernels/prompt.cu `MF_FA_SPLIT`).
const FA_SPLIT: usize = 1024;

/// A prompt attention kernel (kernels/prompt.cu `mf_fa_*`): its name, shared bytes and the
/// alignment its copies need of the KV rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FaKernel {
    pub name: &'static str,
    /// Dynamic shared memory per block, bytes.
    pub shared: u32,
    /// Bytes each cp.async moves: the KV rows (and regions) must be multiples of it.
    pub align: usize,
}

impl FaKernel {
    /// The kernel for a KV cache of `cache` at `head_dim` (None: the generation rows' kernels).
    pub(crate) fn of(cache: GgmlType, head_dim: usize) -> Option<FaKernel> {
        // f16: a K and a V tile of 64 rows of head_dim + 8 halves, copied 16 bytes at a time.
        // q8_0: one such f16 tile (K's, then V's) and the raw K and V blocks (17 * hd / 16
        // bytes a key), copied hd / 16 bytes at a time (q8_0 blocks are 34 bytes).
        let tile = 64 * (head_dim + 8) * 2;
        let (name, shared, align) = match (cache, head_dim) {
            (GgmlType::F16, 64) => ("mf_fa_64", 2 * tile, 16),
            (GgmlType::F16, 128) => ("mf_fa_128", 2 * tile, 16),
            (GgmlType::Q8_0, 64) => ("mf_fa_q8_64", tile + 2 * 64 * 68, 4),
            (GgmlType::Q8_0, 128) => ("mf_fa_q8_128", tile + 2 * 64 * 136, 8),
            _ => return None,
        };
        Some(FaKernel {
            name,
            shared: shared as u32,
            align,
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PromptChoice {
    /// The GEMM's operand type; None: prompt rows on the int8 kernels (`mmq`).
    pub gemm: Option<GemmType>,
    /// Tensor-core attention for prompt rows (off: `rows`).
    pub fa: bool,
    /// ... over a q8_0 KV cache too (default since the kernels' GPU gate passed, session 16;
    /// off with `fa-f16`: a q8_0 cache's prompt rows then use the generation rows' kernels).
    pub fa_q8: bool,
    /// A gate's control only: bf16 operands for runs of fewer than 64 rows.
    pub control_by_rows: bool,
}

impl PromptChoice {
    /// The startup line's words.
    pub(crate) fn describe(&self) -> String {
        format!(
            "prompt rows: {}, attention {}",
            match self.gemm {
                Some(t) => format!("cuBLASLt {} GEMM (pinned algorithm)", t.name()),
                None => "int8 kernels".into(),
            },
            if self.fa_q8 {
                "tensor-core flash (f16/q8_0 KV, head dim 64/128)"
            } else if self.fa {
                "tensor-core flash (f16 KV, head dim 64/128)"
            } else {
                "as generation rows"
            }
        )
    }
}

/// Whether two attention windows (rows of `width` i32s) list `a`'s cells as a prefix of
/// `b`'s: a span with the same start ending no later, or a kv map whose runs are `b`'s up
/// to a last run no longer than `b`'s.
fn window_prefix(a: &[i32], b: &[i32]) -> bool {
    if a.len() == 2 {
        return a[0] == b[0] && a[1] <= b[1];
    }
    let runs = |w: &[i32]| -> Vec<(i32, i32)> {
        w.chunks_exact(2)
            .map(|r| (r[0], r[1]))
            .filter(|r| r.1 > 0)
            .collect()
    };
    let (ra, rb) = (runs(a), runs(b));
    let Some((last, head)) = ra.split_last() else {
        return true;
    };
    head.len() < rb.len()
        && head.iter().zip(&rb).all(|(x, y)| x == y)
        && rb[head.len()].0 == last.0
        && last.1 <= rb[head.len()].1
}

/// Cuts rows `r0..r0 + n` into segments whose windows are each a prefix of the next row's
/// (one sequence's prompt chunk is one segment): (first row, rows).
pub(crate) fn nested_segments(
    win: &[i32],
    width: usize,
    r0: usize,
    n: usize,
) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::new();
    for r in r0..r0 + n {
        let cur = &win[r * width..(r + 1) * width];
        match out.last_mut() {
            Some((s, len))
                if {
                    let prev = &win[(*s + *len - 1) * width..(*s + *len) * width];
                    window_prefix(prev, cur)
                } =>
            {
                *len += 1
            }
            _ => out.push((r, 1)),
        }
    }
    out
}

impl CudaBackend {
    /// The runs of one class among a node's `rows` rows: (first row, rows, class).
    pub(crate) fn row_runs(&self, rows: usize) -> DResult<Vec<(usize, usize, RowClass)>> {
        if self.rows.tokens.is_empty() {
            // A forward that named no classes (a backend driven node by node).
            return Ok(vec![(0, rows, RowClass::Generation)]);
        }
        let classes = self.rows.of(rows).ok_or_else(|| {
            format!(
                "row classes for {} token rows and {} output rows, the node has {rows}",
                self.rows.tokens.len(),
                self.rows.outputs.len()
            )
        })?;
        Ok(RowClasses::runs(classes))
    }

    /// Whether prompt rows of matrix `m` run on the GEMM.
    pub(crate) fn prompt_gemm(&self, m: &Matrix) -> Option<GemmType> {
        let ty = self.prompt.gemm?;
        // F32 and F16 weights keep the f32 kernel (their tight class against the reference:
        // the GEMM would round the activations to f16).
        let int8 = self.mmvq_kernel(m.ty).is_some();
        (int8 && m.ne0.is_multiple_of(32) && m.ne0 * m.ne1 * 2 <= GEMM_MAX_BYTES).then_some(ty)
    }

    /// `out[0..n]` = the `n` prompt rows at `x` times `m` (+ `bias`, 0: none) on the GEMM;
    /// `xbuf`/`r0` name the activations for the conversion cache.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn encode_gemm(
        &mut self,
        ty: GemmType,
        m: &Matrix,
        (xbuf, r0, x): (minfer_graph::BufId, usize, u64),
        n: usize,
        out: u64,
        bias: u64,
    ) -> DResult<()> {
        // The gates' control (`MINFER_CUDA_PROMPT_CONTROL=type-by-rows`): a planted kernel
        // choice by the run's row count, which the chunking gate must see.
        let ty = if self.prompt.control_by_rows && n < 64 {
            GemmType::Bf16
        } else {
            ty
        };
        let bf16 = i32::from(ty == GemmType::Bf16);
        let (k, n_out) = (m.ne0, m.ne1);
        let w = if m.ty == GgmlType::F16 {
            m.ptr
        } else {
            let bytes = n_out * k * 2;
            let wh = self.scratch(Scratch::WeightHalf, bytes)?;
            if self.half_weight != Some((m.ptr, wh)) {
                let chunks = n_out * (k / 32);
                self.gpu.launch(
                    "mf_deq_half",
                    (chunks.div_ceil(256) as u32, 1, 1),
                    256,
                    &[
                        Arg::I32(type_code(m.ty).ok_or("weight type")?),
                        Arg::U64(m.ptr),
                        Arg::U64(m.row_bytes as u64),
                        Arg::U64(wh),
                        Arg::I32(k as i32),
                        Arg::I32(n_out as i32),
                        Arg::I32(bf16),
                    ],
                )?;
                self.half_weight = Some((m.ptr, wh));
            }
            wh
        };
        let xh = self.scratch(Scratch::ActHalf, n * k * 2)?;
        let key = (xbuf, r0, n, k, bf16, xh);
        if self.half_input != Some(key) {
            let count = n * k;
            self.gpu.launch(
                "mf_to_half",
                (count.div_ceil(4 * 256) as u32, 1, 1),
                256,
                &[
                    Arg::U64(x),
                    Arg::U64(xh),
                    Arg::U64(count as u64),
                    Arg::I32(bf16),
                ],
            )?;
            self.half_input = Some(key);
        }
        let plan = self.gpu.gemm_plan(n_out as u64, k as u64, ty)?;
        self.gpu.gemm(GemmCall {
            plan,
            w,
            x: xh,
            y: out,
            m: n as u64,
        })?;
        if bias != 0 {
            let total = n * n_out;
            self.gpu.launch(
                "mf_bias_rows",
                (total.div_ceil(256) as u32, 1, 1),
                256,
                &[
                    Arg::U64(out),
                    Arg::U64(bias),
                    Arg::I32(n_out as i32),
                    Arg::U64(total as u64),
                ],
            )?;
        }
        Ok(())
    }

    /// `w` as the matrix the prompt kernels read (its pointer set once copied in).
    pub(crate) fn streamed_matrix(w: &WeightRef<'_>) -> DResult<Matrix> {
        let row_bytes =
            w.ty.row_bytes(w.ne0 as u64)
                .ok_or_else(|| format!("a row of {} is not whole {} blocks", w.ne0, w.ty))?;
        Ok(Matrix {
            ty: w.ty,
            ne0: w.ne0,
            ne1: w.ne1,
            ptr: 0,
            row_bytes: row_bytes as usize,
        })
    }

    /// The prompt attention kernel for this model's KV (None: prompt rows use the
    /// generation rows' kernels).
    pub(crate) fn prompt_fa(&self, cache: GgmlType, head_dim: usize) -> Option<FaKernel> {
        if !self.prompt.fa || (cache == GgmlType::Q8_0 && !self.prompt.fa_q8) {
            return None;
        }
        FaKernel::of(cache, head_dim)
    }

    /// Prompt rows `r0..r0 + n` of an attention node on `kernel`, one launch per segment
    /// of nested windows (each checked against the region's `n_cells` cells). The pointers
    /// (q, k, v, windows, out) are at row 0.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn encode_prompt_attention(
        &mut self,
        kernel: FaKernel,
        (q, k, v, win, out): (u64, u64, u64, u64, u64),
        windows: &[i32],
        (row_bytes, n_cells): (usize, usize),
        (n_head, n_head_kv, head_dim, width, scale): (usize, usize, usize, usize, f32),
        r0: usize,
        n: usize,
    ) -> DResult<()> {
        let a = kernel.align;
        if !row_bytes.is_multiple_of(a)
            || !k.is_multiple_of(a as u64)
            || !v.is_multiple_of(a as u64)
        {
            return Err(format!(
                "{}: KV rows of {row_bytes} bytes at {k:#x} / {v:#x}, not {a}-byte aligned",
                kernel.name
            ));
        }
        let shared = kernel.shared;
        let qs = n_head * head_dim * 4;
        for (s, len) in nested_segments(windows, width, r0, n) {
            // Splits over the segment's longest window: the split size is fixed, so a
            // query's live splits depend on its own window alone.
            let rows = &windows[s * width..(s + len) * width];
            let longest = check_windows(rows, width, n_cells, s)?;
            let n_split = longest.div_ceil(FA_SPLIT).max(1);
            let part = if n_split > 1 {
                self.scratch(
                    Scratch::AttnPart,
                    len * n_head * n_split * (head_dim + 2) * 4,
                )?
            } else {
                0
            };
            self.gpu.launch_shared(
                kernel.name,
                (len.div_ceil(FA_Q) as u32, n_head as u32, n_split as u32),
                128,
                shared,
                &[
                    Arg::U64(q + (s * qs) as u64),
                    Arg::U64(k),
                    Arg::U64(v),
                    Arg::U64(win + (s * width * 4) as u64),
                    Arg::U64(out + (s * qs) as u64),
                    Arg::U64(part),
                    Arg::U64(row_bytes as u64),
                    Arg::I32(n_head as i32),
                    Arg::I32(n_head_kv as i32),
                    Arg::I32(width as i32),
                    Arg::F32(scale),
                    Arg::I32(len as i32),
                    Arg::I32(n_split as i32),
                ],
            )?;
            if n_split > 1 {
                self.gpu.launch_shared(
                    "mf_attn_combine",
                    (n_head as u32, len as u32, 1),
                    head_dim.next_multiple_of(32).min(256) as u32,
                    (n_split * 16) as u32,
                    &[
                        Arg::U64(part),
                        Arg::U64(out + (s * qs) as u64),
                        Arg::I32(n_head as i32),
                        Arg::I32(head_dim as i32),
                        Arg::I32(n_split as i32),
                    ],
                )?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_sequence_chunk_is_one_segment_and_sequences_split() {
        // Span windows: a chunk of 3 rows of one sequence, then 2 of another.
        let w = [0, 5, 0, 6, 0, 7, 10, 11, 10, 12];
        assert_eq!(nested_segments(&w, 2, 0, 5), vec![(0, 3), (3, 2)]);
        // A shorter later window starts a segment.
        let w = [0, 5, 0, 4];
        assert_eq!(nested_segments(&w, 2, 0, 2), vec![(0, 1), (1, 1)]);
    }

    #[test]
    fn flash_kernels_fit_their_shared_memory_and_every_kv_row() {
        for cache in [GgmlType::F16, GgmlType::Q8_0] {
            for hd in [64, 128] {
                let k = FaKernel::of(cache, hd).unwrap();
                assert!(k.shared <= crate::device::MAX_SHARED, "{}", k.name);
                // Every KV row (all heads of a cell) and every head's first byte in it is a
                // multiple of the copy size, whatever the KV head count.
                let head = cache.row_bytes(hd as u64).unwrap() as usize;
                for n_kv in 1..=64u64 {
                    let row = cache.row_bytes(n_kv * hd as u64).unwrap() as usize;
                    assert_eq!(row % k.align, 0, "{} with {n_kv} KV heads", k.name);
                }
                assert_eq!(head % k.align, 0, "{}", k.name);
            }
            assert_eq!(FaKernel::of(cache, 96), None);
        }
        assert_eq!(FaKernel::of(GgmlType::F32, 128), None);
    }

    #[test]
    fn kv_map_prefixes() {
        let pad = |r: &[i32]| {
            let mut v = r.to_vec();
            v.resize(16, 0);
            v
        };
        let a = pad(&[0, 4, 9, 2]);
        let b = pad(&[0, 4, 9, 3]);
        let c = pad(&[0, 4, 9, 3, 20, 1]);
        let d = pad(&[0, 4, 8, 3]);
        assert!(window_prefix(&a, &b));
        assert!(window_prefix(&b, &c));
        assert!(!window_prefix(&c, &b));
        assert!(!window_prefix(&a, &d));
    }
}
