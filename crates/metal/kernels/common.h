// Shared declarations for every kernel file: params structs (field for field the Rust ones in
// crates/metal/src/params.rs) and small helpers. Helpers are prefixed `mf_` because the real
// device compiles every file as one library.
#pragma once
#include <metal_stdlib>
using namespace metal;

struct ElementwiseParams { uint n; };
struct RmsNormParams { uint ncols; uint nrows; float eps; };
struct RopeParams {
    uint head_dim; uint n_heads; uint n_tokens; uint n_rot; float freq_base; float freq_scale; uint style;
};
struct RopeShiftParams {
    uint head_dim; uint n_heads; uint n_cells; uint cell0; int delta; float freq_base; float freq_scale;
    uint style;
};
struct AddRowsParams { uint ncols; uint nrows; };
struct QkvNormParams { uint head_dim; uint n_q; uint n_k; float eps; };
struct QkvStoreParams {
    uint n_head; uint n_head_kv; uint head_dim; uint has_bias; float freq_base; float freq_scale;
    uint style; uint dst_row_bytes;
};
struct WindowAttnParams {
    uint n_head; uint n_head_kv; uint head_dim; uint n_tokens; uint kv_stride; uint kv_row_bytes;
    uint window_width; uint n_chunks; uint chunk_len; float scale; uint row_stride; uint n_tiles;
    uint tail_bug;
};
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
inline float mf_swiglu(float gate, float up) { return mf_silu(gate) * up; }

// The RoPE rotation of one pair by the angle's cosine and sine (kernel_rope_f32 and the
// fused QKV kernel both rotate through this, so their bits agree).
inline void mf_rope_rot(float x0, float x1, float c, float s, thread float & y0,
                        thread float & y1) {
    y0 = x0 * c - x1 * s;
    y1 = x0 * s + x1 * c;
}

// Per-head RMSNorm of one row of `ncols` by one simdgroup (lanes stride the row); dr may
// alias xr (every lane reads its elements before the collective, writes after).
inline void mf_qk_norm_row(device const float * xr, device const float * w, device float * dr,
                           uint ncols, float eps, uint lane) {
    float s = 0.0f;
    for (uint i = lane; i < ncols; i += 32) { s += xr[i] * xr[i]; }
    s = simd_sum(s);
    float scale = rsqrt(s / float(ncols) + eps);
    for (uint i = lane; i < ncols; i += 32) { dr[i] = xr[i] * scale * w[i]; }
}

// Q8_0 quantization of 32 values into one 34-byte block, the CPU reference rule: d = amax /
// 127, q = round(x * (1/d)) (half away from zero), d stored as f16 (round to nearest even).
// precise:: keeps both divisions exact so the bytes match the CPU quantizer.
inline void mf_quant_q8_0(thread const float * x, device uchar * out) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) { amax = max(amax, fabs(x[j])); }
    float d = precise::divide(amax, 127.0f);
    float id = d != 0.0f ? precise::divide(1.0f, d) : 0.0f;
    ushort dbits = as_type<ushort>(half(d));
    out[0] = uchar(dbits & 255);
    out[1] = uchar(dbits >> 8);
    for (int j = 0; j < 32; ++j) {
        out[2 + j] = as_type<uchar>(char(round(x[j] * id)));
    }
}

// RoPE angle of pair i at position pos, as the CPU computes it (crates/cpu/src/ops/rope.rs):
// theta_0 = pos, theta_{j+1} = theta_j * base^(-2/n_rot), each step rounded to f32, then
// freq_scale * theta_i. precise:: so the angle does not depend on fast-math approximations.
inline void mf_rope_cs(float pos, uint i, uint n_rot, float base, float freq_scale,
                       thread float & c, thread float & s) {
    float ts = precise::pow(base, -2.0f / float(n_rot));
    float theta = pos;
    for (uint j = 0; j < i; ++j) { theta *= ts; }
    float th = freq_scale * theta;
    c = precise::cos(th);
    s = precise::sin(th);
}

// Attention windows (WindowAttnParams::window_width i32 per query): width 2 is a span
// (lo, hi) listing cells lo..hi; otherwise MF_WIN_RUNS (cell, len) runs, unused ones of length
// 0. The cells listed, concatenated in order, are the query's logical rows 0..len. The
// launcher has checked every run against the region on the host.
constant uint MF_WIN_RUNS = 8;

inline uint mf_win_len(device const int * w, uint width) {
    if (width == 2) { return uint(w[1] - w[0]); }
    uint n = 0;
    for (uint r = 0; r < MF_WIN_RUNS; ++r) { n += uint(w[2 * r + 1]); }
    return n;
}

// The cell of logical row i (i < mf_win_len).
inline uint mf_win_cell(device const int * w, uint width, uint i) {
    if (width == 2) { return uint(w[0]) + i; }
    for (uint r = 0; r < MF_WIN_RUNS; ++r) {
        uint len = uint(w[2 * r + 1]);
        if (i < len) { return uint(w[2 * r]) + i; }
        i -= len;
    }
    return 0;
}
