// KV store: token t's row of `row_elems` f32 goes to region row cells[t]. The launcher has
// checked every cell against n_ctx on the host (a kernel-side check would be a silent no-write).
#include "common.h"

kernel void kernel_store_kv_f32(
        device const float * src [[buffer(0)]],
        device const int * cells [[buffer(1)]],
        device float * dst [[buffer(2)]],
        constant KvStoreParams & p [[buffer(3)]],
        uint3 tpig [[thread_position_in_grid]]) {
    if (tpig.x >= p.row_elems) { return; }
    ulong cell = ulong(cells[tpig.y]);
    dst[cell * p.row_elems + tpig.x] = src[ulong(tpig.y) * p.row_elems + tpig.x];
}

kernel void kernel_store_kv_f16(
        device const float * src [[buffer(0)]],
        device const int * cells [[buffer(1)]],
        device half * dst [[buffer(2)]],
        constant KvStoreParams & p [[buffer(3)]],
        uint3 tpig [[thread_position_in_grid]]) {
    if (tpig.x >= p.row_elems) { return; }
    ulong cell = ulong(cells[tpig.y]);
    dst[cell * p.row_elems + tpig.x] = half(src[ulong(tpig.y) * p.row_elems + tpig.x]);
}

// Q8_0: one thread per 32-element block (mf_quant_q8_0 in common.h, the CPU's rule).
kernel void kernel_store_kv_q8_0(
        device const float * src [[buffer(0)]],
        device const int * cells [[buffer(1)]],
        device uchar * dst [[buffer(2)]],
        constant KvStoreParams & p [[buffer(3)]],
        uint3 tpig [[thread_position_in_grid]]) {
    uint b = tpig.x;
    if (b >= p.row_elems / 32) { return; }
    device const float * x = src + ulong(tpig.y) * p.row_elems + b * 32;
    float v[32];
    for (int j = 0; j < 32; ++j) { v[j] = x[j]; }
    mf_quant_q8_0(v, dst + ulong(cells[tpig.y]) * p.dst_row_bytes + b * 34);
}
