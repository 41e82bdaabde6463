// Flash prefill over explicit windows (head dim 64 or 128, f32/f16 KV) with the tail pad.
// The host groups consecutive queries whose windows map logical rows to the same cells (each
// one's mapping a prefix of the tile leader's, the longest) into tiles of up to 8 and passes
// each wave of tiles as constant bytes: 4 uint per tile (first query, count, leader, unused).
// Grid (tiles of the wave, head), 128 threads. A tile walks the leader's logical rows in
// C = 64-row blocks [64 b, 64 b + 64) with an online softmax per query row. Full blocks read
// K/V at the leader's cells; the partial last block (leader length M, M % 64 != 0) is read
// from the tile's slot of the tail pad, which kernel_window_tail_pad_* fills with the
// leader's rows [ic, ic + 64), ic = (M / 64) * 64, zero past M, so it never overlaps a full
// block (the seed's #314 lesson). Each query updates only with the blocks that start inside
// its own window and only with its own rows (j < len), so its bits depend only on its q row
// and the K/V values its window lists, in order: not on its tile, the tile's leader or
// whether its last block came from the region or from the pad.
#include "common.h"

// Tail pad: grid (64, tiles of the wave), 128 threads; row j of the tile's slot. p.tail_bug
// = 1 reads rows [M - 64, M) instead (the double-counting bug, kept for the gate's control).
template <typename T>
inline void mf_window_tail_pad(
        device const T * k, device const T * v, device T * kpad, device T * vpad,
        device const int * win, constant uint * tiles, constant WindowAttnParams & p,
        uint j, uint slot, uint tid) {
    device const int * wl = win + ulong(tiles[4 * slot + 2]) * p.window_width;
    uint m = mf_win_len(wl, p.window_width);
    if (m % 64 != 0) {
        uint origin = (m / 64) * 64;
        if (p.tail_bug != 0 && m > 64) { origin = m - 64; }
        uint row = origin + j;
        bool live = row < m;
        ulong cell = live ? ulong(mf_win_cell(wl, p.window_width, row)) : 0;
        ulong dst = (ulong(slot) * 64 + j) * p.kv_stride;
        for (uint e = tid; e < p.kv_stride; e += 128) {
            kpad[dst + e] = live ? k[cell * p.kv_stride + e] : T(0);
            vpad[dst + e] = live ? v[cell * p.kv_stride + e] : T(0);
        }
    }
}

kernel void kernel_window_tail_pad_f32(
        device const float * k [[buffer(0)]], device const float * v [[buffer(1)]],
        device float * kpad [[buffer(2)]], device float * vpad [[buffer(3)]],
        device const int * win [[buffer(4)]], constant uint * tiles [[buffer(5)]],
        constant WindowAttnParams & p [[buffer(6)]],
        uint3 tgpig [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]]) {
    mf_window_tail_pad<float>(k, v, kpad, vpad, win, tiles, p, tgpig.x, tgpig.y, tid);
}

kernel void kernel_window_tail_pad_f16(
        device const half * k [[buffer(0)]], device const half * v [[buffer(1)]],
        device half * kpad [[buffer(2)]], device half * vpad [[buffer(3)]],
        device const int * win [[buffer(4)]], constant uint * tiles [[buffer(5)]],
        constant WindowAttnParams & p [[buffer(6)]],
        uint3 tgpig [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]]) {
    mf_window_tail_pad<half>(k, v, kpad, vpad, win, tiles, p, tgpig.x, tgpig.y, tid);
}

template <typename T, uint HD>
inline void mf_fa_window_prefill(
        device const float * q, device const T * k, device const T * v,
        device const T * kpad, device const T * vpad, device const int * win,
        device float * out, constant uint * tiles, constant WindowAttnParams & p,
        threadgroup float * qs, threadgroup float * ss, threadgroup float * ms,
        threadgroup float * ls, threadgroup float * alpha, threadgroup uint * lens,
        threadgroup uint * bc, uint slot, uint h, uint tid) {
    constexpr uint ND = HD / 16;
    uint hk = h / (p.n_head / p.n_head_kv);
    uint t0 = tiles[4 * slot];
    uint count = tiles[4 * slot + 1];
    device const int * wl = win + ulong(tiles[4 * slot + 2]) * p.window_width;
    uint m_len = mf_win_len(wl, p.window_width);
    for (uint e = tid; e < 8 * HD; e += 128) {
        uint qi = e / HD;
        qs[e] = qi < count ? q[(ulong(t0 + qi) * p.n_head + h) * HD + e % HD] : 0.0f;
    }
    if (tid < 8) {
        ms[tid] = MF_MINF;
        ls[tid] = 0.0f;
        lens[tid] = tid < count ? mf_win_len(win + ulong(t0 + tid) * p.window_width, p.window_width) : 0;
    }
    uint my_q = tid / 16;
    float o[ND];
    for (uint i = 0; i < ND; ++i) { o[i] = 0.0f; }
    uint n_full = m_len / 64;
    uint n_blocks = (m_len + 63) / 64;
    for (uint b = 0; b < n_blocks; ++b) {
        bool tail = b == n_full;
        uint ic = b * 64;
        if (tid < 64) { bc[tid] = tail ? 0 : mf_win_cell(wl, p.window_width, ic + tid); }
        // bc (and, in the first block, qs / lens / ms / ls) are read below
        threadgroup_barrier(mem_flags::mem_threadgroup);
        // Scores: 8 x 64, four per thread; rows outside a query's own window -> MF_MINF.
        for (uint s4 = 0; s4 < 4; ++s4) {
            uint e = tid + 128 * s4;
            uint qi = e / 64;
            uint j = e % 64;
            float sc = MF_MINF;
            if (ic + j < lens[qi]) {
                device const T * kr = tail ? kpad + (ulong(slot) * 64 + j) * p.kv_stride + hk * HD
                                           : k + ulong(bc[j]) * p.kv_stride + hk * HD;
                float acc = 0.0f;
                for (uint d = 0; d < HD; ++d) { acc += qs[qi * HD + d] * float(kr[d]); }
                sc = acc * p.scale;
            }
            ss[e] = sc;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        // Row update, one thread per query row, only for a block inside the row's window.
        if (tid < 8 && ic < lens[tid]) {
            uint n = min(64u, lens[tid] - ic);
            float mo = ms[tid];
            float mn = mo;
            for (uint j = 0; j < n; ++j) { mn = max(mn, ss[tid * 64 + j]); }
            float sum = 0.0f;
            for (uint j = 0; j < n; ++j) {
                float pj = exp(ss[tid * 64 + j] - mn);
                ss[tid * 64 + j] = pj;
                sum += pj;
            }
            alpha[tid] = exp(mo - mn);
            ls[tid] = ls[tid] * alpha[tid] + sum;
            ms[tid] = mn;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        if (ic < lens[my_q]) {
            uint n = min(64u, lens[my_q] - ic);
            float a = alpha[my_q];
            for (uint i = 0; i < ND; ++i) {
                uint d = tid % 16 + 16 * i;
                float acc = o[i] * a;
                for (uint j = 0; j < n; ++j) {
                    device const T * vr = tail ? vpad + (ulong(slot) * 64 + j) * p.kv_stride
                                               : v + ulong(bc[j]) * p.kv_stride;
                    acc += ss[my_q * 64 + j] * float(vr[hk * HD + d]);
                }
                o[i] = acc;
            }
        }
        // bc / ss / alpha are rewritten by the next block.
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    if (my_q < count) {
        uint len = mf_win_len(win + ulong(t0 + my_q) * p.window_width, p.window_width);
        device float * orow = out + (ulong(t0 + my_q) * p.n_head + h) * HD;
        for (uint i = 0; i < ND; ++i) {
            // An empty window: no row contributes, the output is zeros (as on the CPU).
            orow[tid % 16 + 16 * i] = len > 0 ? o[i] / ls[my_q] : 0.0f;
        }
    }
}

kernel void kernel_fa_window_prefill_f32_hd64(
        device const float * q [[buffer(0)]], device const float * k [[buffer(1)]],
        device const float * v [[buffer(2)]], device const float * kpad [[buffer(3)]],
        device const float * vpad [[buffer(4)]], device const int * win [[buffer(5)]],
        device float * out [[buffer(6)]], constant uint * tiles [[buffer(7)]],
        constant WindowAttnParams & p [[buffer(8)]],
        uint3 tgpig [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]]) {
    threadgroup float qs[8 * 64];
    threadgroup float ss[8 * 64];
    threadgroup float ms[8];
    threadgroup float ls[8];
    threadgroup float alpha[8];
    threadgroup uint lens[8];
    threadgroup uint bc[64];
    mf_fa_window_prefill<float, 64>(q, k, v, kpad, vpad, win, out, tiles, p, qs, ss, ms, ls, alpha, lens, bc, tgpig.x, tgpig.y, tid);
}

kernel void kernel_fa_window_prefill_f32_hd128(
        device const float * q [[buffer(0)]], device const float * k [[buffer(1)]],
        device const float * v [[buffer(2)]], device const float * kpad [[buffer(3)]],
        device const float * vpad [[buffer(4)]], device const int * win [[buffer(5)]],
        device float * out [[buffer(6)]], constant uint * tiles [[buffer(7)]],
        constant WindowAttnParams & p [[buffer(8)]],
        uint3 tgpig [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]]) {
    threadgroup float qs[8 * 128];
    threadgroup float ss[8 * 64];
    threadgroup float ms[8];
    threadgroup float ls[8];
    threadgroup float alpha[8];
    threadgroup uint lens[8];
    threadgroup uint bc[64];
    mf_fa_window_prefill<float, 128>(q, k, v, kpad, vpad, win, out, tiles, p, qs, ss, ms, ls, alpha, lens, bc, tgpig.x, tgpig.y, tid);
}

kernel void kernel_fa_window_prefill_f16_hd64(
        device const float * q [[buffer(0)]], device const half * k [[buffer(1)]],
        device const half * v [[buffer(2)]], device const half * kpad [[buffer(3)]],
        device const half * vpad [[buffer(4)]], device const int * win [[buffer(5)]],
        device float * out [[buffer(6)]], constant uint * tiles [[buffer(7)]],
        constant WindowAttnParams & p [[buffer(8)]],
        uint3 tgpig [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]]) {
    threadgroup float qs[8 * 64];
    threadgroup float ss[8 * 64];
    threadgroup float ms[8];
    threadgroup float ls[8];
    threadgroup float alpha[8];
    threadgroup uint lens[8];
    threadgroup uint bc[64];
    mf_fa_window_prefill<half, 64>(q, k, v, kpad, vpad, win, out, tiles, p, qs, ss, ms, ls, alpha, lens, bc, tgpig.x, tgpig.y, tid);
}

kernel void kernel_fa_window_prefill_f16_hd128(
        device const float * q [[buffer(0)]], device const half * k [[buffer(1)]],
        device const half * v [[buffer(2)]], device const half * kpad [[buffer(3)]],
        device const half * vpad [[buffer(4)]], device const int * win [[buffer(5)]],
        device float * out [[buffer(6)]], constant uint * tiles [[buffer(7)]],
        constant WindowAttnParams & p [[buffer(8)]],
        uint3 tgpig [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]]) {
    threadgroup float qs[8 * 128];
    threadgroup float ss[8 * 64];
    threadgroup float ms[8];
    threadgroup float ls[8];
    threadgroup float alpha[8];
    threadgroup uint lens[8];
    threadgroup uint bc[64];
    mf_fa_window_prefill<half, 128>(q, k, v, kpad, vpad, win, out, tiles, p, qs, ss, ms, ls, alpha, lens, bc, tgpig.x, tgpig.y, tid);
}
