// Classic causal attention, any head dim up to 512: the correctness fallback. One
// 128-thread threadgroup per (head, token); KV in blocks of 32 rows with an online softmax.
// Every thread runs the same block loop (the bound depends only on the token), so every
// barrier is reached by all threads.
#include "common.h"

// KV element readers: a plain f32/f16 row, or a packed Q8_0 row (34-byte blocks: f16 scale,
// 32 int8; byte loads only, a block can start at any even offset).
template <typename T>
inline float mf_kv_at(device const T * base, ulong row, uint elem, constant AttnParams & p) {
    return float(base[row * p.kv_stride + elem]);
}
template <>
inline float mf_kv_at<uchar>(device const uchar * base, ulong row, uint elem, constant AttnParams & p) {
    device const uchar * b = base + row * p.kv_row_bytes + (elem / 32) * 34;
    return mf_ld_f16(b) * float(as_type<char>(b[2 + elem % 32]));
}

template <typename T>
inline void mf_attn_classic(
        device const float * q, device const T * k, device const T * v, device const int * pos,
        device float * out, constant AttnParams & p, threadgroup float * sc,
        uint h, uint t, uint tid) {
    uint hd = p.head_dim;
    uint hk = h / (p.n_head / p.n_head_kv);
    uint nkv = uint(pos[t]) + 1;
    device const float * qr = q + (ulong(t) * p.n_head + h) * hd;
    float o[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    float m = MF_MINF;
    float l = 0.0f;
    for (uint j0 = 0; j0 < nkv; j0 += 32) {
        if (tid < 32) {
            uint j = j0 + tid;
            float s = MF_MINF;
            if (j < nkv) {
                float acc = 0.0f;
                for (uint d = 0; d < hd; ++d) { acc += qr[d] * mf_kv_at<T>(k, j, hk * hd + d, p); }
                s = acc * p.scale;
            }
            sc[tid] = s;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        float mb = m;
        for (uint jj = 0; jj < 32; ++jj) { mb = max(mb, sc[jj]); }
        float alpha = exp(m - mb);
        l *= alpha;
        for (uint i = 0; i < 4; ++i) { o[i] *= alpha; }
        for (uint jj = 0; jj < 32 && j0 + jj < nkv; ++jj) {
            float pj = exp(sc[jj] - mb);
            l += pj;
            for (uint i = 0; i < 4; ++i) {
                uint d = tid + 128 * i;
                if (d < hd) { o[i] += pj * mf_kv_at<T>(v, j0 + jj, hk * hd + d, p); }
            }
        }
        m = mb;
        // sc is rewritten by the next block: all reads above must finish first.
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    device float * orow = out + (ulong(t) * p.n_head + h) * hd;
    for (uint i = 0; i < 4; ++i) {
        uint d = tid + 128 * i;
        if (d < hd) { orow[d] = o[i] / l; }
    }
}

kernel void kernel_attn_classic_f32(
        device const float * q [[buffer(0)]],
        device const float * k [[buffer(1)]],
        device const float * v [[buffer(2)]],
        device const int * pos [[buffer(3)]],
        device float * out [[buffer(4)]],
        constant AttnParams & p [[buffer(5)]],
        uint3 tgpig [[threadgroup_position_in_grid]],
        uint tid [[thread_index_in_threadgroup]]) {
    threadgroup float sc[32];
    mf_attn_classic<float>(q, k, v, pos, out, p, sc, tgpig.x, tgpig.y, tid);
}

kernel void kernel_attn_classic_f16(
        device const float * q [[buffer(0)]],
        device const half * k [[buffer(1)]],
        device const half * v [[buffer(2)]],
        device const int * pos [[buffer(3)]],
        device float * out [[buffer(4)]],
        constant AttnParams & p [[buffer(5)]],
        uint3 tgpig [[threadgroup_position_in_grid]],
        uint tid [[thread_index_in_threadgroup]]) {
    threadgroup float sc[32];
    mf_attn_classic<half>(q, k, v, pos, out, p, sc, tgpig.x, tgpig.y, tid);
}

// Over a packed Q8_0 KV region: the correctness kernel for a q8_0 cache at any head dim.
kernel void kernel_attn_classic_q8_0(
        device const float * q [[buffer(0)]],
        device const uchar * k [[buffer(1)]],
        device const uchar * v [[buffer(2)]],
        device const int * pos [[buffer(3)]],
        device float * out [[buffer(4)]],
        constant AttnParams & p [[buffer(5)]],
        uint3 tgpig [[threadgroup_position_in_grid]],
        uint tid [[thread_index_in_threadgroup]]) {
    threadgroup float sc[32];
    mf_attn_classic<uchar>(q, k, v, pos, out, p, sc, tgpig.x, tgpig.y, tid);
}
