// Matmul and get-rows bodies, written once over the 16-element chunk dequantizers of
// dequant.h and instantiated per weight type in matmul.metal / get_rows.metal.
// out[t, r] = dot(W[r, :], x[t, :]); W is [n, k] (row stride row_bytes), x is [nt, k] f32.
#pragma once
#include "dequant.h"

#define MF_DQ_FN void (*DQ)(device const uchar *, uint, thread float *)

// get-rows: one thread per 16-element chunk of one gathered row (no barriers).
template <MF_DQ_FN>
inline void mf_get_rows(
        device const uchar * w, device const int * ids, device float * dst,
        constant GetRowsParams & p, uint r, uint c) {
    if (c >= p.ncols / 16) { return; }
    float v[16];
    DQ(w + ulong(ids[r]) * p.row_bytes, c, v);
    device float * d = dst + ulong(r) * p.ncols + c * 16;
    for (int i = 0; i < 16; ++i) { d[i] = v[i]; }
}

// Single-token mat-vec: 64 threads, one simdgroup per output row, lanes stride the chunks.
// A simdgroup past the last row skips as a whole (no threadgroup barrier in this kernel).
template <MF_DQ_FN>
inline void mf_mv(
        device const uchar * w, device const float * x, device float * dst,
        constant MatmulParams & p, uint tgx, uint sg, uint lane) {
    uint r = tgx * 2 + sg;
    if (r >= p.n) { return; }
    device const uchar * row = w + ulong(r) * p.row_bytes;
    float acc = 0.0f;
    for (uint c = lane; c < p.k / 16; c += 32) {
        float v[16];
        DQ(row, c, v);
        for (int i = 0; i < 16; ++i) { acc += v[i] * x[c * 16 + i]; }
    }
    acc = simd_sum(acc);
    if (lane == 0) { dst[r] = acc; }
}

// Multi-token rows: 64 threads = two output rows per threadgroup; each chunk is dequantized
// once per group of 4 tokens.
template <MF_DQ_FN>
inline void mf_mv_multi(
        device const uchar * w, device const float * x, device float * dst,
        constant MatmulParams & p, uint tgx, uint sg, uint lane) {
    uint r = tgx * 2 + sg;
    if (r >= p.n) { return; }
    device const uchar * row = w + ulong(r) * p.row_bytes;
    for (uint t0 = 0; t0 < p.nt; t0 += 4) {
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (uint c = lane; c < p.k / 16; c += 32) {
            float v[16];
            DQ(row, c, v);
            for (uint tt = 0; tt < 4; ++tt) {
                if (t0 + tt < p.nt) {
                    device const float * xr = x + ulong(t0 + tt) * p.k + c * 16;
                    for (int i = 0; i < 16; ++i) { acc[tt] += v[i] * xr[i]; }
                }
            }
        }
        for (uint tt = 0; tt < 4; ++tt) {
            float s = simd_sum(acc[tt]);
            if (lane == 0 && t0 + tt < p.nt) { dst[ulong(t0 + tt) * p.n + r] = s; }
        }
    }
}

// Simdgroup GEMM for prefill: a 64-row x 32-token output tile per 128-thread threadgroup,
// K in steps of 32 through 8 KiB of threadgroup memory: weights as half [64][32] at byte 0,
// activations as float k-major [32][32] at byte 4096. Simdgroup g owns rows (g%2)*32..+32
// and tokens (g/2)*16..+16 (4 x 2 tiles of 8x8). The result goes through the same scratch
// as float [64][32] so edge tiles are written with bounds checks.
template <MF_DQ_FN>
inline void mf_mm(
        device const uchar * w, device const float * x, device float * dst,
        constant MatmulParams & p, threadgroup uchar * shmem,
        uint3 tgpig, uint tid, uint sg) {
    threadgroup half * sa = (threadgroup half *) shmem;
    threadgroup float * sb = (threadgroup float *) (shmem + 4096);
    uint r0 = tgpig.y * 64;
    uint t0 = tgpig.x * 32;
    uint rbase = (sg % 2) * 32;
    uint tbase = (sg / 2) * 16;
    simdgroup_float8x8 mc[8];
    for (int i = 0; i < 8; ++i) { mc[i] = make_filled_simdgroup_matrix<float, 8>(0.0f); }
    for (uint k0 = 0; k0 < p.k; k0 += 32) {
        uint lr = tid / 2;
        uint kc = tid % 2;
        float v[16];
        if (r0 + lr < p.n) {
            DQ(w + ulong(r0 + lr) * p.row_bytes, k0 / 16 + kc, v);
        } else {
            for (int i = 0; i < 16; ++i) { v[i] = 0.0f; }
        }
        for (int i = 0; i < 16; ++i) { sa[lr * 32 + kc * 16 + i] = half(v[i]); }
        uint lt = tid / 4;
        uint part = tid % 4;
        for (uint i = 0; i < 8; ++i) {
            uint kk = part * 8 + i;
            sb[kk * 32 + lt] = t0 + lt < p.nt ? x[ulong(t0 + lt) * p.k + k0 + kk] : 0.0f;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (uint kk = 0; kk < 32; kk += 8) {
            simdgroup_half8x8 ma[4];
            simdgroup_float8x8 mb[2];
            for (uint i = 0; i < 4; ++i) { simdgroup_load(ma[i], sa + (rbase + 8 * i) * 32 + kk, 32); }
            for (uint j = 0; j < 2; ++j) { simdgroup_load(mb[j], sb + kk * 32 + tbase + 8 * j, 32); }
            for (uint i = 0; i < 4; ++i) {
                for (uint j = 0; j < 2; ++j) {
                    simdgroup_multiply_accumulate(mc[i * 2 + j], ma[i], mb[j], mc[i * 2 + j]);
                }
            }
        }
        // The next step overwrites sa/sb: every simdgroup must be done reading.
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    threadgroup float * sc = (threadgroup float *) shmem;
    for (uint i = 0; i < 4; ++i) {
        for (uint j = 0; j < 2; ++j) {
            simdgroup_store(mc[i * 2 + j], sc + (rbase + 8 * i) * 32 + tbase + 8 * j, 32);
        }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint e = tid; e < 64 * 32; e += 128) {
        uint lr = e / 32;
        uint lt = e % 32;
        if (r0 + lr < p.n && t0 + lt < p.nt) { dst[ulong(t0 + lt) * p.n + r0 + lr] = sc[e]; }
    }
}
