// Flash attention over explicit windows (head dim 64 or 128, f32/f16 KV), any number of
// queries: grid (chunk, head, query). Chunk c of a query covers its logical rows
// [c * chunk_len, (c + 1) * chunk_len), a constant of the launcher, never sized from the
// launch. In a chunk, simdgroup g walks the chunk's rows g, g + 4, ... with its own online
// softmax (lanes split the head dim); the 4 states merge in a fixed order into the chunk's
// unnormalised partial (o[HD], m, l). kernel_flash_window_combine merges a query's live chunks
// in chunk order. So a row's bits depend only on its q row and the K/V values its window
// lists, in order: not on the cells holding them, the other queries, or the launch's chunk
// count (chunks past a window are neither written nor read).
#include "common.h"

template <typename T, uint HD>
inline void mf_flash_window(
        device const float * q, device const T * k, device const T * v, device const int * win,
        device float * partial, constant WindowAttnParams & p,
        threadgroup float * ms, threadgroup float * ls, threadgroup float * os,
        uint c, uint h, uint t, uint sg, uint lane) {
    constexpr uint NL = HD / 32;
    uint hk = h / (p.n_head / p.n_head_kv);
    device const int * w = win + ulong(t) * p.window_width;
    uint len = mf_win_len(w, p.window_width);
    uint start = c * p.chunk_len;
    uint end = min(len, start + p.chunk_len);
    device const float * qr = q + (ulong(t) * p.n_head + h) * HD;
    float qv[NL];
    for (uint i = 0; i < NL; ++i) { qv[i] = qr[lane + 32 * i]; }
    float m = MF_MINF;
    float l = 0.0f;
    float o[NL];
    for (uint i = 0; i < NL; ++i) { o[i] = 0.0f; }
    for (uint j = start + sg; j < end; j += 4) {
        ulong cell = mf_win_cell(w, p.window_width, j);
        device const T * kr = k + cell * p.kv_stride + hk * HD;
        device const T * vr = v + cell * p.kv_stride + hk * HD;
        float s = 0.0f;
        for (uint i = 0; i < NL; ++i) { s += qv[i] * float(kr[lane + 32 * i]); }
        s = simd_sum(s) * p.scale;
        float mn = max(m, s);
        float a = exp(m - mn);
        float pj = exp(s - mn);
        l = l * a + pj;
        for (uint i = 0; i < NL; ++i) { o[i] = o[i] * a + pj * float(vr[lane + 32 * i]); }
        m = mn;
    }
    if (lane == 0) {
        ms[sg] = m;
        ls[sg] = l;
    }
    for (uint i = 0; i < NL; ++i) { os[sg * HD + lane + 32 * i] = o[i]; }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (sg == 0 && start < len) {
        float mx = max(max(ms[0], ms[1]), max(ms[2], ms[3]));
        float wg[4];
        float lsum = 0.0f;
        for (uint g = 0; g < 4; ++g) {
            wg[g] = exp(ms[g] - mx);
            lsum += ls[g] * wg[g];
        }
        device float * pr = partial + ((ulong(t) * p.n_head + h) * p.n_chunks + c) * (HD + 2);
        for (uint i = 0; i < NL; ++i) {
            uint d = lane + 32 * i;
            pr[d] = os[d] * wg[0] + os[HD + d] * wg[1] + os[2 * HD + d] * wg[2] + os[3 * HD + d] * wg[3];
        }
        if (lane == 0) {
            pr[HD] = mx;
            pr[HD + 1] = lsum;
        }
    }
}

kernel void kernel_flash_window_f32_hd64(
        device const float * q [[buffer(0)]], device const float * k [[buffer(1)]],
        device const float * v [[buffer(2)]], device const int * win [[buffer(3)]],
        device float * partial [[buffer(4)]], constant WindowAttnParams & p [[buffer(5)]],
        uint3 tgpig [[threadgroup_position_in_grid]],
        uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
    threadgroup float ms[4];
    threadgroup float ls[4];
    threadgroup float os[4 * 64];
    mf_flash_window<float, 64>(q, k, v, win, partial, p, ms, ls, os, tgpig.x, tgpig.y, tgpig.z, sg, lane);
}

kernel void kernel_flash_window_f32_hd128(
        device const float * q [[buffer(0)]], device const float * k [[buffer(1)]],
        device const float * v [[buffer(2)]], device const int * win [[buffer(3)]],
        device float * partial [[buffer(4)]], constant WindowAttnParams & p [[buffer(5)]],
        uint3 tgpig [[threadgroup_position_in_grid]],
        uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
    threadgroup float ms[4];
    threadgroup float ls[4];
    threadgroup float os[4 * 128];
    mf_flash_window<float, 128>(q, k, v, win, partial, p, ms, ls, os, tgpig.x, tgpig.y, tgpig.z, sg, lane);
}

kernel void kernel_flash_window_f16_hd64(
        device const float * q [[buffer(0)]], device const half * k [[buffer(1)]],
        device const half * v [[buffer(2)]], device const int * win [[buffer(3)]],
        device float * partial [[buffer(4)]], constant WindowAttnParams & p [[buffer(5)]],
        uint3 tgpig [[threadgroup_position_in_grid]],
        uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
    threadgroup float ms[4];
    threadgroup float ls[4];
    threadgroup float os[4 * 64];
    mf_flash_window<half, 64>(q, k, v, win, partial, p, ms, ls, os, tgpig.x, tgpig.y, tgpig.z, sg, lane);
}

kernel void kernel_flash_window_f16_hd128(
        device const float * q [[buffer(0)]], device const half * k [[buffer(1)]],
        device const half * v [[buffer(2)]], device const int * win [[buffer(3)]],
        device float * partial [[buffer(4)]], constant WindowAttnParams & p [[buffer(5)]],
        uint3 tgpig [[threadgroup_position_in_grid]],
        uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
    threadgroup float ms[4];
    threadgroup float ls[4];
    threadgroup float os[4 * 128];
    mf_flash_window<half, 128>(q, k, v, win, partial, p, ms, ls, os, tgpig.x, tgpig.y, tgpig.z, sg, lane);
}

// Merges the live chunks (those starting inside the window) of one (head, query), in chunk
// order: out = sum_c o_c e^(m_c - M) / sum_c l_c e^(m_c - M). An empty window gives zeros.
// Grid (head, query), 128 threads.
kernel void kernel_flash_window_combine(
        device const float * partial [[buffer(0)]],
        device const int * win [[buffer(1)]],
        device float * out [[buffer(2)]],
        constant WindowAttnParams & p [[buffer(3)]],
        uint3 tgpig [[threadgroup_position_in_grid]],
        uint tid [[thread_index_in_threadgroup]]) {
    uint h = tgpig.x;
    uint t = tgpig.y;
    uint hd = p.head_dim;
    uint len = mf_win_len(win + ulong(t) * p.window_width, p.window_width);
    uint live = (len + p.chunk_len - 1) / p.chunk_len;
    device const float * pr = partial + (ulong(t) * p.n_head + h) * p.n_chunks * (hd + 2);
    float mx = MF_MINF;
    for (uint c = 0; c < live; ++c) { mx = max(mx, pr[c * (hd + 2) + hd]); }
    float lsum = 0.0f;
    for (uint c = 0; c < live; ++c) {
        lsum += pr[c * (hd + 2) + hd + 1] * exp(pr[c * (hd + 2) + hd] - mx);
    }
    device float * orow = out + (ulong(t) * p.n_head + h) * hd;
    for (uint d = tid; d < hd; d += 128) {
        float acc = 0.0f;
        for (uint c = 0; c < live; ++c) {
            acc += pr[c * (hd + 2) + d] * exp(pr[c * (hd + 2) + hd] - mx);
        }
        orow[d] = lsum > 0.0f ? acc / lsum : 0.0f;
    }
}
