// Attention over explicit windows, any head dim up to 512: the correctness kernel. One
// 128-thread threadgroup per (head, query). The query's window is walked in logical order in
// blocks of 32 logical rows (block b covers rows [32b, 32b + 32)), with an online softmax: a
// row's result depends only on its q row and on the K/V values its window lists, in order.
// Every thread runs the same block loop (its bound is the query's window length), so every
// barrier is reached by all threads.
#include "common.h"

// KV element readers: a plain f32/f16 row, or a packed Q8_0 row (34-byte blocks: f16 scale,
// 32 int8; byte loads only, a block can start at any even offset).
template <typename T>
inline float mf_win_kv(device const T * base, uint cell, uint elem, constant WindowAttnParams & p) {
    return float(base[ulong(cell) * p.kv_stride + elem]);
}
template <>
inline float mf_win_kv<uchar>(device const uchar * base, uint cell, uint elem, constant WindowAttnParams & p) {
    device const uchar * b = base + ulong(cell) * p.kv_row_bytes + (elem / 32) * 34;
    return mf_ld_f16(b) * float(as_type<char>(b[2 + elem % 32]));
}

template <typename T>
inline void mf_attn_window(
        device const float * q, device const T * k, device const T * v, device const int * win,
        device float * out, constant WindowAttnParams & p, threadgroup float * sc,
        threadgroup uint * cells, uint h, uint t, uint tid) {
    uint hd = p.head_dim;
    uint hk = h / (p.n_head / p.n_head_kv);
    device const int * w = win + ulong(t) * p.window_width;
    uint len = mf_win_len(w, p.window_width);
    device const float * qr = q + (ulong(t) * p.n_head + h) * hd;
    float o[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    float m = MF_MINF;
    float l = 0.0f;
    for (uint j0 = 0; j0 < len; j0 += 32) {
        if (tid < 32) {
            uint j = j0 + tid;
            float s = MF_MINF;
            uint cell = 0;
            if (j < len) {
                cell = mf_win_cell(w, p.window_width, j);
                float acc = 0.0f;
                for (uint d = 0; d < hd; ++d) { acc += qr[d] * mf_win_kv<T>(k, cell, hk * hd + d, p); }
                s = acc * p.scale;
            }
            sc[tid] = s;
            cells[tid] = cell;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        float mb = m;
        for (uint jj = 0; jj < 32; ++jj) { mb = max(mb, sc[jj]); }
        float alpha = exp(m - mb);
        l *= alpha;
        for (uint i = 0; i < 4; ++i) { o[i] *= alpha; }
        for (uint jj = 0; jj < 32 && j0 + jj < len; ++jj) {
            float pj = exp(sc[jj] - mb);
            l += pj;
            for (uint i = 0; i < 4; ++i) {
                uint d = tid + 128 * i;
                if (d < hd) { o[i] += pj * mf_win_kv<T>(v, cells[jj], hk * hd + d, p); }
            }
        }
        m = mb;
        // sc and cells are rewritten by the next block: all reads above must finish first.
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    device float * orow = out + (ulong(t) * p.n_head + h) * hd;
    for (uint i = 0; i < 4; ++i) {
        uint d = tid + 128 * i;
        // An empty window: no cell contributes, the output is zeros (as on the CPU).
        if (d < hd) { orow[d] = l > 0.0f ? o[i] / l : 0.0f; }
    }
}

kernel void kernel_attn_window_f32(
        device const float * q [[buffer(0)]],
        device const float * k [[buffer(1)]],
        device const float * v [[buffer(2)]],
        device const int * win [[buffer(3)]],
        device float * out [[buffer(4)]],
        constant WindowAttnParams & p [[buffer(5)]],
        uint3 tgpig [[threadgroup_position_in_grid]],
        uint tid [[thread_index_in_threadgroup]]) {
    threadgroup float sc[32];
    threadgroup uint cells[32];
    mf_attn_window<float>(q, k, v, win, out, p, sc, cells, tgpig.x, tgpig.y, tid);
}

kernel void kernel_attn_window_f16(
        device const float * q [[buffer(0)]],
        device const half * k [[buffer(1)]],
        device const half * v [[buffer(2)]],
        device const int * win [[buffer(3)]],
        device float * out [[buffer(4)]],
        constant WindowAttnParams & p [[buffer(5)]],
        uint3 tgpig [[threadgroup_position_in_grid]],
        uint tid [[thread_index_in_threadgroup]]) {
    threadgroup float sc[32];
    threadgroup uint cells[32];
    mf_attn_window<half>(q, k, v, win, out, p, sc, cells, tgpig.x, tgpig.y, tid);
}

kernel void kernel_attn_window_q8_0(
        device const float * q [[buffer(0)]],
        device const uchar * k [[buffer(1)]],
        device const uchar * v [[buffer(2)]],
        device const int * win [[buffer(3)]],
        device float * out [[buffer(4)]],
        constant WindowAttnParams & p [[buffer(5)]],
        uint3 tgpig [[threadgroup_position_in_grid]],
        uint tid [[thread_index_in_threadgroup]]) {
    threadgroup float sc[32];
    threadgroup uint cells[32];
    mf_attn_window<uchar>(q, k, v, win, out, p, sc, cells, tgpig.x, tgpig.y, tid);
}
