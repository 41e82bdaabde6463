// Elementwise f32 ops over n elements: one thread per element, 256-thread threadgroups.
// No barriers, so the bounds return is safe.
#include "common.h"

kernel void kernel_add_f32(
        device const float * a [[buffer(0)]],
        device const float * b [[buffer(1)]],
        device float * dst [[buffer(2)]],
        constant ElementwiseParams & p [[buffer(3)]],
        uint tpig [[thread_position_in_grid]]) {
    if (tpig >= p.n) { return; }
    dst[tpig] = a[tpig] + b[tpig];
}

kernel void kernel_mul_f32(
        device const float * a [[buffer(0)]],
        device const float * b [[buffer(1)]],
        device float * dst [[buffer(2)]],
        constant ElementwiseParams & p [[buffer(3)]],
        uint tpig [[thread_position_in_grid]]) {
    if (tpig >= p.n) { return; }
    dst[tpig] = a[tpig] * b[tpig];
}

// SwiGLU: silu(gate) * up.
kernel void kernel_swiglu_f32(
        device const float * gate [[buffer(0)]],
        device const float * up [[buffer(1)]],
        device float * dst [[buffer(2)]],
        constant ElementwiseParams & p [[buffer(3)]],
        uint tpig [[thread_position_in_grid]]) {
    if (tpig >= p.n) { return; }
    dst[tpig] = mf_swiglu(gate[tpig], up[tpig]);
}

// SiLU: x / (1 + e^-x), the CPU's formula; dst may alias x.
kernel void kernel_silu_f32(
        device const float * x [[buffer(0)]],
        device float * dst [[buffer(1)]],
        constant ElementwiseParams & p [[buffer(2)]],
        uint tpig [[thread_position_in_grid]]) {
    if (tpig >= p.n) { return; }
    dst[tpig] = mf_silu(x[tpig]);
}

// Row-broadcast add (matmul bias): dst[t][i] = x[t][i] + b[i]; dst may alias x.
kernel void kernel_add_rows_f32(
        device const float * x [[buffer(0)]],
        device const float * b [[buffer(1)]],
        device float * dst [[buffer(2)]],
        constant AddRowsParams & p [[buffer(3)]],
        uint3 tpig [[thread_position_in_grid]]) {
    if (tpig.x >= p.ncols) { return; }
    ulong at = ulong(tpig.y) * p.ncols + tpig.x;
    dst[at] = x[at] + b[tpig.x];
}
