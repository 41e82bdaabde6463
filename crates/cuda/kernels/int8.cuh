// Quantized matmuls on int8 dot products (the device functions; kernels in mmvq.cu and
// fused.cu) (llama.cpp's MMVQ idea): activations are quantized
// to 8 bits per 32-element block (`mf_quantize_q8`: int8 values, the block's scale d and
// d * sum(q)), the weight block's quants are unpacked to int8 lanes, and `dp4a` gives the
// block's integer dot product exactly. Only the float combination of blocks is rounded.
//
// The canonical order (every kernel that computes these products keeps it, so a row's bits
// never depend on the kernel, tile or batch it ran in): block b's contribution c_b is a fixed
// expression of explicitly rounded operations (`__fmul_rn`/`__fadd_rn`: no fma contraction
// that could differ between kernels); partial P_r sums c_b over b = r, r + 8, r + 16, ... in
// increasing order from +0; the output is ((P0+P4)+(P2+P6)) + ((P1+P5)+(P3+P7)), then the
// bias. Eight lanes per output row, four rows per warp, in the multi-token kernel; the
// one-token kernels compute a row's c_b over a whole warp and chain the partials by shuffles.

#define MF_MV_ROWS 16 // output rows per 128-thread block
#define MF_MV_T 8     // tokens per block: their products share each weight block's loads

__device__ __forceinline__ int mf_dp4a(int a, int b, int c) {
    int r;
    asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}

// 32 bits from a 2-byte-aligned address.
__device__ __forceinline__ int mf_ld2(const u8 *p) {
    const u16 *h = (const u16 *)p;
    return (int)((u32)h[0] | ((u32)h[1] << 16));
}

__device__ __forceinline__ int mf_ld4(const u8 *p) { return *(const int *)p; }

// Bit 4 of byte k set from bit k of the low nibble of `x` (Q5_0's fifth bit).
__device__ __forceinline__ int mf_spread4(u32 x) {
    return (int)(((x & 1u) << 4) | ((x & 2u) << 11) | ((x & 4u) << 18) | ((x & 8u) << 25));
}

// A weight block's quants as 8 words of int8 lanes (elements 4i..4i+3 in word i) and its
// scale terms. c_b is then mf_contrib over the two 16-element integer halves A and B.
struct MfWBlk {
    int q[8];
    float f1, f2;
    int i1, i2;
};

template <int TY> __device__ __forceinline__ void mf_wload(const u8 *row, int b, MfWBlk &w);

template <> __device__ __forceinline__ void mf_wload<MF_Q8_0>(const u8 *row, int b, MfWBlk &w) {
    const u8 *p = row + (u64)b * 34;
    w.f1 = mf_ld_f16(p);
#pragma unroll
    for (int i = 0; i < 8; ++i) w.q[i] = mf_ld2(p + 2 + 4 * i);
}

template <> __device__ __forceinline__ void mf_wload<MF_Q4_0>(const u8 *row, int b, MfWBlk &w) {
    const u8 *p = row + (u64)b * 18;
    w.f1 = mf_ld_f16(p);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        int v = mf_ld2(p + 2 + 4 * i);
        w.q[i] = v & 0x0F0F0F0F;
        w.q[4 + i] = (v >> 4) & 0x0F0F0F0F;
    }
}

template <> __device__ __forceinline__ void mf_wload<MF_Q4_1>(const u8 *row, int b, MfWBlk &w) {
    const u8 *p = row + (u64)b * 20;
    w.f1 = mf_ld_f16(p);
    w.f2 = mf_ld_f16(p + 2);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        int v = mf_ld4(p + 4 + 4 * i);
        w.q[i] = v & 0x0F0F0F0F;
        w.q[4 + i] = (v >> 4) & 0x0F0F0F0F;
    }
}

template <> __device__ __forceinline__ void mf_wload<MF_Q5_0>(const u8 *row, int b, MfWBlk &w) {
    const u8 *p = row + (u64)b * 22;
    w.f1 = mf_ld_f16(p);
    u32 qh = (u32)mf_ld2(p + 2);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        int v = mf_ld2(p + 6 + 4 * i);
        w.q[i] = (v & 0x0F0F0F0F) | mf_spread4(qh >> (4 * i));
        w.q[4 + i] = ((v >> 4) & 0x0F0F0F0F) | mf_spread4(qh >> (16 + 4 * i));
    }
}

template <> __device__ __forceinline__ void mf_wload<MF_Q4_K>(const u8 *row, int b, MfWBlk &w) {
    const u8 *p = row + (u64)(b >> 3) * 144;
    int s = b & 7;
    float d = mf_ld_f16(p), dmin = mf_ld_f16(p + 2);
    const u8 *k = p + 4;
    int sc, mn;
    if (s < 4) {
        sc = k[s] & 63;
        mn = k[s + 4] & 63;
    } else {
        sc = (k[s + 4] & 15) | ((k[s - 4] >> 6) << 4);
        mn = (k[s + 4] >> 4) | ((k[s] >> 6) << 4);
    }
    w.f1 = __fmul_rn(d, (float)sc);
    w.f2 = __fmul_rn(dmin, (float)mn);
    const u8 *qs = p + 16 + 32 * (s >> 1);
    int sh = 4 * (s & 1);
#pragma unroll
    for (int i = 0; i < 8; ++i) w.q[i] = (mf_ld4(qs + 4 * i) >> sh) & 0x0F0F0F0F;
}

template <> __device__ __forceinline__ void mf_wload<MF_Q6_K>(const u8 *row, int b, MfWBlk &w) {
    const u8 *p = row + (u64)(b >> 3) * 210;
    int s = b & 7, h = s >> 2, j = s & 3;
    const u8 *ql = p + 64 * h + 32 * (j & 1);
    const u8 *qh = p + 128 + 32 * h;
    int shl = 4 * (j >> 1), shh = 2 * j;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        u32 v = (((u32)mf_ld2(ql + 4 * i) >> shl) & 0x0F0F0F0Fu) |
                ((((u32)mf_ld2(qh + 4 * i) >> shh) & 0x03030303u) << 4);
        // Bytes 0..63 minus 32 each, without borrows between bytes.
        w.q[i] = (int)(((v | 0x80808080u) - 0x20202020u) ^ 0x80808080u);
    }
    w.f1 = mf_ld_f16(p + 208);
    w.i1 = (int)(signed char)p[192 + 2 * s];
    w.i2 = (int)(signed char)p[193 + 2 * s];
}

// The weight block as the tensor-core tiles stage it: mf_wload's bytes and results, but a
// Q4_K block of a 16-byte-aligned row (every superblock is then 16-byte aligned: 144 = 9 x
// 16) comes in as one 4-byte load of d|dmin, three of the 12 scale bytes and two 16-byte
// loads of its quants: fewer memory requests for the staging threads (measured: 7B prefill
// +5%). The one-token kernels keep mf_wload (their lanes already read adjacent words; the
// wide loads measured 4.5% slower there).
template <int TY>
__device__ __forceinline__ void mf_wload_tile(const u8 *row, int b, MfWBlk &w) {
    const u8 *p = row + (u64)(b >> 3) * 144;
    if (TY != MF_Q4_K || ((u64)p & 15) != 0) {
        mf_wload<TY>(row, b, w);
        return;
    }
    int s = b & 7;
    int sh = 4 * (s & 1);
    const u8 *qs = p + 16 + 32 * (s >> 1);
    const u32 dd = *(const u32 *)p;
    const u32 kw[3] = {((const u32 *)p)[1], ((const u32 *)p)[2], ((const u32 *)p)[3]};
    // Scale byte i of the 12 at p + 4.
#define MF_K4(i) ((int)((kw[(i) >> 2] >> (8 * ((i) & 3))) & 0xffu))
    int sc, mn;
    if (s < 4) {
        sc = MF_K4(s) & 63;
        mn = MF_K4(s + 4) & 63;
    } else {
        sc = (MF_K4(s + 4) & 15) | ((MF_K4(s - 4) >> 6) << 4);
        mn = (MF_K4(s + 4) >> 4) | ((MF_K4(s) >> 6) << 4);
    }
#undef MF_K4
    w.f1 = __fmul_rn(mf_h2f((u16)(dd & 0xffffu)), (float)sc);
    w.f2 = __fmul_rn(mf_h2f((u16)(dd >> 16)), (float)mn);
    const uint4 a = ((const uint4 *)qs)[0], c = ((const uint4 *)qs)[1];
    const u32 q[8] = {a.x, a.y, a.z, a.w, c.x, c.y, c.z, c.w};
#pragma unroll
    for (int i = 0; i < 8; ++i) w.q[i] = (int)((q[i] >> sh) & 0x0F0F0F0Fu);
}

// c_b from the integer halves A (elements 0..15) and B (16..31) and the activation block's
// (d, d * sum q) = (dx, sx).
template <int TY>
__device__ __forceinline__ float mf_contrib(const MfWBlk &w, int a, int b, float dx, float sx) {
    switch (TY) {
    case MF_Q8_0:
        return __fmul_rn(__fmul_rn(w.f1, dx), (float)(a + b));
    case MF_Q4_0:
        return __fmul_rn(w.f1, __fsub_rn(__fmul_rn(dx, (float)(a + b)), __fmul_rn(8.0f, sx)));
    case MF_Q4_1:
        return __fadd_rn(__fmul_rn(__fmul_rn(w.f1, dx), (float)(a + b)), __fmul_rn(w.f2, sx));
    case MF_Q5_0:
        return __fmul_rn(w.f1, __fsub_rn(__fmul_rn(dx, (float)(a + b)), __fmul_rn(16.0f, sx)));
    case MF_Q4_K:
        return __fsub_rn(__fmul_rn(__fmul_rn(w.f1, dx), (float)(a + b)), __fmul_rn(w.f2, sx));
    default: // MF_Q6_K
        return __fmul_rn(__fmul_rn(w.f1, dx), (float)(w.i1 * a + w.i2 * b));
    }
}

// The canonical combination of the eight partials of the lanes r = threadIdx.x & 7.
__device__ __forceinline__ float mf_lane8_sum(float p) {
    p = __fadd_rn(p, __shfl_xor_sync(0xffffffffu, p, 4));
    p = __fadd_rn(p, __shfl_xor_sync(0xffffffffu, p, 2));
    p = __fadd_rn(p, __shfl_xor_sync(0xffffffffu, p, 1));
    return p;
}

// y[t][o] = sum_e w[o][e] x[t][e] (+ bias[o]) for rows of `ne0` (a multiple of 32) over the
// quantized activations (xq, xds). Grid: (ceil(n_out / 16), ceil(nt / 8)).
template <int TY>
__device__ void mf_mmvq(const u8 *w, u64 row_bytes, const signed char *xq, const float2 *xds,
                        float *y, const float *bias, int ne0, int n_out, int nt) {
    int r = threadIdx.x & 7;
    int o = blockIdx.x * MF_MV_ROWS + (threadIdx.x >> 3);
    int t0 = blockIdx.y * MF_MV_T;
    int kt = min(MF_MV_T, nt - t0);
    int nb = ne0 >> 5;
    bool live = o < n_out;
    const u8 *row = w + (u64)(live ? o : 0) * row_bytes;
    float acc[MF_MV_T];
#pragma unroll
    for (int k = 0; k < MF_MV_T; ++k) acc[k] = 0.0f;
#pragma unroll 2
    for (int b = r; b < nb; b += 8) {
        MfWBlk wb;
        mf_wload<TY>(row, b, wb);
#pragma unroll
        for (int k = 0; k < MF_MV_T; ++k) {
            if (k < kt) {
                u64 t = t0 + k;
                const int *xv = (const int *)(xq + t * ne0 + (u64)b * 32);
                int a = 0, c = 0;
#pragma unroll
                for (int i = 0; i < 4; ++i) a = mf_dp4a(wb.q[i], xv[i], a);
#pragma unroll
                for (int i = 0; i < 4; ++i) c = mf_dp4a(wb.q[4 + i], xv[4 + i], c);
                float2 ds = xds[t * nb + b];
                acc[k] = __fadd_rn(acc[k], mf_contrib<TY>(wb, a, c, ds.x, ds.y));
            }
        }
    }
    MF_PDL_TRIGGER();
#pragma unroll
    for (int k = 0; k < MF_MV_T; ++k) {
        if (k >= kt) break; // uniform over the block
        float s = mf_lane8_sum(acc[k]);
        if (r == 0 && live) {
            if (bias) s = __fadd_rn(s, bias[o]);
            y[(u64)(t0 + k) * n_out + o] = s;
        }
    }
}

// ---- one token (decode): a warp per output row over the activation row quantized once
// (mf_quantize_q8_1 or mf_quantize_q8: the same bits as mf_quantize_q8 + mf_mmvq).

// Output rows per block: a warp each, blockDim.x / 32 (the host picks 4 or 8).

// Ablation switches of the one-token walks (the host's `MINFER_CUDA_MV1_UNROLL=4`,
// `MINFER_CUDA_MV1_PREFETCH=1|2`; the bits never depend on them): the row loops' unroll, and
// which L2 prefetches run (0, the default: none; 1: a block's first rows before it waits for
// its input; 2: those and each next row while the warp computes one). Measured on the 7B
// (docs/PERFORMANCE.md, issue 27): unroll 4 and either prefetch are slower once the blocks
// walk their rows (a resident wave keeps enough loads in flight on its own).
#ifndef MF_MV1_UNROLL
#define MF_MV1_UNROLL 2
#endif
#ifndef MF_MV1_PREFETCH
#define MF_MV1_PREFETCH 0
#endif

// Asks L2 for a whole row (128-byte lines, a lane each, never past the row), so its weight
// blocks are on their way while the kernel waits for the one before it (mf_pdl_wait) and
// then quantizes x.
__device__ __forceinline__ void mf_prefetch_row(const u8 *row, u64 row_bytes) {
    for (u64 off = (u64)(threadIdx.x & 31) * 128; off < row_bytes; off += 32 * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(row + off));
}

// One 32-element block quantized by the 8 lanes sub = threadIdx.x & 7 of an aligned group
// (4 elements a lane: the max and the sum by shuffles inside the 8), with a `gain` first the
// RMSNorm of its row (`scale`: mf_rms_scale's) exactly as mf_rms_norm writes it: q[i] =
// round-half-even(x[i] / d) with d = max|x| / 127 (0 for an all-zero block), and
// (d, d * sum q). The only quantizer of int8 activations, so every path gets the same bits
// (the max is order-free once a NaN counts as 0, as fmaxf's chain from 0 treats it; the sum
// is an integer). Every lane of the warp calls it (the shuffles); a group whose block does
// not exist (!ok) writes nothing.
__device__ __forceinline__ void mf_q8_lanes8(const float *xb, const float *gb, float scale,
                                             bool ok, signed char *qb, float2 *dsb) {
    const int sub = threadIdx.x & 7;
    float4 v = ok ? ((const float4 *)xb)[sub] : make_float4(0, 0, 0, 0);
    if (gb && ok) {
        float4 g = ((const float4 *)gb)[sub];
        v = make_float4(mf_rms_apply(v.x, scale, g.x), mf_rms_apply(v.y, scale, g.y),
                        mf_rms_apply(v.z, scale, g.z), mf_rms_apply(v.w, scale, g.w));
    }
    float amax =
        fmaxf(fmaxf(fmaxf(fmaxf(0.0f, fabsf(v.x)), fabsf(v.y)), fabsf(v.z)), fabsf(v.w));
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    float d = __fdiv_rn(amax, 127.0f);
    float e[4] = {v.x, v.y, v.z, v.w};
    int sum = 0;
    u32 word = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        int qi = d > 0.0f ? __float2int_rn(__fdiv_rn(e[k], d)) : 0;
        sum += qi;
        word |= ((u32)qi & 0xffu) << (8 * k);
    }
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (ok) {
        ((int *)qb)[sub] = (int)word;
        if (sub == 0) *dsb = make_float2(d, __fmul_rn(d, (float)sum));
    }
}

// Quantizes x[0..ne0) into xq / xds with one block, a group of 8 lanes per 32-element block
// (mf_q8_lanes8). The loop runs the same number of rounds on every lane of a warp (shuffles
// need the whole warp). With a `gain`, x is first the row's RMSNorm.
__device__ __forceinline__ void mf_q8_shared(const float *x, int ne0, signed char *xq,
                                             float2 *xds, const float *gain, float eps) {
    float scale = gain ? mf_rms_scale(x, ne0, eps) : 1.0f;
    int slots = blockDim.x >> 3;
    int nb = ne0 >> 5;
    for (int b0 = (threadIdx.x >> 5) * 4; b0 < nb; b0 += slots) {
        int b = b0 + ((threadIdx.x & 31) >> 3);
        bool ok = b < nb;
        mf_q8_lanes8(x + (u64)b * 32, gain ? gain + (u64)b * 32 : nullptr, scale, ok,
                     xq + (u64)b * 32, xds + b);
    }
    __syncthreads();
}
