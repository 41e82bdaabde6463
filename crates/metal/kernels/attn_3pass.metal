// Three-pass parallel attention over explicit windows (the prefill path after flash): scores,
// masked softmax, output, each over a query's logical rows 0..len. The score buffer holds
// p.row_stride floats per (query, head); rows at or past a query's length are never written
// or read (the mask). Each value is a fixed-order function of its own query's q row and the
// K/V values its window lists, in order, so the family is batch invariant.
#include "common.h"

// Pass 1: grid (ceil(row_stride / 128), head, query), 128 threads; thread j scores logical
// row 128 x + j with one whole dot product.
template <typename T>
inline void mf_window_scores(
        device const float * q, device const T * k, device const int * win, device float * sc,
        constant WindowAttnParams & p, uint gx, uint h, uint t, uint tid) {
    uint hd = p.head_dim;
    uint hk = h / (p.n_head / p.n_head_kv);
    device const int * w = win + ulong(t) * p.window_width;
    uint len = mf_win_len(w, p.window_width);
    uint j = gx * 128 + tid;
    if (j < len) {
        device const float * qr = q + (ulong(t) * p.n_head + h) * hd;
        device const T * kr = k + ulong(mf_win_cell(w, p.window_width, j)) * p.kv_stride + hk * hd;
        float acc = 0.0f;
        for (uint d = 0; d < hd; ++d) { acc += qr[d] * float(kr[d]); }
        sc[(ulong(t) * p.n_head + h) * p.row_stride + j] = acc * p.scale;
    }
}

kernel void kernel_window_scores_f32(
        device const float * q [[buffer(0)]], device const float * k [[buffer(1)]],
        device const int * win [[buffer(2)]], device float * sc [[buffer(3)]],
        constant WindowAttnParams & p [[buffer(4)]],
        uint3 tgpig [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]]) {
    mf_window_scores<float>(q, k, win, sc, p, tgpig.x, tgpig.y, tgpig.z, tid);
}

kernel void kernel_window_scores_f16(
        device const float * q [[buffer(0)]], device const half * k [[buffer(1)]],
        device const int * win [[buffer(2)]], device float * sc [[buffer(3)]],
        constant WindowAttnParams & p [[buffer(4)]],
        uint3 tgpig [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]]) {
    mf_window_scores<half>(q, k, win, sc, p, tgpig.x, tgpig.y, tgpig.z, tid);
}

// Pass 2: grid (head, query), 128 threads. Thread i reduces rows i, i + 128, ... < len; the
// 128 partial maxima and then sums are folded in thread order by every thread, and the row
// is overwritten in place with its probabilities e^(s - max) / sum.
kernel void kernel_window_softmax(
        device float * sc [[buffer(0)]],
        device const int * win [[buffer(1)]],
        constant WindowAttnParams & p [[buffer(2)]],
        uint3 tgpig [[threadgroup_position_in_grid]],
        uint tid [[thread_index_in_threadgroup]]) {
    threadgroup float red[128];
    uint h = tgpig.x;
    uint t = tgpig.y;
    uint len = mf_win_len(win + ulong(t) * p.window_width, p.window_width);
    device float * row = sc + (ulong(t) * p.n_head + h) * p.row_stride;
    float mloc = MF_MINF;
    for (uint j = tid; j < len; j += 128) { mloc = max(mloc, row[j]); }
    red[tid] = mloc;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float mx = MF_MINF;
    for (uint i = 0; i < 128; ++i) { mx = max(mx, red[i]); }
    // every thread has read red: it is rewritten with the partial sums next
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float lloc = 0.0f;
    for (uint j = tid; j < len; j += 128) {
        float e = exp(row[j] - mx);
        row[j] = e;
        lloc += e;
    }
    red[tid] = lloc;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float lsum = 0.0f;
    for (uint i = 0; i < 128; ++i) { lsum += red[i]; }
    for (uint j = tid; j < len; j += 128) { row[j] = row[j] / lsum; }
}

// Pass 3: grid (head, query), 128 threads, each owning head-dim entries tid, tid + 128, ...:
// out[d] = sum over logical rows j < len, in order, of P[j] * V[cell(j)][d]. An empty window
// gives zeros.
template <typename T>
inline void mf_window_pv(
        device const float * sc, device const T * v, device const int * win, device float * out,
        constant WindowAttnParams & p, uint h, uint t, uint tid) {
    uint hd = p.head_dim;
    uint hk = h / (p.n_head / p.n_head_kv);
    device const int * w = win + ulong(t) * p.window_width;
    uint len = mf_win_len(w, p.window_width);
    device const float * row = sc + (ulong(t) * p.n_head + h) * p.row_stride;
    device float * orow = out + (ulong(t) * p.n_head + h) * hd;
    for (uint d = tid; d < hd; d += 128) {
        float acc = 0.0f;
        for (uint j = 0; j < len; ++j) {
            acc += row[j] * float(v[ulong(mf_win_cell(w, p.window_width, j)) * p.kv_stride + hk * hd + d]);
        }
        orow[d] = acc;
    }
}

kernel void kernel_window_pv_f32(
        device const float * sc [[buffer(0)]], device const float * v [[buffer(1)]],
        device const int * win [[buffer(2)]], device float * out [[buffer(3)]],
        constant WindowAttnParams & p [[buffer(4)]],
        uint3 tgpig [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]]) {
    mf_window_pv<float>(sc, v, win, out, p, tgpig.x, tgpig.y, tid);
}

kernel void kernel_window_pv_f16(
        device const float * sc [[buffer(0)]], device const half * v [[buffer(1)]],
        device const int * win [[buffer(2)]], device float * out [[buffer(3)]],
        constant WindowAttnParams & p [[buffer(4)]],
        uint3 tgpig [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]]) {
    mf_window_pv<half>(sc, v, win, out, p, tgpig.x, tgpig.y, tid);
}
