// RoPE, both styles, one thread per rotated pair; in place is allowed (each thread reads its
// pair before writing it). Dimensions past n_rot are copied.
#include "common.h"

kernel void kernel_rope_f32(
        device const float * x [[buffer(0)]],
        device const int * pos [[buffer(1)]],
        device float * dst [[buffer(2)]],
        constant RopeParams & p [[buffer(3)]],
        uint3 tpig [[thread_position_in_grid]]) {
    uint i = tpig.x;
    if (i >= p.head_dim / 2) { return; }
    ulong base = (ulong(tpig.z) * p.n_heads + tpig.y) * p.head_dim;
    uint half_rot = p.n_rot / 2;
    if (i < half_rot) {
        // precise:: so the angle does not depend on the fast-math approximations.
        float theta = float(pos[tpig.z]) * precise::pow(p.freq_base, -float(2 * i) / float(p.n_rot));
        float c = precise::cos(theta);
        float s = precise::sin(theta);
        ulong a = p.style == 0 ? base + i : base + 2 * i;
        ulong b = p.style == 0 ? base + i + half_rot : base + 2 * i + 1;
        float x0 = x[a];
        float x1 = x[b];
        dst[a] = x0 * c - x1 * s;
        dst[b] = x0 * s + x1 * c;
    } else {
        ulong a = base + p.n_rot + 2 * (i - half_rot);
        float x0 = x[a];
        float x1 = x[a + 1];
        dst[a] = x0;
        dst[a + 1] = x1;
    }
}
