// Fused decode nodes (one token). The q|k|v row and the gate|up row come from one mat-vec
// over the concatenated weights (matmul.metal, each output row computed as the unfused
// mat-vec computes it); these kernels finish them through the helpers the unfused kernels use
// (common.h), so fused and unfused decode give the same bits.
#include "common.h"

// Per-head RMSNorm of the q and k heads of a q|k|v row, in place: rows of head_dim, the first
// n_q with gain wq, the next n_k with wk; v is untouched. As kernel_qk_norm_f32: 4 heads per
// 128-thread threadgroup, one simdgroup per head; a simdgroup past the last head skips as a
// whole (no barrier in this kernel).
kernel void kernel_qkv_norm_f32(
        device float * x [[buffer(0)]],
        device const float * wq [[buffer(1)]],
        device const float * wk [[buffer(2)]],
        constant QkvNormParams & p [[buffer(3)]],
        uint3 tgpig [[threadgroup_position_in_grid]],
        uint sg [[simdgroup_index_in_threadgroup]],
        uint lane [[thread_index_in_simdgroup]]) {
    uint row = tgpig.x * 4 + sg;
    if (row >= p.n_q + p.n_k) { return; }
    device float * xr = x + ulong(row) * p.head_dim;
    mf_qk_norm_row(xr, row < p.n_q ? wq : wk, xr, p.head_dim, p.eps, lane);
}

// Element e of one part (q, k or v) of the q|k|v row plus its bias, as kernel_add_rows_f32.
inline float mf_qkv_biased(device const float * x, device const float * b,
                           constant QkvStoreParams & p, uint e) {
    return p.has_bias != 0 ? x[e] + b[e] : x[e];
}

// Element e of a q or k part after bias and RoPE over whole heads, as kernel_rope_f32 with
// n_rot = head_dim: the pair holding e is rotated and e's half of it returned.
inline float mf_qkv_roped(device const float * x, device const float * b,
                          constant QkvStoreParams & p, float pos, uint e) {
    uint hd = p.head_dim;
    uint base = (e / hd) * hd;
    uint i = e % hd;
    uint half_dim = hd / 2;
    uint j = p.style == 0 ? (i < half_dim ? i : i - half_dim) : i / 2;
    uint a = p.style == 0 ? base + j : base + 2 * j;
    uint bb = p.style == 0 ? base + j + half_dim : base + 2 * j + 1;
    float c;
    float s;
    mf_rope_cs(pos, j, hd, p.freq_base, p.freq_scale, c, s);
    float y0;
    float y1;
    mf_rope_rot(mf_qkv_biased(x, b, p, a), mf_qkv_biased(x, b, p, bb), c, s, y0, y1);
    return e == a ? y0 : y1;
}

// Bias + RoPE + KV store of one token's q|k|v row: tpig.y is the part (0 q, 1 k, 2 v), tpig.x
// the element. q goes (roped) to `q`, k (roped) and v to row cells[0] of the regions, as
// kernel_store_kv_{f32,f16} write them. The launcher has checked the cell on the host.
template <typename T>
inline void mf_qkv_rope_store(
        device const float * qkv, device const float * bq, device const float * bk,
        device const float * bv, device const int * pos, device const int * cells,
        device float * q, device T * kc, device T * vc, constant QkvStoreParams & p,
        uint3 tpig) {
    uint e = tpig.x;
    uint q_dim = p.n_head * p.head_dim;
    uint kv_dim = p.n_head_kv * p.head_dim;
    ulong cell = ulong(cells[0]);
    if (tpig.y == 0) {
        if (e < q_dim) { q[e] = mf_qkv_roped(qkv, bq, p, float(pos[0]), e); }
    } else if (tpig.y == 1) {
        if (e < kv_dim) { kc[cell * kv_dim + e] = T(mf_qkv_roped(qkv + q_dim, bk, p, float(pos[0]), e)); }
    } else if (e < kv_dim) {
        vc[cell * kv_dim + e] = T(mf_qkv_biased(qkv + q_dim + kv_dim, bv, p, e));
    }
}

kernel void kernel_qkv_rope_store_f32(
        device const float * qkv [[buffer(0)]],
        device const float * bq [[buffer(1)]],
        device const float * bk [[buffer(2)]],
        device const float * bv [[buffer(3)]],
        device const int * pos [[buffer(4)]],
        device const int * cells [[buffer(5)]],
        device float * q [[buffer(6)]],
        device float * kc [[buffer(7)]],
        device float * vc [[buffer(8)]],
        constant QkvStoreParams & p [[buffer(9)]],
        uint3 tpig [[thread_position_in_grid]]) {
    mf_qkv_rope_store<float>(qkv, bq, bk, bv, pos, cells, q, kc, vc, p, tpig);
}

kernel void kernel_qkv_rope_store_f16(
        device const float * qkv [[buffer(0)]],
        device const float * bq [[buffer(1)]],
        device const float * bk [[buffer(2)]],
        device const float * bv [[buffer(3)]],
        device const int * pos [[buffer(4)]],
        device const int * cells [[buffer(5)]],
        device float * q [[buffer(6)]],
        device half * kc [[buffer(7)]],
        device half * vc [[buffer(8)]],
        constant QkvStoreParams & p [[buffer(9)]],
        uint3 tpig [[thread_position_in_grid]]) {
    mf_qkv_rope_store<half>(qkv, bq, bk, bv, pos, cells, q, kc, vc, p, tpig);
}

// Q8_0 regions: q per element as above; k and v one thread per 32-element block, quantized by
// mf_quant_q8_0 as kernel_store_kv_q8_0 does.
kernel void kernel_qkv_rope_store_q8_0(
        device const float * qkv [[buffer(0)]],
        device const float * bq [[buffer(1)]],
        device const float * bk [[buffer(2)]],
        device const float * bv [[buffer(3)]],
        device const int * pos [[buffer(4)]],
        device const int * cells [[buffer(5)]],
        device float * q [[buffer(6)]],
        device uchar * kc [[buffer(7)]],
        device uchar * vc [[buffer(8)]],
        constant QkvStoreParams & p [[buffer(9)]],
        uint3 tpig [[thread_position_in_grid]]) {
    uint e = tpig.x;
    uint q_dim = p.n_head * p.head_dim;
    uint kv_dim = p.n_head_kv * p.head_dim;
    float fpos = float(pos[0]);
    if (tpig.y == 0) {
        if (e < q_dim) { q[e] = mf_qkv_roped(qkv, bq, p, fpos, e); }
        return;
    }
    if (e >= kv_dim / 32) { return; }
    float v[32];
    for (uint j = 0; j < 32; ++j) {
        v[j] = tpig.y == 1 ? mf_qkv_roped(qkv + q_dim, bk, p, fpos, e * 32 + j)
                           : mf_qkv_biased(qkv + q_dim + kv_dim, bv, p, e * 32 + j);
    }
    device uchar * region = tpig.y == 1 ? kc : vc;
    mf_quant_q8_0(v, region + ulong(cells[0]) * p.dst_row_bytes + e * 34);
}

// FFN gate/up of one token: dst[i] = silu(gu[i]) * gu[n + i] over a gate|up row of 2n, as
// kernel_swiglu_f32.
kernel void kernel_swiglu_split_f32(
        device const float * gu [[buffer(0)]],
        device float * dst [[buffer(1)]],
        constant ElementwiseParams & p [[buffer(2)]],
        uint tpig [[thread_position_in_grid]]) {
    if (tpig >= p.n) { return; }
    dst[tpig] = mf_swiglu(gu[tpig], gu[p.n + tpig]);
}
