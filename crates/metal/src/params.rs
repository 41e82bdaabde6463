//! `#[repr(C)]` kernel parameter structs, field for field the structs in `kernels/common.h`.
//! Only `u32`/`i32`/`f32` fields, so there is no padding and the byte view is well defined. The
//! emulator checks each struct's size against the kernel's `constant T&` parameter.

/// Marker for a params struct that may be viewed as bytes ([`crate::device::as_bytes`]).
///
/// # Safety
/// Implementors are `#[repr(C)]`, contain only 4-byte plain fields and have no padding.
pub unsafe trait Params: Copy {}

macro_rules! params {
    ($(#[$m:meta])* $name:ident { $($(#[$fm:meta])* $field:ident : $ty:ty),* $(,)? }) => {
        $(#[$m])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, PartialEq)]
        pub struct $name { $($(#[$fm])* pub $field: $ty),* }
        // SAFETY: repr(C), only u32/i32/f32 fields (4 bytes each), so no padding.
        unsafe impl Params for $name {}
    };
}

params!(
    /// add / mul / swiglu over `n` elements.
    ElementwiseParams { n: u32 }
);
params!(
    /// RMSNorm over `nrows` rows of `ncols`; also the per-head QK norm (`ncols` = head dim).
    RmsNormParams { ncols: u32, nrows: u32, eps: f32 }
);
params!(
    /// RoPE on `[n_tokens, n_heads, head_dim]`; `style` 0 = non-interleaved (NeoX/Qwen2),
    /// 1 = interleaved (LLaMA GGUF).
    RopeParams {
        head_dim: u32,
        n_heads: u32,
        n_tokens: u32,
        n_rot: u32,
        freq_base: f32,
        /// Position scale (linear RoPE scaling): `theta = freq_scale * pos * base^(-2i/n_rot)`.
        freq_scale: f32,
        style: u32,
    }
);
params!(
    /// RoPE shift of the K rows of cells `cell0..cell0 + n_cells` of a K region (`n_heads`
    /// heads of `head_dim` per cell, every dimension rotated) by `delta` positions.
    RopeShiftParams {
        head_dim: u32,
        n_heads: u32,
        n_cells: u32,
        cell0: u32,
        delta: i32,
        freq_base: f32,
        freq_scale: f32,
        style: u32,
    }
);
params!(
    /// `dst[t][i] = x[t][i] + b[i]` over `nrows` rows of `ncols`.
    AddRowsParams { ncols: u32, nrows: u32 }
);
params!(
    /// Per-head RMSNorm of the `n_q` q heads and `n_k` k heads of a fused q|k|v row.
    QkvNormParams { head_dim: u32, n_q: u32, n_k: u32, eps: f32 }
);
params!(
    /// Bias + RoPE + KV store of a fused q|k|v row (one token); `style` as [`RopeParams`],
    /// `dst_row_bytes` the KV region's row stride.
    QkvStoreParams {
        n_head: u32,
        n_head_kv: u32,
        head_dim: u32,
        has_bias: u32,
        freq_base: f32,
        freq_scale: f32,
        style: u32,
        dst_row_bytes: u32,
    }
);
params!(
    /// Attention over explicit windows. q/out `[n_tokens, n_head * head_dim]`; K/V regions of
    /// `n_cells` rows of `kv_stride` elements (`kv_row_bytes` bytes for packed q8_0); the
    /// window buffer holds `window_width` i32 per query: 2 = a span `(lo, hi)`, 16 = a kv map
    /// of 8 `(cell, len)` runs. Flash: chunk `c` of a query covers its logical rows
    /// `[c * chunk_len, (c + 1) * chunk_len)`; `n_chunks` partials per (query, head) (split:
    /// the split slots per (query, head)).
    WindowAttnParams {
        n_head: u32,
        n_head_kv: u32,
        head_dim: u32,
        n_tokens: u32,
        kv_stride: u32,
        kv_row_bytes: u32,
        window_width: u32,
        n_chunks: u32,
        chunk_len: u32,
        scale: f32,
        /// Three-pass: floats per (query, head) row of the score buffer (>= every length).
        row_stride: u32,
        /// Flash prefill: tiles in this wave (the tile table's entries).
        n_tiles: u32,
        /// Flash prefill tail pad: 1 reads the leader's last 64 rows instead of the rows
        /// from the last block boundary (the seed's #314 double-count bug; gate control only).
        tail_bug: u32,
    }
);
params!(
    /// KV store of `n_tokens` rows of `row_elems` f32 into a region of `n_ctx` rows at the
    /// cells named by an i32 buffer; `dst_row_bytes` is the region's row stride.
    KvStoreParams { row_elems: u32, n_tokens: u32, n_ctx: u32, dst_row_bytes: u32 }
);
params!(
    /// Gather `n_ids` rows of `ncols` elements (row stride `row_bytes`) into f32.
    GetRowsParams { ncols: u32, n_ids: u32, row_bytes: u32, n_rows: u32 }
);
params!(
    /// `out[t, r] = dot(W[r, :], x[t, :])` with W `[n, k]` (stride `row_bytes`), x `[nt, k]`.
    MatmulParams { k: u32, n: u32, nt: u32, row_bytes: u32 }
);
params!(
    /// Causal attention. q/out `[n_tokens, n_head * head_dim]`; K/V regions have rows of
    /// `kv_stride` elements (= n_head_kv * head_dim); token t attends rows `0..=positions[t]`.
    AttnParams {
        n_head: u32,
        n_head_kv: u32,
        head_dim: u32,
        n_tokens: u32,
        kv_stride: u32,
        /// KV rows covered by the launch (max position + 1).
        n_kv: u32,
        /// Decode: number of chunks and rows per chunk.
        n_chunks: u32,
        chunk_len: u32,
        scale: f32,
        /// Prefill: first KV row of the partial tail block (held in the tail pad).
        tail_pos0: u32,
        /// Prefill: number of full 64-row blocks read straight from the region.
        n_full_blocks: u32,
        /// Prefill: 1 when a partial tail block exists.
        has_tail: u32,
        /// Byte stride of a packed (q8_0) KV row.
        kv_row_bytes: u32,
    }
);
