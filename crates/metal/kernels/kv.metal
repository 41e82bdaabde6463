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

// Q8_0: one thread per 32-element block, the CPU reference rule: d = amax / 127,
// q = round(x * (1/d)) (half away from zero), d stored as f16 (round to nearest even).
// precise:: keeps both divisions exact so the bytes match the CPU quantizer.
kernel void kernel_store_kv_q8_0(
        device const float * src [[buffer(0)]],
        device const int * cells [[buffer(1)]],
        device uchar * dst [[buffer(2)]],
        constant KvStoreParams & p [[buffer(3)]],
        uint3 tpig [[thread_position_in_grid]]) {
    uint b = tpig.x;
    if (b >= p.row_elems / 32) { return; }
    device const float * x = src + ulong(tpig.y) * p.row_elems + b * 32;
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) { amax = max(amax, fabs(x[j])); }
    float d = precise::divide(amax, 127.0f);
    float id = d != 0.0f ? precise::divide(1.0f, d) : 0.0f;
    device uchar * out = dst + ulong(cells[tpig.y]) * p.dst_row_bytes + b * 34;
    ushort dbits = as_type<ushort>(half(d));
    out[0] = uchar(dbits & 255);
    out[1] = uchar(dbits >> 8);
    for (int j = 0; j < 32; ++j) {
        out[2 + j] = as_type<uchar>(char(round(x[j] * id)));
    }
}
