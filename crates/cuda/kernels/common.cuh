// Shared helpers of every minfer CUDA kernel: integer types, f16 conversions through PTX
// (no cuda_fp16.h: NVRTC needs no headers), block reductions and the weight-type codes the
// host passes (crates/cuda/src/device.rs `TypeCode` uses the same numbers).
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#define MF_F32 0
#define MF_F16 1
#define MF_Q8_0 2
#define MF_Q4_0 3
#define MF_Q4_1 4
#define MF_Q5_0 5
#define MF_Q4_K 6
#define MF_Q6_K 7

#define MF_WIN_RUNS 8
#define MF_MINF (-__int_as_float(0x7f800000))

// Programmatic dependent launch (sm_90 on; crates/cuda/src/device.rs launches every kernel
// so when it can): `mf_pdl_launch` lets the next kernel on the stream be scheduled now, and
// `mf_pdl_wait` blocks until the kernel before this one has finished and its writes are
// visible. Every kernel waits before it reads or writes memory another kernel touches; only
// reads of constant data (weight prefetches) may come before the wait. Where the next
// kernel may start is a scheduling choice only: at the entry (MF_PDL_EARLY, the host's
// `MINFER_CUDA_PDL=early`) or once the main loop is done (MF_PDL_TRIGGER; kernels without one
// let it start when they exit). Without the launch attribute all of it is a no-op.
#ifndef MF_PDL_EARLY
#define MF_PDL_EARLY 0
#endif
__device__ __forceinline__ void mf_pdl_launch() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void mf_pdl_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
#define MF_PDL_ENTRY()                                                                           \
    do {                                                                                         \
        if (MF_PDL_EARLY) mf_pdl_launch();                                                       \
        mf_pdl_wait();                                                                           \
    } while (0)
#define MF_PDL_TRIGGER()                                                                         \
    do {                                                                                         \
        if (!MF_PDL_EARLY) mf_pdl_launch();                                                      \
    } while (0)

__device__ __forceinline__ float mf_h2f(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ u16 mf_f2h(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

// An f16 at any even byte offset (byte loads: quant blocks are not 4-byte aligned).
__device__ __forceinline__ float mf_ld_f16(const u8 *p) {
    return mf_h2f((u16)(p[0] | (p[1] << 8)));
}

// Butterfly sum and max over a warp: every lane ends with the same bits (each step adds or
// compares the same two values on both lanes of a pair).
__device__ __forceinline__ float mf_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float mf_warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// The RMSNorm scale of x[0..n) as one warp computes it (every lane returns the same bits):
// lane l sums x[l + 32 i]^2 in increasing i with explicit fma, then a butterfly over the lanes,
// then 1 / sqrt(s / n + eps), each step rounded once. The one definition the RmsNorm kernel
// and the kernels that fold the norm into their input both use.
__device__ __forceinline__ float mf_rms_scale(const float *x, int n, float eps) {
    float s = 0.0f;
    for (int i = threadIdx.x & 31; i < n; i += 32) s = __fmaf_rn(x[i], x[i], s);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, o));
    return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(s, (float)n), eps)));
}

// A normalised element: (x * scale) * gain.
__device__ __forceinline__ float mf_rms_apply(float x, float scale, float gain) {
    return __fmul_rn(__fmul_rn(x, scale), gain);
}

// Sum over a block of up to 1024 threads in a fixed order (warp tree, then warps in order):
// the same inputs give the same bits whatever else runs. `red` holds 32 floats.
__device__ float mf_block_sum(float v, float *red) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int nw = (blockDim.x + 31) >> 5;
    v = mf_warp_sum(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float s = 0.0f;
    for (int i = 0; i < nw; ++i) s += red[i];
    return s;
}

// The rotation of pair j at position `pos`: the CPU's f32 angle recurrence (theta_j is pos
// times theta_scale, multiplied j times).
__device__ __forceinline__ void mf_rope_cs(int pos, int j, float theta_scale, float freq_scale,
                                           float *c, float *s) {
    float theta = (float)pos;
    for (int k = 0; k < j; ++k) theta *= theta_scale;
    float th = freq_scale * theta;
    *c = cosf(th);
    *s = sinf(th);
}

// A RoPE pair (x0, x1) rotated by (c, s), each product rounded on its own (no fma
// contraction), so the unfused Rope and the fused Q/K/V kernel give the same bits.
__device__ __forceinline__ float mf_rope_lo(float x0, float x1, float c, float s) {
    return __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
}
__device__ __forceinline__ float mf_rope_hi(float x0, float x1, float c, float s) {
    return __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
}

// One q8_0 KV block from 32 values: d = max|x| / 127, q = round-half-away(x / d), as the
// CPU's q8_0 quantizer. Used by every KV store (unfused and fused).
__device__ __forceinline__ void mf_kv_q8_block(const float *xs, u8 *b) {
    float amax = 0.0f;
    for (int k = 0; k < 32; ++k) amax = fmaxf(amax, fabsf(xs[k]));
    float d = amax / 127.0f;
    float id = d == 0.0f ? 0.0f : 1.0f / d;
    // One 16-bit store (blocks start at even offsets). Splitting the asm's 16-bit result
    // into two byte stores lost the low byte on sm_90 (measured: d 0x23fd stored 0x2300).
    *(u16 *)b = mf_f2h(d);
    for (int k = 0; k < 32; ++k) b[2 + k] = (u8)(signed char)(int)roundf(xs[k] * id);
}

// An attention window (a span [lo, hi) when `width` is 2, else MF_WIN_RUNS (cell, len) runs):
// its length and the cell of its logical row i.
__device__ __forceinline__ u32 mf_win_len(const int *w, int width) {
    if (width == 2) return (u32)(w[1] - w[0]);
    u32 n = 0;
    for (int r = 0; r < MF_WIN_RUNS; ++r) n += (u32)w[2 * r + 1];
    return n;
}

__device__ __forceinline__ u32 mf_win_cell(const int *w, int width, u32 i) {
    if (width == 2) return (u32)w[0] + i;
    for (int r = 0; r < MF_WIN_RUNS; ++r) {
        u32 len = (u32)w[2 * r + 1];
        if (i < len) return (u32)w[2 * r] + i;
        i -= len;
    }
    return 0;
}

