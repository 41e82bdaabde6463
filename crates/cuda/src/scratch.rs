//! Device scratch the kernels share within a forward (quantized activations, attention
//! partials), and the int8 matmul's choice of kernel. Scratch grows to the largest request
//! and is never released while the backend lives: a recorded CUDA graph may still name an
//! older buffer, which therefore stays valid (it is simply not replayed once the launches
//! that name the new one differ).

use minfer_gguf::GgmlType;
use minfer_graph::{BufId, WeightId, WeightSource};

use crate::backend::CudaBackend;
use crate::device::{Arg, DResult};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Scratch {
    /// Activations quantized to 8 bits per 32-element block: int8 values, then (d, d·Σq).
    Q8,
    /// One token's RMSNorm-ed row quantized so (the one-token kernels' folded norm).
    Q8Norm,
    /// Split-K attention partials.
    AttnPart,
    /// The warp-tiled attention's per-group count of finished chunks (zero between launches:
    /// the block that merges resets it).
    AttnCount,
    /// The fused Q/K/V node's q|k|v row before RoPE.
    QkvRow,
    /// The tensor-core matmul's per-pass-group subtrees when it splits the passes.
    MmqPart,
    /// A weight matrix dequantized to f16/bf16 for the prompt rows' GEMM.
    WeightHalf,
    /// Prompt rows' activations rounded to f16/bf16 for the GEMM.
    ActHalf,
    /// Streamed blocks (crates/cuda/src/stream.rs): the weights one split reads and this
    /// backend does not hold.
    StreamArena,
}

/// What the f16 activation scratch holds: (buffer, first row, rows, row length, bf16, the
/// scratch's pointer).
pub(crate) type HalfInput = (BufId, usize, usize, usize, i32, u64);

/// The activation buffer last quantized in this split, its row length and row count.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Q8Input {
    pub buf: BufId,
    /// The first row quantized (a run of one row class).
    pub r0: usize,
    pub ne0: usize,
    pub nt: usize,
}

/// Growth of the scratch that a forward's row count sizes (each step keeps the buffer
/// before it: [`CudaBackend::scratch`]): the ladder's buffers together stay under this many
/// times the largest request (each is 1.5x a request, each request above 1.5x the one before:
/// under 4.5x in all).
const LADDER: u64 = 5;
/// Scratch a model's shape does not size (attention partials and counts, the fused row,
/// the tensor-core matmul's subtrees), at most.
const SMALL_SCRATCH: u64 = 64 << 20;

impl CudaBackend {
    /// Device memory this backend allocates beside the graph's buffers, at most, for
    /// matrices `ids` and forwards of up to `n_batch` rows (issue 32: `auto` charges it in
    /// its reserve, and every allocation is checked against the budget): cuBLASLt's
    /// workspace, the half copy of the largest matrix the prompt rows' GEMM reads (sized
    /// exactly at load, [`CudaBackend::presize_half`]), and the activations' half and int8
    /// copies, which grow with the rows.
    pub(crate) fn scratch_bound(
        &self,
        weights: &dyn WeightSource,
        ids: &[WeightId],
        n_batch: usize,
    ) -> u64 {
        let (half, widest) = self.half_need(weights, ids);
        let rows = (n_batch * widest) as u64;
        // ActHalf (2 bytes a value) and Q8 (1 + 8/32).
        let act = rows * 2 + rows * 5 / 4 + 256;
        crate::lt::WORKSPACE as u64 + half as u64 + LADDER * act + SMALL_SCRATCH
    }

    /// (The bytes of the half copy of the largest matrix of `ids` the prompt rows' GEMM
    /// dequantizes, the widest input row of any matrix of `ids`.)
    fn half_need(&self, weights: &dyn WeightSource, ids: &[WeightId]) -> (usize, usize) {
        let (mut half, mut widest) = (0, 0);
        for w in ids.iter().filter_map(|&id| weights.weight(id)) {
            if w.ne1 == 1 {
                continue;
            }
            // The activations converted are a matmul's inputs: rows of `ne0`.
            widest = widest.max(w.ne0);
            if let Ok(m) = Self::streamed_matrix(&w) {
                if m.ty != GgmlType::F16 && self.prompt_gemm(&m).is_some() {
                    half = half.max(m.ne0 * m.ne1 * 2);
                }
            }
        }
        (half, widest)
    }

    /// Allocates the half copy's scratch once at the size of the largest matrix of `ids`
    /// the prompt rows' GEMM dequantizes (held or streamed), so it never grows by steps
    /// that would each keep the buffer before ([`CudaBackend::scratch`]).
    pub(crate) fn presize_half(
        &mut self,
        weights: &dyn WeightSource,
        ids: &[WeightId],
    ) -> DResult<()> {
        let (half, _) = self.half_need(weights, ids);
        let have = self
            .scratch
            .get(&Scratch::WeightHalf)
            .map_or(0, |&(_, len)| len);
        if half > have {
            let ptr = self.gpu.alloc(half)?;
            self.scratch.insert(Scratch::WeightHalf, (ptr, half));
        }
        Ok(())
    }

    /// A scratch buffer of at least `bytes`.
    pub(crate) fn scratch(&mut self, kind: Scratch, bytes: usize) -> DResult<u64> {
        if let Some(&(ptr, len)) = self.scratch.get(&kind) {
            if len >= bytes {
                return Ok(ptr);
            }
        }
        // Grown by half again, so a prefill ladder does not reallocate at every step.
        let len = bytes.max(4096) + bytes / 2;
        let ptr = self.gpu.alloc(len)?;
        self.scratch.insert(kind, (ptr, len));
        Ok(ptr)
    }

    /// A scratch buffer of at least `bytes` that holds zeros when first handed out (each
    /// user leaves it zeroed).
    pub(crate) fn scratch_zeroed(&mut self, kind: Scratch, bytes: usize) -> DResult<u64> {
        let before = self.scratch.get(&kind).copied();
        let ptr = self.scratch(kind, bytes)?;
        if before.map(|(p, _)| p) != Some(ptr) {
            let len = self.scratch[&kind].1;
            self.gpu.memset0(ptr, len)?;
        }
        Ok(ptr)
    }

    /// The int8 kernel for weights of `ty` (None: the f32 correctness matmul reads them, as
    /// it reads every type under `MINFER_CUDA_MATMUL=f32`).
    pub(crate) fn mmvq_kernel(&self, ty: GgmlType) -> Option<&'static str> {
        if !self.mmvq {
            return None;
        }
        Some(match ty {
            GgmlType::Q8_0 => "mf_mmvq_q8_0",
            GgmlType::Q4_0 => "mf_mmvq_q4_0",
            GgmlType::Q4_1 => "mf_mmvq_q4_1",
            GgmlType::Q5_0 => "mf_mmvq_q5_0",
            GgmlType::Q4K => "mf_mmvq_q4_k",
            GgmlType::Q6K => "mf_mmvq_q6_k",
            _ => return None,
        })
    }

    /// `nt` rows of `ne0` f32 activations in buffer `buf` (at `x`) quantized to 8 bits per
    /// 32-element block: (values, scales). Consecutive matmuls over the same input (Q, K and
    /// V; gate and up) quantize it once.
    pub(crate) fn quantized_input(
        &mut self,
        (buf, r0): (BufId, usize),
        x: u64,
        ne0: usize,
        nt: usize,
    ) -> DResult<(u64, u64)> {
        if !ne0.is_multiple_of(32) {
            return Err(format!(
                "int8 matmul over rows of {ne0}, not whole 32-blocks"
            ));
        }
        let q_bytes = (ne0 * nt).next_multiple_of(256);
        let ds_bytes = nt * (ne0 / 32) * 8;
        let ptr = self.scratch(Scratch::Q8, q_bytes + ds_bytes)?;
        let want = Q8Input { buf, r0, ne0, nt };
        if self.q8_input != Some(want) {
            let blocks = nt * (ne0 / 32);
            self.gpu.launch(
                "mf_quantize_q8",
                ((8 * blocks).div_ceil(128) as u32, 1, 1),
                128,
                &[
                    Arg::U64(x),
                    Arg::U64(ptr),
                    Arg::U64(ptr + q_bytes as u64),
                    Arg::I32(ne0 as i32),
                    Arg::I32(nt as i32),
                ],
            )?;
            self.q8_input = Some(want);
        }
        Ok((ptr, ptr + q_bytes as u64))
    }

    /// Forgets the quantized input when `buf` is written.
    pub(crate) fn written(&mut self, buf: BufId) {
        if self.q8_input.is_some_and(|q| q.buf == buf) {
            self.q8_input = None;
        }
        if self.half_input.is_some_and(|h| h.0 == buf) {
            self.half_input = None;
        }
    }
}
