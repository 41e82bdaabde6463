// Flash decode (one query token, head dim 64 or 128): grid (head, chunk). Each of the 4
// simdgroups walks every 4th KV row of the chunk with its own online softmax (lanes split the
// head dim); the 4 states merge in threadgroup memory and the chunk's unnormalised partial
// (o[HD], m, l) goes to `partial`; kernel_attn_combine_f32 merges the chunks.
#include "common.h"

template <typename T, uint HD>
inline void mf_flash_decode(
        device const float * q, device const T * k, device const T * v, device const int * pos,
        device float * partial, constant AttnParams & p,
        threadgroup float * ms, threadgroup float * ls, threadgroup float * os,
        uint h, uint c, uint sg, uint lane) {
    constexpr uint NL = HD / 32;
    uint hk = h / (p.n_head / p.n_head_kv);
    uint nkv = uint(pos[0]) + 1;
    uint start = c * p.chunk_len;
    uint end = min(nkv, start + p.chunk_len);
    float qv[NL];
    for (uint i = 0; i < NL; ++i) { qv[i] = q[h * HD + lane + 32 * i]; }
    float m = MF_MINF;
    float l = 0.0f;
    float o[NL];
    for (uint i = 0; i < NL; ++i) { o[i] = 0.0f; }
    for (uint j = start + sg; j < end; j += 4) {
        device const T * kr = k + ulong(j) * p.kv_stride + hk * HD;
        device const T * vr = v + ulong(j) * p.kv_stride + hk * HD;
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
    if (sg == 0) {
        float mx = max(max(ms[0], ms[1]), max(ms[2], ms[3]));
        float w[4];
        float lsum = 0.0f;
        for (uint g = 0; g < 4; ++g) {
            w[g] = exp(ms[g] - mx);
            lsum += ls[g] * w[g];
        }
        device float * pr = partial + (ulong(h) * p.n_chunks + c) * (HD + 2);
        for (uint i = 0; i < NL; ++i) {
            uint d = lane + 32 * i;
            pr[d] = os[d] * w[0] + os[HD + d] * w[1] + os[2 * HD + d] * w[2] + os[3 * HD + d] * w[3];
        }
        if (lane == 0) {
            pr[HD] = mx;
            pr[HD + 1] = lsum;
        }
    }
}

kernel void kernel_flash_decode_f32_hd64(
        device const float * q [[buffer(0)]], device const float * k [[buffer(1)]],
        device const float * v [[buffer(2)]], device const int * pos [[buffer(3)]],
        device float * partial [[buffer(4)]], constant AttnParams & p [[buffer(5)]],
        uint3 tgpig [[threadgroup_position_in_grid]],
        uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
    threadgroup float ms[4];
    threadgroup float ls[4];
    threadgroup float os[4 * 64];
    mf_flash_decode<float, 64>(q, k, v, pos, partial, p, ms, ls, os, tgpig.x, tgpig.y, sg, lane);
}

kernel void kernel_flash_decode_f32_hd128(
        device const float * q [[buffer(0)]], device const float * k [[buffer(1)]],
        device const float * v [[buffer(2)]], device const int * pos [[buffer(3)]],
        device float * partial [[buffer(4)]], constant AttnParams & p [[buffer(5)]],
        uint3 tgpig [[threadgroup_position_in_grid]],
        uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
    threadgroup float ms[4];
    threadgroup float ls[4];
    threadgroup float os[4 * 128];
    mf_flash_decode<float, 128>(q, k, v, pos, partial, p, ms, ls, os, tgpig.x, tgpig.y, sg, lane);
}

kernel void kernel_flash_decode_f16_hd64(
        device const float * q [[buffer(0)]], device const half * k [[buffer(1)]],
        device const half * v [[buffer(2)]], device const int * pos [[buffer(3)]],
        device float * partial [[buffer(4)]], constant AttnParams & p [[buffer(5)]],
        uint3 tgpig [[threadgroup_position_in_grid]],
        uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
    threadgroup float ms[4];
    threadgroup float ls[4];
    threadgroup float os[4 * 64];
    mf_flash_decode<half, 64>(q, k, v, pos, partial, p, ms, ls, os, tgpig.x, tgpig.y, sg, lane);
}

kernel void kernel_flash_decode_f16_hd128(
        device const float * q [[buffer(0)]], device const half * k [[buffer(1)]],
        device const half * v [[buffer(2)]], device const int * pos [[buffer(3)]],
        device float * partial [[buffer(4)]], constant AttnParams & p [[buffer(5)]],
        uint3 tgpig [[threadgroup_position_in_grid]],
        uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
    threadgroup float ms[4];
    threadgroup float ls[4];
    threadgroup float os[4 * 128];
    mf_flash_decode<half, 128>(q, k, v, pos, partial, p, ms, ls, os, tgpig.x, tgpig.y, sg, lane);
}

// Merges the chunk partials of one head: out = sum_c o_c e^(m_c - M) / sum_c l_c e^(m_c - M).
// An empty chunk has m = MF_MINF, l = 0 and contributes nothing.
kernel void kernel_attn_combine_f32(
        device const float * partial [[buffer(0)]],
        device float * out [[buffer(1)]],
        constant AttnParams & p [[buffer(2)]],
        uint3 tgpig [[threadgroup_position_in_grid]],
        uint tid [[thread_index_in_threadgroup]]) {
    uint h = tgpig.x;
    uint hd = p.head_dim;
    device const float * pr = partial + ulong(h) * p.n_chunks * (hd + 2);
    float mx = MF_MINF;
    for (uint c = 0; c < p.n_chunks; ++c) { mx = max(mx, pr[c * (hd + 2) + hd]); }
    float lsum = 0.0f;
    for (uint c = 0; c < p.n_chunks; ++c) {
        lsum += pr[c * (hd + 2) + hd + 1] * exp(pr[c * (hd + 2) + hd] - mx);
    }
    for (uint d = tid; d < hd; d += 128) {
        float acc = 0.0f;
        for (uint c = 0; c < p.n_chunks; ++c) {
            acc += pr[c * (hd + 2) + d] * exp(pr[c * (hd + 2) + hd] - mx);
        }
        out[h * hd + d] = acc / lsum;
    }
}
