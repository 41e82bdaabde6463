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

// One 32-element block quantized by one thread: q[i] = round-half-even(x[i] / d) with
// d = max|x| / 127 (0 for an all-zero block), and (d, d * sum q). The only quantizer: every
// path gets the same bits. A thread per block keeps the reduction in registers (no
// shuffles), so a row's blocks are quantized in parallel.
__device__ __forceinline__ void mf_q8_block(const float *x, signed char *q, float2 *ds) {
    float v[32];
    const float4 *x4 = (const float4 *)x;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        float4 a = x4[i];
        v[4 * i] = a.x;
        v[4 * i + 1] = a.y;
        v[4 * i + 2] = a.z;
        v[4 * i + 3] = a.w;
    }
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 32; ++i) amax = fmaxf(amax, fabsf(v[i]));
    float d = __fdiv_rn(amax, 127.0f);
    int sum = 0;
    int *q4 = (int *)q;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        u32 word = 0;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            int qi = d > 0.0f ? __float2int_rn(__fdiv_rn(v[4 * i + k], d)) : 0;
            sum += qi;
            word |= ((u32)qi & 0xffu) << (8 * k);
        }
        q4[i] = (int)word;
    }
    *ds = make_float2(d, __fmul_rn(d, (float)sum));
}

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

// Quantizes x[0..ne0) into xq / xds with one block, 8 lanes per 32-element block (4 elements
// a lane: the max and the sum by shuffles inside the 8). The bits are mf_q8_block's: the max
// is order-free once a NaN counts as 0 (as fmaxf's chain from 0 treats it), the sum is an
// integer, and d, q and d * sum are the same rounded operations. The loop runs the same
// number of rounds on every lane of a warp (shuffles need the whole warp). With a `gain`,
// x is first the row's RMSNorm, exactly as mf_rms_norm writes it.
__device__ __forceinline__ void mf_q8_shared(const float *x, int ne0, signed char *xq,
                                             float2 *xds, const float *gain, float eps) {
    float scale = gain ? mf_rms_scale(x, ne0, eps) : 1.0f;
    int sub = threadIdx.x & 7;
    int slots = blockDim.x >> 3;
    int nb = ne0 >> 5;
    for (int b0 = (threadIdx.x >> 5) * 4; b0 < nb; b0 += slots) {
        int b = b0 + ((threadIdx.x & 31) >> 3);
        bool ok = b < nb;
        float4 v = ok ? ((const float4 *)(x + (u64)b * 32))[sub] : make_float4(0, 0, 0, 0);
        if (gain && ok) {
            float4 g = ((const float4 *)(gain + (u64)b * 32))[sub];
            v = make_float4(mf_rms_apply(v.x, scale, g.x), mf_rms_apply(v.y, scale, g.y),
                            mf_rms_apply(v.z, scale, g.z), mf_rms_apply(v.w, scale, g.w));
        }
        float amax = fmaxf(fmaxf(fmaxf(fmaxf(0.0f, fabsf(v.x)), fabsf(v.y)), fabsf(v.z)),
                           fabsf(v.w));
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
            ((int *)(xq + (u64)b * 32))[sub] = (int)word;
            if (sub == 0) xds[b] = make_float2(d, __fmul_rn(d, (float)sum));
        }
    }
    __syncthreads();
}

// The chain of one lane group's partial: lane r < 8 adds c of lanes r, r + 8, r + 16 and
// r + 24 (blocks 32 j + r, + 8, + 16, + 24: increasing b within residue r) to P_r.
__device__ __forceinline__ float mf_chain32(float acc, float c) {
    float c8 = __shfl_down_sync(0xffffffffu, c, 8);
    float c16 = __shfl_down_sync(0xffffffffu, c, 16);
    float c24 = __shfl_down_sync(0xffffffffu, c, 24);
    acc = __fadd_rn(acc, c);
    acc = __fadd_rn(acc, c8);
    acc = __fadd_rn(acc, c16);
    return __fadd_rn(acc, c24);
}

// The row walks below compute one weight row against NT activation rows at once (token t's
// quantized row at xq + t * 32 nb, its scales at xds + t * nb): the weight bytes are loaded
// once and each token's partials chain exactly as the one-token walk chains them, so token
// t's value is the same bits as mf_row1_any over that token alone. NT = 1 is the one-token
// kernels' walk (x in shared memory); NT > 1 the multi-row generation kernels' (x in global
// memory, quantized by mf_quantize_q8: the same bits as mf_q8_shared). Only the first nt <= NT
// tokens exist: slots past them read the last one's rows again (in bounds, results unused),
// so three kernels (NT = 2, 4, 8) serve every count. Lane 0 ends with res[t].

// The token slot t reads: itself, or the last of the nt that exist.
__device__ __forceinline__ u64 mf_tok(int t, int nt) { return (u64)min(t, nt - 1); }

// One row's dot product in the canonical order over a warp: lane l computes c_b for the
// blocks b = 32 j + l (+0 past the row's end, which leaves a partial that is never -0 as
// it is), and lane r < 8 chains P_r through the four blocks of residue r in each group of
// 32 in increasing b.
template <int TY, int NT>
__device__ __forceinline__ void mf_rown(const u8 *row, const signed char *xq, const float2 *xds,
                                        int nb, int nt, float *res) {
    int lane = threadIdx.x & 31;
    const u64 xs = (u64)nb * 32;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[t] = 0.0f;
#if MF_MV1_UNROLL == 4
#pragma unroll 4
#else
#pragma unroll 2
#endif
    for (int b0 = 0; b0 < nb; b0 += 32) {
        int b = b0 + lane;
        float c[NT];
#pragma unroll
        for (int t = 0; t < NT; ++t) c[t] = 0.0f;
        if (b < nb) {
            MfWBlk wb;
            mf_wload<TY>(row, b, wb);
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                const int *xv = (const int *)(xq + mf_tok(t, nt) * xs + (u64)b * 32);
                int a = 0, e = 0;
#pragma unroll
                for (int i = 0; i < 4; ++i) a = mf_dp4a(wb.q[i], xv[i], a);
#pragma unroll
                for (int i = 0; i < 4; ++i) e = mf_dp4a(wb.q[4 + i], xv[4 + i], e);
                float2 ds = xds[mf_tok(t, nt) * (u64)nb + b];
                c[t] = mf_contrib<TY>(wb, a, e, ds.x, ds.y);
            }
        }
#pragma unroll
        for (int t = 0; t < NT; ++t) acc[t] = mf_chain32(acc[t], c[t]);
    }
#pragma unroll
    for (int t = 0; t < NT; ++t) res[t] = mf_lane8_sum(acc[t]);
}

// A Q4_K row at a 16-byte-aligned address, the same bits as mf_rown<MF_Q4_K> with a
// quarter of its memory instructions: lane l = 8 g + k still owns block b = 32 j + l
// (superblock 4 j + g, sub-block k) and the partials chain exactly as there, but the lanes
// of a superblock load it as one 16-byte header (broadcast) and eight contiguous 16-byte
// quant chunks. Chunk k holds elements 16 h .. 16 h + 15 (h = k & 1) of sub-blocks 2 (k >> 1)
// (low nibbles) and 2 (k >> 1) + 1 (high nibbles); the two lanes of a pair add their
// integer halves (exact), after which lane k holds its own sub-block's whole dot product.
template <int NT>
__device__ __forceinline__ void mf_rown_q4k16(const u8 *row, const signed char *xq,
                                              const float2 *xds, int nb, int nt, float *res) {
    const int lane = threadIdx.x & 31, g = lane >> 3, k = lane & 7, h = k & 1;
    const int nsb = nb >> 3;
    const u64 xs = (u64)nb * 32;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[t] = 0.0f;
#if MF_MV1_UNROLL == 4
#pragma unroll 4
#else
#pragma unroll 2
#endif
    for (int s0 = 0; s0 < nsb; s0 += 4) {
        const int sb = s0 + g;
        const bool ok = sb < nsb;
        int lo[NT], hi[NT];
        float f1 = 0.0f, f2 = 0.0f;
        float2 ds[NT];
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            lo[t] = 0;
            hi[t] = 0;
            ds[t] = make_float2(0.0f, 0.0f);
        }
        if (ok) {
            const u8 *p = row + (u64)sb * 144;
            const uint4 hd = *(const uint4 *)p;
            const uint4 qv = *(const uint4 *)(p + 16 + 16 * k);
            const u64 b0 = (u64)sb * 8 + (k & 6);
            const u32 q[4] = {qv.x, qv.y, qv.z, qv.w};
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                const uint4 xa = *(const uint4 *)(xq + mf_tok(t, nt) * xs + b0 * 32 + 16 * h);
                const uint4 xb = *(const uint4 *)(xq + mf_tok(t, nt) * xs + (b0 + 1) * 32 + 16 * h);
                const int xl[4] = {(int)xa.x, (int)xa.y, (int)xa.z, (int)xa.w};
                const int xh[4] = {(int)xb.x, (int)xb.y, (int)xb.z, (int)xb.w};
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    lo[t] = mf_dp4a((int)(q[i] & 0x0F0F0F0Fu), xl[i], lo[t]);
                    hi[t] = mf_dp4a((int)((q[i] >> 4) & 0x0F0F0F0Fu), xh[i], hi[t]);
                }
                ds[t] = xds[mf_tok(t, nt) * (u64)nb + (u64)sb * 8 + k];
            }
            // Scale byte i of the 12 after d|dmin, selected without a lane-indexed array
            // (which would live in local memory).
            const u64 k03 = (u64)hd.y | ((u64)hd.z << 32);
#define MF_K4(i)                                                                                  \
    ((int)(((i) < 8 ? (u32)(k03 >> (8 * (i))) : hd.w >> (8 * ((i) - 8))) & 0xffu))
            int sc, mn;
            if (k < 4) {
                sc = MF_K4(k) & 63;
                mn = MF_K4(k + 4) & 63;
            } else {
                sc = (MF_K4(k + 4) & 15) | ((MF_K4(k - 4) >> 6) << 4);
                mn = (MF_K4(k + 4) >> 4) | ((MF_K4(k) >> 6) << 4);
            }
#undef MF_K4
            f1 = __fmul_rn(mf_h2f((u16)(hd.x & 0xffffu)), (float)sc);
            f2 = __fmul_rn(mf_h2f((u16)(hd.x >> 16)), (float)mn);
        }
        MfWBlk wb;
        wb.f1 = f1;
        wb.f2 = f2;
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            lo[t] += __shfl_xor_sync(0xffffffffu, lo[t], 1);
            hi[t] += __shfl_xor_sync(0xffffffffu, hi[t], 1);
            const float c =
                ok ? mf_contrib<MF_Q4_K>(wb, h ? hi[t] : lo[t], 0, ds[t].x, ds[t].y) : 0.0f;
            acc[t] = mf_chain32(acc[t], c);
        }
    }
#pragma unroll
    for (int t = 0; t < NT; ++t) res[t] = mf_lane8_sum(acc[t]);
}

// 8 bytes at any address p as two words, from the three aligned words around them (reads
// at most 3 bytes before p and 4 past p + 8; callers keep those inside the block).
__device__ __forceinline__ uint2 mf_ld8_any(const u8 *p) {
    const u32 *a = (const u32 *)((u64)p & ~(u64)3);
    const u32 sh = 8 * (u32)((u64)p & 3);
    const u32 w0 = a[0], w1 = a[1], w2 = a[2];
    return make_uint2(__funnelshift_r(w0, w1, sh), __funnelshift_r(w1, w2, sh));
}

// A Q6_K row, the same bits as mf_rown<MF_Q6_K> with fewer memory instructions (its
// superblocks of 210 bytes are only 2-byte aligned, so mf_wload reads 2 bytes at a time).
// Lane l = 8 g + k still owns block b = 32 j + l (superblock 4 j + g, sub-block k) and the
// partials chain as there. The lanes of a superblock split its quants instead of each reading
// its own sub-block's: lane k takes half h = k >> 2 and elements 8 q .. 8 q + 7 (q = k & 3) of
// that half's four sub-blocks (8 bytes of each ql run and 8 of qh), weighs each sub-block's
// integer dot product by the scale of its 16-element half, and the four lanes of the half
// add their integers (exact): lane k then holds sub-block k's i1 * a + i2 * b, the integer
// mf_contrib<MF_Q6_K> multiplies.
template <int NT>
__device__ __forceinline__ void mf_rown_q6k8(const u8 *row, const signed char *xq,
                                             const float2 *xds, int nb, int nt, float *res) {
    const int lane = threadIdx.x & 31, g = lane >> 3, k = lane & 7, h = k >> 2, q = k & 3;
    const int nsb = nb >> 3;
    const u64 xs = (u64)nb * 32;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[t] = 0.0f;
#if MF_MV1_UNROLL == 4
#pragma unroll 4
#else
#pragma unroll 2
#endif
    for (int s0 = 0; s0 < nsb; s0 += 4) {
        const int sb = s0 + g;
        const bool ok = sb < nsb;
        int tt[NT][4];
        float d = 0.0f;
        float2 ds[NT];
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            tt[t][0] = tt[t][1] = tt[t][2] = tt[t][3] = 0;
            ds[t] = make_float2(0.0f, 0.0f);
        }
        if (ok) {
            const u8 *p = row + (u64)sb * 210;
            const uint2 l0 = mf_ld8_any(p + 64 * h + 8 * q);
            const uint2 l1 = mf_ld8_any(p + 64 * h + 32 + 8 * q);
            const uint2 hq = mf_ld8_any(p + 128 + 32 * h + 8 * q);
            const u32 lw0[2] = {l0.x, l0.y}, lw1[2] = {l1.x, l1.y}, hw[2] = {hq.x, hq.y};
            const u64 b0 = (u64)sb * 8 + 4 * h;
            int wq[4][2];
            int sc[4];
#pragma unroll
            for (int jj = 0; jj < 4; ++jj) {
#pragma unroll
                for (int i = 0; i < 2; ++i) {
                    const u32 lo = ((jj & 1) ? lw1[i] : lw0[i]) >> (4 * (jj >> 1));
                    const u32 v = (lo & 0x0F0F0F0Fu) | (((hw[i] >> (2 * jj)) & 0x03030303u) << 4);
                    wq[jj][i] = (int)(((v | 0x80808080u) - 0x20202020u) ^ 0x80808080u);
                }
                sc[jj] = (int)(signed char)p[192 + 2 * (4 * h + jj) + (q >> 1)];
            }
#pragma unroll
            for (int t = 0; t < NT; ++t) {
#pragma unroll
                for (int jj = 0; jj < 4; ++jj) {
                    const uint2 xv = *(const uint2 *)(xq + mf_tok(t, nt) * xs + (b0 + jj) * 32 + 8 * q);
                    int dot = mf_dp4a(wq[jj][0], (int)xv.x, 0);
                    dot = mf_dp4a(wq[jj][1], (int)xv.y, dot);
                    tt[t][jj] = dot * sc[jj];
                }
                ds[t] = xds[mf_tok(t, nt) * (u64)nb + (u64)sb * 8 + k];
            }
            d = mf_ld_f16(p + 208);
        }
        MfWBlk wb;
        wb.f1 = d;
        wb.i1 = 1;
        wb.i2 = 0;
#pragma unroll
        for (int t = 0; t < NT; ++t) {
#pragma unroll
            for (int jj = 0; jj < 4; ++jj) {
                tt[t][jj] += __shfl_xor_sync(0xffffffffu, tt[t][jj], 1);
                tt[t][jj] += __shfl_xor_sync(0xffffffffu, tt[t][jj], 2);
            }
            const int mine = q == 0 ? tt[t][0] : q == 1 ? tt[t][1] : q == 2 ? tt[t][2] : tt[t][3];
            const float c = ok ? mf_contrib<MF_Q6_K>(wb, mine, 0, ds[t].x, ds[t].y) : 0.0f;
            acc[t] = mf_chain32(acc[t], c);
        }
    }
#pragma unroll
    for (int t = 0; t < NT; ++t) res[t] = mf_lane8_sum(acc[t]);
}

// `MF_MV1_NARROW_Q4K` / `MF_MV1_NARROW_Q6K` (the host's `MINFER_CUDA_MV1=narrow`,
// `narrow-q4k`, `narrow-q6k`) keep those rows on mf_rown: the switches that measure the wide
// walks against the narrow one (the same bits either way).
#ifndef MF_MV1_NARROW_Q4K
#define MF_MV1_NARROW_Q4K 0
#endif
#ifndef MF_MV1_NARROW_Q6K
#define MF_MV1_NARROW_Q6K 0
#endif

template <int NT>
__device__ __forceinline__ void mf_rown_any(int ty, const u8 *row, const signed char *xq,
                                            const float2 *xds, int nb, int nt, float *res) {
    if (ty == MF_Q4_K && !MF_MV1_NARROW_Q4K && ((u64)row & 15) == 0)
        return mf_rown_q4k16<NT>(row, xq, xds, nb, nt, res);
    if (ty == MF_Q6_K && !MF_MV1_NARROW_Q6K && ((u64)row & 1) == 0)
        return mf_rown_q6k8<NT>(row, xq, xds, nb, nt, res);
    switch (ty) {
    case MF_Q8_0: return mf_rown<MF_Q8_0, NT>(row, xq, xds, nb, nt, res);
    case MF_Q4_0: return mf_rown<MF_Q4_0, NT>(row, xq, xds, nb, nt, res);
    case MF_Q4_1: return mf_rown<MF_Q4_1, NT>(row, xq, xds, nb, nt, res);
    case MF_Q5_0: return mf_rown<MF_Q5_0, NT>(row, xq, xds, nb, nt, res);
    case MF_Q4_K: return mf_rown<MF_Q4_K, NT>(row, xq, xds, nb, nt, res);
    default: return mf_rown<MF_Q6_K, NT>(row, xq, xds, nb, nt, res);
    }
}

// One token's row (lane 0 returns it): the one-token kernels' walk.
__device__ __forceinline__ float mf_row1_any(int ty, const u8 *row, const signed char *xq,
                                             const float2 *xds, int nb) {
    float r[1];
    mf_rown_any<1>(ty, row, xq, xds, nb, 1, r);
    return r[0];
}

// The one-token kernels (mf_mmvq1, mf_gate_up1, mf_qkv1) walk rows o = blockIdx.x * W + warp,
// + gridDim.x * W, ... (W = blockDim.x / 32, a row per warp at a time) over x quantized once
// before them. The host launches one resident wave of blocks (`MINFER_CUDA_MV1_GRID=rows`: a
// block per W rows instead), so the grid never ends in a partial wave. A row's bits do
// not depend on the grid: each row is one warp's mf_row1_any. While a warp computes row o,
// L2 is asked for its next one.
// Where a one-token kernel's quantized x comes from (the template flag GX of each: the host
// picks by the row's length, `MINFER_CUDA_MV1_X`). GX: quantized once before the kernel
// (mf_quantize_q8_1 / mf_quantize_q8) and read from global memory; otherwise each block
// quantizes x (its RMSNorm with a gain) into its own shared memory after the PDL wait. The
// first costs a launch, the second a prologue of the whole row per block before its first
// weight load: measured, a long row (the 7B's 18,944-value down projection) wants the first,
// a short one (the 0.5B's 896) the second. The same bits either way (mf_q8_shared's).
// Sets xq / xds for the row walk.
#define MF_MV1_X(GX, x, gain, eps, gxq, gxds, ne0, xq, xds)                                      \
    extern __shared__ float2 smem[];                                                             \
    const signed char *xq;                                                                       \
    const float2 *xds;                                                                           \
    if (GX) {                                                                                    \
        xq = (gxq);                                                                              \
        xds = (gxds);                                                                            \
    } else {                                                                                     \
        signed char *sq = (signed char *)(smem + ((ne0) >> 5));                                  \
        mf_q8_shared((x), (ne0), sq, smem, (gain), (eps));                                       \
        xq = sq;                                                                                 \
        xds = smem;                                                                              \
    }

#define MF_MV1_ROWS(o, n_out)                                                                     \
    for (int o = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); o < (n_out);              \
         o += gridDim.x * (blockDim.x >> 5))

__device__ __forceinline__ int mf_mv1_next(int o, int n_out) {
    int n = o + gridDim.x * (blockDim.x >> 5);
    return n < n_out ? n : -1;
}
