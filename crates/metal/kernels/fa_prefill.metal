// Flash prefill (head dim 64 or 128): grid (ceil(n_tokens / 8), head), 128 threads. A tile of
// 8 queries walks KV in C = 64-row blocks with an online softmax. Full blocks are read from
// the region; a partial last block (n_kv % 64 != 0) is read from the tail pad, which
// kernel_kv_tail_pad_* fills with rows [tail_pos0, tail_pos0 + 64), zero past n_kv. The
// launcher sets tail_pos0 = n_full_blocks * 64 so the tail block never overlaps a full block
// (reading the last 64 rows instead double-counts the overlap: the design's #314 bug).
// Query rows past n_tokens run as masked dummies and skip the final write (no early return).
#include "common.h"

template <typename T>
inline void mf_kv_tail_pad(
        device const T * k, device const T * v, device T * kpad, device T * vpad,
        constant AttnParams & p, uint j, uint tid) {
    uint row = p.tail_pos0 + j;
    for (uint e = tid; e < p.kv_stride; e += 128) {
        bool live = row < p.n_kv;
        kpad[ulong(j) * p.kv_stride + e] = live ? k[ulong(row) * p.kv_stride + e] : T(0);
        vpad[ulong(j) * p.kv_stride + e] = live ? v[ulong(row) * p.kv_stride + e] : T(0);
    }
}

kernel void kernel_kv_tail_pad_f32(
        device const float * k [[buffer(0)]], device const float * v [[buffer(1)]],
        device float * kpad [[buffer(2)]], device float * vpad [[buffer(3)]],
        constant AttnParams & p [[buffer(4)]],
        uint3 tgpig [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]]) {
    mf_kv_tail_pad<float>(k, v, kpad, vpad, p, tgpig.x, tid);
}

kernel void kernel_kv_tail_pad_f16(
        device const half * k [[buffer(0)]], device const half * v [[buffer(1)]],
        device half * kpad [[buffer(2)]], device half * vpad [[buffer(3)]],
        constant AttnParams & p [[buffer(4)]],
        uint3 tgpig [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]]) {
    mf_kv_tail_pad<half>(k, v, kpad, vpad, p, tgpig.x, tid);
}

template <typename T, uint HD>
inline void mf_flash_prefill(
        device const float * q, device const T * k, device const T * v,
        device const T * kpad, device const T * vpad, device const int * pos,
        device float * out, constant AttnParams & p,
        threadgroup float * qs, threadgroup float * ss, threadgroup float * ms,
        threadgroup float * ls, threadgroup float * alpha, uint qt0, uint h, uint tid) {
    constexpr uint ND = HD / 16;
    uint hk = h / (p.n_head / p.n_head_kv);
    for (uint e = tid; e < 8 * HD; e += 128) {
        uint t = qt0 + e / HD;
        qs[e] = t < p.n_tokens ? q[(ulong(t) * p.n_head + h) * HD + e % HD] : 0.0f;
    }
    if (tid < 8) {
        ms[tid] = MF_MINF;
        ls[tid] = 0.0f;
    }
    uint my_q = tid / 16;
    float o[ND];
    for (uint i = 0; i < ND; ++i) { o[i] = 0.0f; }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    uint n_blocks = p.n_full_blocks + p.has_tail;
    for (uint b = 0; b < n_blocks; ++b) {
        bool tail = b == p.n_full_blocks;
        uint kbase = tail ? p.tail_pos0 : b * 64;
        device const T * kb = tail ? kpad : k + ulong(b) * 64 * p.kv_stride;
        device const T * vb = tail ? vpad : v + ulong(b) * 64 * p.kv_stride;
        // Scores: 8 x 64, four per thread; masked (future or dummy query) -> MF_MINF.
        for (uint s4 = 0; s4 < 4; ++s4) {
            uint e = tid + 128 * s4;
            uint qi = e / 64;
            uint j = e % 64;
            int qpos = qt0 + qi < p.n_tokens ? pos[qt0 + qi] : -1;
            float sc = MF_MINF;
            if (int(kbase + j) <= qpos) {
                device const T * kr = kb + ulong(j) * p.kv_stride + hk * HD;
                float acc = 0.0f;
                for (uint d = 0; d < HD; ++d) { acc += qs[qi * HD + d] * float(kr[d]); }
                sc = acc * p.scale;
            }
            ss[e] = sc;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        // Row softmax update: one thread per query row.
        if (tid < 8) {
            float mo = ms[tid];
            float mn = mo;
            for (uint j = 0; j < 64; ++j) { mn = max(mn, ss[tid * 64 + j]); }
            float sum = 0.0f;
            for (uint j = 0; j < 64; ++j) {
                float pj = exp(ss[tid * 64 + j] - mn);
                ss[tid * 64 + j] = pj;
                sum += pj;
            }
            alpha[tid] = exp(mo - mn);
            ls[tid] = ls[tid] * alpha[tid] + sum;
            ms[tid] = mn;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        float a = alpha[my_q];
        for (uint i = 0; i < ND; ++i) {
            uint d = tid % 16 + 16 * i;
            float acc = o[i] * a;
            for (uint j = 0; j < 64; ++j) {
                acc += ss[my_q * 64 + j] * float(vb[ulong(j) * p.kv_stride + hk * HD + d]);
            }
            o[i] = acc;
        }
        // ss / alpha are rewritten by the next block.
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    uint t = qt0 + my_q;
    if (t < p.n_tokens) {
        float inv = 1.0f / ls[my_q];
        for (uint i = 0; i < ND; ++i) {
            out[(ulong(t) * p.n_head + h) * HD + tid % 16 + 16 * i] = o[i] * inv;
        }
    }
}

kernel void kernel_flash_prefill_f32_hd64(
        device const float * q [[buffer(0)]], device const float * k [[buffer(1)]],
        device const float * v [[buffer(2)]], device const float * kpad [[buffer(3)]],
        device const float * vpad [[buffer(4)]], device const int * pos [[buffer(5)]],
        device float * out [[buffer(6)]], constant AttnParams & p [[buffer(7)]],
        uint3 tgpig [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]]) {
    threadgroup float qs[8 * 64];
    threadgroup float ss[8 * 64];
    threadgroup float ms[8];
    threadgroup float ls[8];
    threadgroup float alpha[8];
    mf_flash_prefill<float, 64>(q, k, v, kpad, vpad, pos, out, p, qs, ss, ms, ls, alpha, tgpig.x * 8, tgpig.y, tid);
}

kernel void kernel_flash_prefill_f32_hd128(
        device const float * q [[buffer(0)]], device const float * k [[buffer(1)]],
        device const float * v [[buffer(2)]], device const float * kpad [[buffer(3)]],
        device const float * vpad [[buffer(4)]], device const int * pos [[buffer(5)]],
        device float * out [[buffer(6)]], constant AttnParams & p [[buffer(7)]],
        uint3 tgpig [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]]) {
    threadgroup float qs[8 * 128];
    threadgroup float ss[8 * 64];
    threadgroup float ms[8];
    threadgroup float ls[8];
    threadgroup float alpha[8];
    mf_flash_prefill<float, 128>(q, k, v, kpad, vpad, pos, out, p, qs, ss, ms, ls, alpha, tgpig.x * 8, tgpig.y, tid);
}

kernel void kernel_flash_prefill_f16_hd64(
        device const float * q [[buffer(0)]], device const half * k [[buffer(1)]],
        device const half * v [[buffer(2)]], device const half * kpad [[buffer(3)]],
        device const half * vpad [[buffer(4)]], device const int * pos [[buffer(5)]],
        device float * out [[buffer(6)]], constant AttnParams & p [[buffer(7)]],
        uint3 tgpig [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]]) {
    threadgroup float qs[8 * 64];
    threadgroup float ss[8 * 64];
    threadgroup float ms[8];
    threadgroup float ls[8];
    threadgroup float alpha[8];
    mf_flash_prefill<half, 64>(q, k, v, kpad, vpad, pos, out, p, qs, ss, ms, ls, alpha, tgpig.x * 8, tgpig.y, tid);
}

kernel void kernel_flash_prefill_f16_hd128(
        device const float * q [[buffer(0)]], device const half * k [[buffer(1)]],
        device const half * v [[buffer(2)]], device const half * kpad [[buffer(3)]],
        device const half * vpad [[buffer(4)]], device const int * pos [[buffer(5)]],
        device float * out [[buffer(6)]], constant AttnParams & p [[buffer(7)]],
        uint3 tgpig [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]]) {
    threadgroup float qs[8 * 128];
    threadgroup float ss[8 * 64];
    threadgroup float ms[8];
    threadgroup float ls[8];
    threadgroup float alpha[8];
    mf_flash_prefill<half, 128>(q, k, v, kpad, vpad, pos, out, p, qs, ss, ms, ls, alpha, tgpig.x * 8, tgpig.y, tid);
}
