// RMSNorm: one threadgroup per row; per-simdgroup sums meet in threadgroup memory.
// Per-head QK norm: one simdgroup per head row, no threadgroup memory.
#include "common.h"

// Sum of squares over the row -> scale -> weighted output. `part` holds one partial per
// simdgroup, `total` the row sum; two barriers separate each write from its readers.
inline void mf_rms_norm_row(
        device const float * x, device const float * w, device float * dst,
        constant RmsNormParams & p, threadgroup float * part, threadgroup float * total,
        uint row, uint tid, uint ntg, uint sg, uint lane) {
    device const float * xr = x + ulong(row) * p.ncols;
    device float * dr = dst + ulong(row) * p.ncols;
    float s = 0.0f;
    for (uint i = tid; i < p.ncols; i += ntg) { s += xr[i] * xr[i]; }
    s = simd_sum(s);
    if (lane == 0) { part[sg] = s; }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (sg == 0) {
        float v = lane < ntg / 32 ? part[lane] : 0.0f;
        v = simd_sum(v);
        if (lane == 0) { total[0] = v; }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float scale = rsqrt(total[0] / float(p.ncols) + p.eps);
    for (uint i = tid; i < p.ncols; i += ntg) { dr[i] = xr[i] * scale * w[i]; }
}

kernel void kernel_rms_norm_f32(
        device const float * x [[buffer(0)]],
        device const float * w [[buffer(1)]],
        device float * dst [[buffer(2)]],
        constant RmsNormParams & p [[buffer(3)]],
        uint3 tgpig [[threadgroup_position_in_grid]],
        uint tid [[thread_index_in_threadgroup]],
        uint3 ntg [[threads_per_threadgroup]],
        uint sg [[simdgroup_index_in_threadgroup]],
        uint lane [[thread_index_in_simdgroup]]) {
    threadgroup float part[32];
    threadgroup float total[1];
    mf_rms_norm_row(x, w, dst, p, part, total, tgpig.x, tid, ntg.x, sg, lane);
}

// The 256-thread variant (the launcher always dispatches it with 256 threads).
kernel void kernel_rms_norm_256_f32(
        device const float * x [[buffer(0)]],
        device const float * w [[buffer(1)]],
        device float * dst [[buffer(2)]],
        constant RmsNormParams & p [[buffer(3)]],
        uint3 tgpig [[threadgroup_position_in_grid]],
        uint tid [[thread_index_in_threadgroup]],
        uint sg [[simdgroup_index_in_threadgroup]],
        uint lane [[thread_index_in_simdgroup]]) {
    threadgroup float part[8];
    threadgroup float total[1];
    mf_rms_norm_row(x, w, dst, p, part, total, tgpig.x, tid, 256, sg, lane);
}

// Per-head QK norm: rows of `ncols` = head dim, 4 rows per 128-thread threadgroup. A
// simdgroup past the last row skips as a whole (no barrier in this kernel).
kernel void kernel_qk_norm_f32(
        device const float * x [[buffer(0)]],
        device const float * w [[buffer(1)]],
        device float * dst [[buffer(2)]],
        constant RmsNormParams & p [[buffer(3)]],
        uint3 tgpig [[threadgroup_position_in_grid]],
        uint sg [[simdgroup_index_in_threadgroup]],
        uint lane [[thread_index_in_simdgroup]]) {
    uint row = tgpig.x * 4 + sg;
    if (row >= p.nrows) { return; }
    mf_qk_norm_row(x + ulong(row) * p.ncols, w, dst + ulong(row) * p.ncols, p.ncols, p.eps, lane);
}
