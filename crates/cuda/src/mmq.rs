//! The tensor-core int8 matmul's switches (kernels/mmq.cu): from how many tokens a matmul
//! runs on `mma` tiles instead of the 8-token dp4a kernel, and which tile shape. Both kernels
//! keep the canonical block order, so the choice changes speed only, never bits (ADR 0008).
//!
//! - `MINFER_CUDA_MMQ=0` forces the dp4a kernel for every row count (the comparison path and
//!   the bit-for-bit gates' second path); `1` or unset: `mma` from the threshold up.
//! - `MINFER_CUDA_MMQ_MIN=N`: the threshold in tokens (default [`DEFAULT_MIN_TOKENS`]).
//! - `MINFER_CUDA_MMQ_TILE=64x64|128x64|64x32|64x64k8`: weight rows x tokens per block (`k8`:
//!   8 blocks of a residue staged a step instead of 4).
//! - `MINFER_CUDA_MMQ_SPLIT=1|2|4|8`: the blocks of each tile split the eight passes in that
//!   many groups (default: the fewest groups that give [`FILL_BLOCKS`] blocks, so small
//!   matrices still fill the GPU); a combine kernel joins the groups' subtrees.

use minfer_gguf::GgmlType;

use crate::backend::{CudaBackend, Matrix, Scratch};
use crate::device::{Arg, DResult};

/// Blocks a launch should have before it stops splitting the passes (two per SM of an
/// H200's 132).
pub(crate) const FILL_BLOCKS: usize = 264;

/// Tokens from which the `mma` kernel runs (measured: docs/PERFORMANCE.md, "CUDA int8 mma
/// prefill").
pub(crate) const DEFAULT_MIN_TOKENS: usize = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MmqTile {
    /// 64 weight rows x 64 tokens, 4 x 2 warps.
    R64T64,
    /// 128 rows x 64 tokens, 4 x 2 warps.
    R128T64,
    /// 64 rows x 32 tokens, 4 x 2 warps.
    R64T32,
    /// 64 rows x 64 tokens staging 8 blocks of a residue a step instead of 4.
    R64T64K8,
}

impl MmqTile {
    /// (weight rows, tokens) per block.
    pub(crate) fn shape(self) -> (usize, usize) {
        match self {
            MmqTile::R64T64 => (64, 64),
            MmqTile::R128T64 => (128, 64),
            MmqTile::R64T32 => (64, 32),
            MmqTile::R64T64K8 => (64, 64),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MmqChoice {
    /// Off: `MINFER_CUDA_MMQ=0`.
    pub on: bool,
    pub min_tokens: usize,
    pub tile: MmqTile,
    /// Pass groups per tile (None: by [`FILL_BLOCKS`]).
    pub split: Option<usize>,
}

impl MmqChoice {
    /// The startup line's words for it.
    /// The startup line's words; `from`: the row count the tiles really start at (past the
    /// multi-row vector kernels' range, where that is higher than the threshold).
    pub(crate) fn describe(&self, from: usize) -> String {
        if self.on {
            let (r, t) = self.tile.shape();
            let split = self.split.map_or("by grid".into(), |s| s.to_string());
            format!(
                "int8 mma from {} tokens ({r}x{t} tiles, pass groups {split})",
                from.max(self.min_tokens)
            )
        } else {
            "no int8 mma (MINFER_CUDA_MMQ=0)".into()
        }
    }
}

/// The `mma` kernel for weights of `ty` in `tile` (None: the type has none).
pub(crate) fn mmq_kernel_name(ty: GgmlType, tile: MmqTile) -> Option<&'static str> {
    use MmqTile::*;
    Some(match (ty, tile) {
        (GgmlType::Q8_0, R64T64) => "mf_mmq_q8_0",
        (GgmlType::Q4_0, R64T64) => "mf_mmq_q4_0",
        (GgmlType::Q4_1, R64T64) => "mf_mmq_q4_1",
        (GgmlType::Q5_0, R64T64) => "mf_mmq_q5_0",
        (GgmlType::Q4K, R64T64) => "mf_mmq_q4_k",
        (GgmlType::Q6K, R64T64) => "mf_mmq_q6_k",
        (GgmlType::Q8_0, R128T64) => "mf_mmq_q8_0_r128",
        (GgmlType::Q4_0, R128T64) => "mf_mmq_q4_0_r128",
        (GgmlType::Q4_1, R128T64) => "mf_mmq_q4_1_r128",
        (GgmlType::Q5_0, R128T64) => "mf_mmq_q5_0_r128",
        (GgmlType::Q4K, R128T64) => "mf_mmq_q4_k_r128",
        (GgmlType::Q6K, R128T64) => "mf_mmq_q6_k_r128",
        (GgmlType::Q8_0, R64T32) => "mf_mmq_q8_0_t32",
        (GgmlType::Q4_0, R64T32) => "mf_mmq_q4_0_t32",
        (GgmlType::Q4_1, R64T32) => "mf_mmq_q4_1_t32",
        (GgmlType::Q5_0, R64T32) => "mf_mmq_q5_0_t32",
        (GgmlType::Q4K, R64T32) => "mf_mmq_q4_k_t32",
        (GgmlType::Q6K, R64T32) => "mf_mmq_q6_k_t32",
        (GgmlType::Q8_0, R64T64K8) => "mf_mmq_q8_0_k8",
        (GgmlType::Q4_0, R64T64K8) => "mf_mmq_q4_0_k8",
        (GgmlType::Q4_1, R64T64K8) => "mf_mmq_q4_1_k8",
        (GgmlType::Q5_0, R64T64K8) => "mf_mmq_q5_0_k8",
        (GgmlType::Q4K, R64T64K8) => "mf_mmq_q4_k_k8",
        (GgmlType::Q6K, R64T64K8) => "mf_mmq_q6_k_k8",
        _ => return None,
    })
}

impl CudaBackend {
    /// The `mma` kernel and its (rows, tokens) tile for a matmul of `nt` tokens over weights
    /// of `ty` (None: the dp4a kernel runs it).
    pub(crate) fn mmq_kernel(
        &self,
        ty: GgmlType,
        nt: usize,
    ) -> Option<(&'static str, (usize, usize))> {
        let c = self.mmq;
        if !self.mmvq || !c.on || nt < c.min_tokens {
            return None;
        }
        mmq_kernel_name(ty, c.tile).map(|k| (k, c.tile.shape()))
    }
}

impl CudaBackend {
    /// `out` = the matmul of `nt` quantized rows `q` = (xq, xds) by `m` (`n_out` rows) on the
    /// `mma` kernel `kernel` with `tile`, + `bias` (0: none).
    pub(crate) fn encode_mmq(
        &mut self,
        kernel: &'static str,
        (rows, toks): (usize, usize),
        m: &Matrix,
        (xq, xds): (u64, u64),
        (out, bias): (u64, u64),
        (n_out, nt): (usize, usize),
    ) -> DResult<()> {
        let grid = (n_out.div_ceil(rows), nt.div_ceil(toks));
        let split = self.mmq.split.unwrap_or_else(|| {
            let mut s = 1;
            while s < 8 && grid.0 * grid.1 * s < FILL_BLOCKS {
                s *= 2;
            }
            s
        });
        let n = n_out * nt;
        let part = if split > 1 {
            self.scratch(Scratch::MmqPart, split * n * 4)?
        } else {
            0
        };
        self.gpu.launch(
            kernel,
            (grid.0 as u32, grid.1 as u32, split as u32),
            256,
            &[
                Arg::U64(m.ptr),
                Arg::U64(m.row_bytes as u64),
                Arg::U64(xq),
                Arg::U64(xds),
                Arg::U64(out),
                Arg::U64(bias),
                Arg::I32(m.ne0 as i32),
                Arg::I32(n_out as i32),
                Arg::I32(nt as i32),
                Arg::I32(split as i32),
                Arg::U64(part),
            ],
        )?;
        if split == 1 {
            return Ok(());
        }
        self.gpu.launch(
            "mf_mmq_combine",
            (n.div_ceil(256) as u32, 1, 1),
            256,
            &[
                Arg::U64(part),
                Arg::U64(out),
                Arg::U64(bias),
                Arg::U64(n as u64),
                Arg::I32(n_out as i32),
                Arg::I32(split as i32),
            ],
        )
    }
}
