// Classic causal attention, any head dim up to 512: the correctness fallback. One
// 128-thread threadgroup per (head, token); KV in blocks of 32 rows with an online softmax.
// Every thread runs the same block loop (the bound depends only on the token), so every
// barrier is reached by all threads.
#include "common.h"

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
                device const T * kr = k + ulong(j) * p.kv_stride + hk * hd;
                float acc = 0.0f;
                for (uint d = 0; d < hd; ++d) { acc += qr[d] * float(kr[d]); }
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
            device const T * vr = v + ulong(j0 + jj) * p.kv_stride + hk * hd;
            for (uint i = 0; i < 4; ++i) {
                uint d = tid + 128 * i;
                if (d < hd) { o[i] += pj * float(vr[d]); }
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
