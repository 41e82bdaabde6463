// KV-split two-pass attention over explicit windows (head dim 64 or 128, f32/f16 KV), the
// decode path after flash. Pass 1, grid (ceil(n_splits / 4), head, query), 128 threads: each
// simdgroup owns one split of SPLIT = 64 logical rows, split s covering the query's rows
// [64 s, 64 s + 64). Lane l scores rows 64 s + l and 64 s + 32 + l (a whole dot product per
// lane), the split's max and sum come from simd_max / simd_sum, the weights go through
// threadgroup memory, and the lanes then split the head dim for the V sum. Its partial goes
// to a split-major layout: o at po[(t, h, s)][HD], (m, l) at pml[(t, h, s)][2] (not the
// chunked flash's interleaved (o, m, l) rows). Pass 2 (kernel_split_window_combine) merges a
// query's live splits in split order. A row's bits depend only on its q row and the K/V
// values its window lists, in order.
#include "common.h"

constant uint MF_SPLIT_ROWS = 64;

template <typename T, uint HD>
inline void mf_split_window(
        device const float * q, device const T * k, device const T * v, device const int * win,
        device float * po, device float * pml, constant WindowAttnParams & p,
        threadgroup float * ps, uint gx, uint h, uint t, uint sg, uint lane) {
    constexpr uint NL = HD / 32;
    uint hk = h / (p.n_head / p.n_head_kv);
    device const int * w = win + ulong(t) * p.window_width;
    uint len = mf_win_len(w, p.window_width);
    uint s = gx * 4 + sg;
    uint r0 = s * MF_SPLIT_ROWS;
    device const float * qr = q + (ulong(t) * p.n_head + h) * HD;
    float sc0 = MF_MINF;
    float sc1 = MF_MINF;
    uint j0 = r0 + lane;
    uint j1 = r0 + 32 + lane;
    if (j0 < len) {
        device const T * kr = k + ulong(mf_win_cell(w, p.window_width, j0)) * p.kv_stride + hk * HD;
        float acc = 0.0f;
        for (uint d = 0; d < HD; ++d) { acc += qr[d] * float(kr[d]); }
        sc0 = acc * p.scale;
    }
    if (j1 < len) {
        device const T * kr = k + ulong(mf_win_cell(w, p.window_width, j1)) * p.kv_stride + hk * HD;
        float acc = 0.0f;
        for (uint d = 0; d < HD; ++d) { acc += qr[d] * float(kr[d]); }
        sc1 = acc * p.scale;
    }
    float m = simd_max(max(sc0, sc1));
    float p0 = j0 < len ? exp(sc0 - m) : 0.0f;
    float p1 = j1 < len ? exp(sc1 - m) : 0.0f;
    float l = simd_sum(p0 + p1);
    ps[sg * MF_SPLIT_ROWS + lane] = p0;
    ps[sg * MF_SPLIT_ROWS + 32 + lane] = p1;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (r0 < len) {
        uint n = min(MF_SPLIT_ROWS, len - r0);
        float o[NL];
        for (uint i = 0; i < NL; ++i) { o[i] = 0.0f; }
        for (uint j = 0; j < n; ++j) {
            device const T * vr = v + ulong(mf_win_cell(w, p.window_width, r0 + j)) * p.kv_stride + hk * HD;
            float pj = ps[sg * MF_SPLIT_ROWS + j];
            for (uint i = 0; i < NL; ++i) { o[i] += pj * float(vr[lane + 32 * i]); }
        }
        ulong slot = (ulong(t) * p.n_head + h) * p.n_chunks + s;
        for (uint i = 0; i < NL; ++i) { po[slot * HD + lane + 32 * i] = o[i]; }
        if (lane == 0) {
            pml[slot * 2] = m;
            pml[slot * 2 + 1] = l;
        }
    }
}

kernel void kernel_split_window_f32_hd64(
        device const float * q [[buffer(0)]], device const float * k [[buffer(1)]],
        device const float * v [[buffer(2)]], device const int * win [[buffer(3)]],
        device float * po [[buffer(4)]], device float * pml [[buffer(5)]],
        constant WindowAttnParams & p [[buffer(6)]],
        uint3 tgpig [[threadgroup_position_in_grid]],
        uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
    threadgroup float ps[4 * 64];
    mf_split_window<float, 64>(q, k, v, win, po, pml, p, ps, tgpig.x, tgpig.y, tgpig.z, sg, lane);
}

kernel void kernel_split_window_f32_hd128(
        device const float * q [[buffer(0)]], device const float * k [[buffer(1)]],
        device const float * v [[buffer(2)]], device const int * win [[buffer(3)]],
        device float * po [[buffer(4)]], device float * pml [[buffer(5)]],
        constant WindowAttnParams & p [[buffer(6)]],
        uint3 tgpig [[threadgroup_position_in_grid]],
        uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
    threadgroup float ps[4 * 64];
    mf_split_window<float, 128>(q, k, v, win, po, pml, p, ps, tgpig.x, tgpig.y, tgpig.z, sg, lane);
}

kernel void kernel_split_window_f16_hd64(
        device const float * q [[buffer(0)]], device const half * k [[buffer(1)]],
        device const half * v [[buffer(2)]], device const int * win [[buffer(3)]],
        device float * po [[buffer(4)]], device float * pml [[buffer(5)]],
        constant WindowAttnParams & p [[buffer(6)]],
        uint3 tgpig [[threadgroup_position_in_grid]],
        uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
    threadgroup float ps[4 * 64];
    mf_split_window<half, 64>(q, k, v, win, po, pml, p, ps, tgpig.x, tgpig.y, tgpig.z, sg, lane);
}

kernel void kernel_split_window_f16_hd128(
        device const float * q [[buffer(0)]], device const half * k [[buffer(1)]],
        device const half * v [[buffer(2)]], device const int * win [[buffer(3)]],
        device float * po [[buffer(4)]], device float * pml [[buffer(5)]],
        constant WindowAttnParams & p [[buffer(6)]],
        uint3 tgpig [[threadgroup_position_in_grid]],
        uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
    threadgroup float ps[4 * 64];
    mf_split_window<half, 128>(q, k, v, win, po, pml, p, ps, tgpig.x, tgpig.y, tgpig.z, sg, lane);
}

// Pass 2: merges the live splits (those starting inside the window) of one (head, query) in
// split order: out = sum_s o_s e^(m_s - M) / sum_s l_s e^(m_s - M). An empty window gives
// zeros. Grid (head, query), 128 threads, each owning head-dim entries tid, tid + 128, ...
kernel void kernel_split_window_combine(
        device const float * po [[buffer(0)]],
        device const float * pml [[buffer(1)]],
        device const int * win [[buffer(2)]],
        device float * out [[buffer(3)]],
        constant WindowAttnParams & p [[buffer(4)]],
        uint3 tgpig [[threadgroup_position_in_grid]],
        uint tid [[thread_index_in_threadgroup]]) {
    uint h = tgpig.x;
    uint t = tgpig.y;
    uint hd = p.head_dim;
    uint len = mf_win_len(win + ulong(t) * p.window_width, p.window_width);
    uint live = (len + MF_SPLIT_ROWS - 1) / MF_SPLIT_ROWS;
    ulong base = (ulong(t) * p.n_head + h) * p.n_chunks;
    device const float * ml = pml + base * 2;
    float mx = MF_MINF;
    for (uint s = 0; s < live; ++s) { mx = max(mx, ml[2 * s]); }
    float lsum = 0.0f;
    for (uint s = 0; s < live; ++s) { lsum += ml[2 * s + 1] * exp(ml[2 * s] - mx); }
    device float * orow = out + (ulong(t) * p.n_head + h) * hd;
    for (uint d = tid; d < hd; d += 128) {
        float acc = 0.0f;
        for (uint s = 0; s < live; ++s) { acc += po[(base + s) * hd + d] * exp(ml[2 * s] - mx); }
        orow[d] = lsum > 0.0f ? acc / lsum : 0.0f;
    }
}
