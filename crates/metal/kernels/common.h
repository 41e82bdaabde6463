// Shared declarations for every kernel file: params structs (field for field the Rust ones in
// crates/metal/src/params.rs) and small helpers. Helpers are prefixed `mf_` because the real
// device compiles every file as one library.
#pragma once
#include <metal_stdlib>
using namespace metal;

struct ElementwiseParams { uint n; };
struct RmsNormParams { uint ncols; uint nrows; float eps; };
struct RopeParams { uint head_dim; uint n_heads; uint n_tokens; uint n_rot; float freq_base; uint style; };
struct KvStoreParams { uint row_elems; uint n_tokens; uint n_ctx; uint dst_row_bytes; };
struct GetRowsParams { uint ncols; uint n_ids; uint row_bytes; uint n_rows; };
struct MatmulParams { uint k; uint n; uint nt; uint row_bytes; };
struct AttnParams {
    uint n_head; uint n_head_kv; uint head_dim; uint n_tokens; uint kv_stride; uint n_kv;
    uint n_chunks; uint chunk_len; float scale; uint tail_pos0; uint n_full_blocks; uint has_tail;
    uint kv_row_bytes;
};

// A finite "minus infinity": exp(MF_MINF - m) is 0 for any real m, and MF_MINF - MF_MINF is 0,
// not NaN, so fully masked rows never produce NaN.
constant float MF_MINF = -1.0e30f;

// Little-endian loads from byte pointers: quant blocks have 2-byte alignment at best, so no
// wider loads are used on them.
inline float mf_ld_f16(device const uchar * p) {
    return float(as_type<half>(ushort(ushort(p[0]) | (ushort(p[1]) << 8))));
}
inline float mf_ld_f32(device const uchar * p) {
    return as_type<float>(uint(p[0]) | (uint(p[1]) << 8) | (uint(p[2]) << 16) | (uint(p[3]) << 24));
}
inline uint mf_ld_u32(device const uchar * p) {
    return uint(p[0]) | (uint(p[1]) << 8) | (uint(p[2]) << 16) | (uint(p[3]) << 24);
}
inline float mf_silu(float x) { return x / (1.0f + exp(-x)); }
