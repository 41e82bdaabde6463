// RoPE, both styles, one thread per rotated pair; in place is allowed (each thread reads its
// pair before writing it). Dimensions past n_rot are copied. Angles follow the CPU's f32
// recurrence (mf_rope_cs in common.h).
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
        float c;
        float s;
        mf_rope_cs(float(pos[tpig.z]), i, p.n_rot, p.freq_base, p.freq_scale, c, s);
        ulong a = p.style == 0 ? base + i : base + 2 * i;
        ulong b = p.style == 0 ? base + i + half_rot : base + 2 * i + 1;
        float y0;
        float y1;
        mf_rope_rot(x[a], x[b], c, s, y0, y1);
        dst[a] = y0;
        dst[b] = y1;
    } else {
        ulong a = base + p.n_rot + 2 * (i - half_rot);
        float x0 = x[a];
        float x1 = x[a + 1];
        dst[a] = x0;
        dst[a + 1] = x1;
    }
}

// RoPE shift of stored K rows (crates/cpu/src/ops/kv_cells.rs rope_shift): the rows of cells
// cell0..cell0 + n_cells are rotated in place by delta positions over the whole head. A pair
// is read, rotated in f32 and written back by one thread (f16: rounded to nearest even).
template <typename T>
inline void mf_rope_shift(device T * k, constant RopeShiftParams & p, uint3 tpig) {
    uint i = tpig.x;
    if (i >= p.head_dim / 2) { return; }
    ulong base = ((ulong(p.cell0) + tpig.z) * p.n_heads + tpig.y) * p.head_dim;
    uint half_dim = p.head_dim / 2;
    float c;
    float s;
    mf_rope_cs(float(p.delta), i, p.head_dim, p.freq_base, p.freq_scale, c, s);
    ulong a = p.style == 0 ? base + i : base + 2 * i;
    ulong b = p.style == 0 ? base + i + half_dim : base + 2 * i + 1;
    float x0 = float(k[a]);
    float x1 = float(k[b]);
    k[a] = T(x0 * c - x1 * s);
    k[b] = T(x0 * s + x1 * c);
}

kernel void kernel_kv_rope_shift_f32(
        device float * k [[buffer(0)]],
        constant RopeShiftParams & p [[buffer(1)]],
        uint3 tpig [[thread_position_in_grid]]) {
    mf_rope_shift<float>(k, p, tpig);
}

kernel void kernel_kv_rope_shift_f16(
        device half * k [[buffer(0)]],
        constant RopeShiftParams & p [[buffer(1)]],
        uint3 tpig [[thread_position_in_grid]]) {
    mf_rope_shift<half>(k, p, tpig);
}
