//! The tensor-core int8 matmul's switches (kernels/mmq.cu): from how many tokens a matmul
//! runs on `mma` tiles instead of the 8-token dp4a kernel, and which tile shape. Both kernels
//! keep the canonical block order, so the choice changes speed only, never bits (ADR 0008).
//!
//! - `MINFER_CUDA_MMQ=0` forces the dp4a kernel for every row count (the comparison path and
//!   the bit-for-bit gates' second path); `1` or unset: `mma` from the threshold up.
//! - `MINFER_CUDA_MMQ_MIN=N`: the threshold in tokens (default [`DEFAULT_MIN_TOKENS`]).
//! - `MINFER_CUDA_MMQ_TILE=64x64|128x64|64x128`: weight rows x tokens per block.

use minfer_gguf::GgmlType;

use crate::backend::CudaBackend;

/// Tokens from which the `mma` kernel runs (measured: docs/PERFORMANCE.md, "CUDA int8 mma
/// prefill").
pub(crate) const DEFAULT_MIN_TOKENS: usize = 32;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MmqTile {
    /// 64 weight rows x 64 tokens, 4 x 2 warps.
    R64T64,
    /// 128 rows x 64 tokens, 4 x 2 warps.
    R128T64,
    /// 64 rows x 128 tokens, 2 x 4 warps.
    R64T128,
}

impl MmqTile {
    /// (weight rows, tokens) per block.
    pub(crate) fn shape(self) -> (usize, usize) {
        match self {
            MmqTile::R64T64 => (64, 64),
            MmqTile::R128T64 => (128, 64),
            MmqTile::R64T128 => (64, 128),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MmqChoice {
    /// Off: `MINFER_CUDA_MMQ=0`.
    pub on: bool,
    pub min_tokens: usize,
    pub tile: MmqTile,
}

impl MmqChoice {
    /// The switches from the environment; a value they do not name is an error.
    pub(crate) fn from_env() -> Result<MmqChoice, String> {
        let var = |k: &str| std::env::var(k).unwrap_or_default();
        let on = match var("MINFER_CUDA_MMQ").as_str() {
            "" | "1" => true,
            "0" => false,
            other => return Err(format!("MINFER_CUDA_MMQ={other}: want 0 or 1")),
        };
        let min_tokens = match var("MINFER_CUDA_MMQ_MIN").as_str() {
            "" => DEFAULT_MIN_TOKENS,
            v => v
                .parse::<usize>()
                .ok()
                .filter(|&n| n >= 1)
                .ok_or_else(|| format!("MINFER_CUDA_MMQ_MIN={v}: want a token count >= 1"))?,
        };
        let tile = match var("MINFER_CUDA_MMQ_TILE").as_str() {
            "" | "64x64" => MmqTile::R64T64,
            "128x64" => MmqTile::R128T64,
            "64x128" => MmqTile::R64T128,
            other => {
                return Err(format!(
                    "MINFER_CUDA_MMQ_TILE={other}: want 64x64, 128x64 or 64x128"
                ))
            }
        };
        Ok(MmqChoice {
            on,
            min_tokens,
            tile,
        })
    }

    /// The startup line's words for it.
    pub(crate) fn describe(&self) -> String {
        if self.on {
            let (r, t) = self.tile.shape();
            format!("int8 mma from {} tokens ({r}x{t} tiles)", self.min_tokens)
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
        (GgmlType::Q8_0, R64T128) => "mf_mmq_q8_0_t128",
        (GgmlType::Q4_0, R64T128) => "mf_mmq_q4_0_t128",
        (GgmlType::Q4_1, R64T128) => "mf_mmq_q4_1_t128",
        (GgmlType::Q5_0, R64T128) => "mf_mmq_q5_0_t128",
        (GgmlType::Q4K, R64T128) => "mf_mmq_q4_k_t128",
        (GgmlType::Q6K, R64T128) => "mf_mmq_q6_k_t128",
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
