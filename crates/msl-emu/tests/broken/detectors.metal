// Deliberately broken kernels (and their fixed twins) for the emulator's detector tests.
// Each `broken_*` violates one GPU safety rule; each `fixed_*` is the same kernel obeying it.
#include <metal_stdlib>
using namespace metal;

// Rule: no early return past a barrier. Threads 32.. return, 0..31 then wait at the barrier.
kernel void broken_early_return(
        device float * out [[buffer(0)]],
        uint tid [[thread_index_in_threadgroup]]) {
    threadgroup float s[64];
    if (tid >= 32) { return; }
    s[tid] = float(tid);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    out[tid] = s[31 - tid];
}

kernel void fixed_early_return(
        device float * out [[buffer(0)]],
        uint tid [[thread_index_in_threadgroup]]) {
    threadgroup float s[64];
    if (tid < 32) { s[tid] = float(tid); }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (tid < 32) { out[tid] = s[31 - tid]; }
}

// Rule: every live lane of a simdgroup reaches the same collective.
kernel void broken_simd_divergence(
        device float * out [[buffer(0)]],
        uint tid [[thread_index_in_threadgroup]],
        uint lane [[thread_index_in_simdgroup]]) {
    float v = float(lane);
    if (lane < 16) {
        v = simd_sum(v);
    } else {
        v = simd_max(v);
    }
    out[tid] = v;
}

kernel void fixed_simd_divergence(
        device float * out [[buffer(0)]],
        uint tid [[thread_index_in_threadgroup]],
        uint lane [[thread_index_in_simdgroup]]) {
    float s = simd_sum(float(lane));
    float m = simd_max(float(lane));
    out[tid] = lane < 16 ? s : m;
}

// Rule: all threads meet at the same barrier (not one in each branch).
kernel void broken_split_barrier(
        device float * out [[buffer(0)]],
        uint tid [[thread_index_in_threadgroup]]) {
    threadgroup float s[64];
    s[tid] = float(tid);
    if (tid % 2 == 0) {
        threadgroup_barrier(mem_flags::mem_threadgroup);
    } else {
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    out[tid] = s[63 - tid];
}

// Rule: a barrier between dependent threadgroup writes and reads. Without it the value read
// depends on which thread ran first (poison or the neighbour's write).
kernel void broken_missing_barrier(
        device float * out [[buffer(0)]],
        uint tid [[thread_index_in_threadgroup]],
        uint3 ntg [[threads_per_threadgroup]]) {
    threadgroup float s[64];
    s[tid] = float(tid + 1);
    out[tid] = s[(tid + 1) % ntg.x];
}

kernel void fixed_missing_barrier(
        device float * out [[buffer(0)]],
        uint tid [[thread_index_in_threadgroup]],
        uint3 ntg [[threads_per_threadgroup]]) {
    threadgroup float s[64];
    s[tid] = float(tid + 1);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    out[tid] = s[(tid + 1) % ntg.x];
}

// A shuffle past the last lane has no defined value on hardware; the emulator poisons it.
kernel void probe_shuffle_down_past_end(
        device float * out [[buffer(0)]],
        uint lane [[thread_index_in_simdgroup]]) {
    out[lane] = simd_shuffle_down(float(lane), ushort(4));
}

// Uses more static threadgroup memory than the emulated device allows (32 KiB).
kernel void broken_threadgroup_overflow(
        device float * out [[buffer(0)]],
        uint tid [[thread_index_in_threadgroup]]) {
    threadgroup float big[9000];
    big[tid] = 1.0f;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    out[tid] = big[tid];
}

// Never finishes: every thread loops forever through a barrier (the submit bound stops it).
kernel void broken_endless_loop(
        device float * out [[buffer(0)]],
        uint tid [[thread_index_in_threadgroup]]) {
    float acc = 0.0f;
    for (uint i = 0; i != 0xffffffffu; i = (i + 1) % 7u) {
        acc += 1.0f;
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    out[tid] = acc;
}
