//! The warp-tiled attention (kernels/attnw.cu): which kernel a node runs, its grid and
//! scratch. It serves every query of a model whose KV cache is f16 with head dim 64 or 128
//! and at most [`MAX_GROUP`] query heads per KV head, whatever the forward holds, so a
//! query's bits depend only on its q and its window; other models keep the split-K kernels.

use minfer_gguf::GgmlType;

use crate::backend::{CudaBackend, Scratch};
use crate::device::{Arg, DResult};

/// Window rows per chunk (kernels/attnw.cu `MF_AW_CHUNK`).
const CHUNK: usize = 128;
/// Query heads per KV head the kernels hold (`MF_AW_G`).
pub(crate) const MAX_GROUP: usize = 8;

impl CudaBackend {
    /// The warp-tiled kernel for this node and its queries per block, if it applies.
    pub(crate) fn attn_warp(
        &self,
        cache: GgmlType,
        head_dim: usize,
        group: usize,
        ne1: usize,
    ) -> Option<(&'static str, usize, usize)> {
        if self.attn_single || self.attn_warp_qt == 0 || cache != GgmlType::F16 {
            return None;
        }
        if group == 0 || group > MAX_GROUP {
            return None;
        }
        // Queries per block, up to the cap, for prefill-sized forwards (one sequence's
        // queries share their cells); a decode batch's queries are mostly other sequences',
        // which the kernels would run in passes of their own. The grouping never changes a
        // result.
        let qt = if ne1 > 16 && self.attn_warp_qt >= 2 {
            2
        } else {
            1
        };
        // One query a block: the KV group's heads shared out over blocks of `attn_heads`
        // (MINFER_CUDA_ATTN_HEADS; more blocks for a short decode window, the same bits).
        let heads = if qt == 1 { self.attn_heads } else { MAX_GROUP };
        // `_s`: the K rows staged in shared memory (MINFER_CUDA_ATTN_STAGE; the same bits).
        let (plain, staged, qt, gb) = match (head_dim, qt, heads) {
            (64, 1, 2) => ("mf_attn_w1_64_h2", "mf_attn_w1_64_h2_s", 1, 2),
            (64, 1, 4) => ("mf_attn_w1_64_h4", "mf_attn_w1_64_h4_s", 1, 4),
            (64, 1, _) => ("mf_attn_w1_64", "mf_attn_w1_64_s", 1, MAX_GROUP),
            (64, _, _) => ("mf_attn_w2_64", "mf_attn_w2_64_s", 2, MAX_GROUP),
            // Two queries a block would spill registers at head dim 128.
            (128, _, 2) => ("mf_attn_w1_128_h2", "mf_attn_w1_128_h2_s", 1, 2),
            (128, _, 4) => ("mf_attn_w1_128_h4", "mf_attn_w1_128_h4_s", 1, 4),
            (128, _, _) => ("mf_attn_w1_128", "mf_attn_w1_128_s", 1, MAX_GROUP),
            _ => return None,
        };
        Some((if self.attn_stage { staged } else { plain }, qt, gb))
    }

    /// Launches `kernel` (queries per block `qt`, query heads per block `gb`) over the
    /// node's queries.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn attn_warp_launch(
        &mut self,
        (kernel, qt, gb): (&'static str, usize, usize),
        q: u64,
        k: u64,
        v: u64,
        win: u64,
        out: u64,
        row_bytes: usize,
        n_head: usize,
        n_head_kv: usize,
        head_dim: usize,
        width: usize,
        scale: f32,
        ne1: usize,
        n_cells: usize,
        max_len: usize,
    ) -> DResult<()> {
        if !row_bytes.is_multiple_of(16) {
            return Err(format!("KV rows of {row_bytes} bytes, not 16-byte aligned"));
        }
        // Chunks over the region's cells for small batches (a fixed grid for a fixed plan:
        // graph replay), over the longest window for prefill; chunks past a group's windows
        // exit at once, so the grid never changes a query's bits.
        let span = if ne1 <= 16 { n_cells } else { max_len };
        let n_split = span.div_ceil(CHUNK).max(1);
        let groups = ne1.div_ceil(qt);
        let part = if n_split > 1 {
            self.scratch(
                Scratch::AttnPart,
                ne1 * n_head * n_split * (head_dim + 2) * 4,
            )?
        } else {
            0
        };
        // Blocks a KV group's heads are shared out over (kernels/attnw.cu `n_hb`).
        let n_hb = (n_head / n_head_kv).div_ceil(gb);
        let count = self.scratch_zeroed(Scratch::AttnCount, groups * n_head_kv * n_hb * 4)?;
        let slots = qt * gb;
        let tile = head_dim * slots + 4 * 32 * slots + 4 * 32;
        let merge = 3 * slots * (2 + head_dim);
        // Staged kernels (`_s`): each warp's 32 K rows after the larger region, at a 16-byte
        // boundary (kernels/attnw.cu `mf_aw_stage_at`, `MF_AW_KS`).
        let stage = if kernel.ends_with("_s") {
            4 * 32 * (2 * head_dim + 16)
        } else {
            0
        };
        let shared = ((tile.max(merge) * 4).next_multiple_of(16) + stage) as u32;
        self.gpu.launch_shared(
            kernel,
            ((n_head_kv * n_hb) as u32, groups as u32, n_split as u32),
            128,
            shared,
            &[
                Arg::U64(q),
                Arg::U64(k),
                Arg::U64(v),
                Arg::U64(win),
                Arg::U64(part),
                Arg::U64(out),
                Arg::U64(count),
                Arg::U64(row_bytes as u64),
                Arg::I32(n_head as i32),
                Arg::I32(n_head_kv as i32),
                Arg::I32(width as i32),
                Arg::F32(scale),
                Arg::I32(n_split as i32),
                Arg::I32(ne1 as i32),
            ],
        )
    }
}
