// The one-token and multi-row generation kernels' row walks (mmvq.cu, fused.cu), over the
// int8 device functions of int8.cuh, and the pipelined one-token walks (MF_MV1_PIPE).

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

// A lane's bytes of one Q4_K superblock in the wide walks: lane l = 8 g + k of a warp reads
// superblock sb's 16-byte header (the 8 lanes of a superblock the same address: one
// broadcast) and its quant chunk k. Loaded apart from their use, so the pipelined walks
// (MF_MV1_PIPE) can keep several in flight.
struct MfQ4kRaw {
    uint4 hd, qv;
};

__device__ __forceinline__ void mf_q4k16_load(const u8 *row, int sb, int k, MfQ4kRaw &r) {
    const u8 *p = row + (u64)sb * 144;
    r.hd = *(const uint4 *)p;
    r.qv = *(const uint4 *)(p + 16 + 16 * k);
}

// Sub-block k's scale terms from the header: f1 = d * sc_k, f2 = dmin * mn_k.
__device__ __forceinline__ void mf_q4k16_scales(const uint4 hd, int k, MfWBlk &wb) {
    // Scale byte i of the 12 after d|dmin, selected without a lane-indexed array (which
    // would live in local memory).
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
    wb.f1 = __fmul_rn(mf_h2f((u16)(hd.x & 0xffffu)), (float)sc);
    wb.f2 = __fmul_rn(mf_h2f((u16)(hd.x >> 16)), (float)mn);
}

// One token's c_b for lane (g, k) of a loaded Q4_K chunk (x: the token's quantized row, ds:
// its block scales), the scale terms in wb. Chunk k holds elements 16 h .. 16 h + 15
// (h = k & 1) of sub-blocks 2 (k >> 1) (low nibbles) and 2 (k >> 1) + 1 (high nibbles); the
// two lanes of a pair add their integer halves (exact), after which lane k holds its own
// sub-block's whole dot product. Every lane of the warp calls it (the shuffles); lanes past
// the row's end (!ok) read nothing and give +0.
__device__ __forceinline__ float mf_q4k16_c(const uint4 qv, const MfWBlk &wb, bool ok, int sb,
                                            int k, const signed char *x, const float2 *ds) {
    const int h = k & 1;
    int lo = 0, hi = 0;
    float2 d = make_float2(0.0f, 0.0f);
    if (ok) {
        const u64 b0 = (u64)sb * 8 + (k & 6);
        const uint4 xa = *(const uint4 *)(x + b0 * 32 + 16 * h);
        const uint4 xb = *(const uint4 *)(x + (b0 + 1) * 32 + 16 * h);
        const u32 q[4] = {qv.x, qv.y, qv.z, qv.w};
        const int xl[4] = {(int)xa.x, (int)xa.y, (int)xa.z, (int)xa.w};
        const int xh[4] = {(int)xb.x, (int)xb.y, (int)xb.z, (int)xb.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            lo = mf_dp4a((int)(q[i] & 0x0F0F0F0Fu), xl[i], lo);
            hi = mf_dp4a((int)((q[i] >> 4) & 0x0F0F0F0Fu), xh[i], hi);
        }
        d = ds[(u64)sb * 8 + k];
    }
    lo += __shfl_xor_sync(0xffffffffu, lo, 1);
    hi += __shfl_xor_sync(0xffffffffu, hi, 1);
    return ok ? mf_contrib<MF_Q4_K>(wb, h ? hi : lo, 0, d.x, d.y) : 0.0f;
}

// A Q4_K row at a 16-byte-aligned address, the same bits as mf_rown<MF_Q4_K> with a
// quarter of its memory instructions: lane l = 8 g + k still owns block b = 32 j + l
// (superblock 4 j + g, sub-block k) and the partials chain exactly as there, but the lanes
// of a superblock load it as one header and eight contiguous 16-byte quant chunks
// (mf_q4k16_load). Each token's dot, shuffles and c_b are mf_q4k16_c's, written out here for
// NT tokens at once (every token's dots, then the shuffles: fewer registers than a call per
// token).
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
        float2 ds[NT];
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            lo[t] = 0;
            hi[t] = 0;
            ds[t] = make_float2(0.0f, 0.0f);
        }
        MfWBlk wb;
        wb.f1 = wb.f2 = 0.0f;
        if (ok) {
            MfQ4kRaw r;
            mf_q4k16_load(row, sb, k, r);
            const u64 b0 = (u64)sb * 8 + (k & 6);
            const u32 q[4] = {r.qv.x, r.qv.y, r.qv.z, r.qv.w};
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
            mf_q4k16_scales(r.hd, k, wb);
        }
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

// A lane's bytes of one Q6_K superblock in the wide walk (superblocks of 210 bytes are only
// 2-byte aligned): lane k = 4 h + q takes half h and elements 8 q .. 8 q + 7 of that half's
// four sub-blocks, 8 bytes of each of its two ql runs and of qh, each as the three aligned
// words around it (w, joined by mf_q6k8_quants: the three share one misalignment, sh bits),
// and the four sub-blocks' scale bytes and d (raw half).
struct MfQ6kRaw {
    u32 w[9];
    int sc[4];
    u32 sh;
    u16 d;
};

__device__ __forceinline__ void mf_q6k8_load(const u8 *row, int sb, int k, MfQ6kRaw &r) {
    const int h = k >> 2, q = k & 3;
    const u8 *p = row + (u64)sb * 210;
    const u8 *src[3] = {p + 64 * h + 8 * q, p + 64 * h + 32 + 8 * q, p + 128 + 32 * h + 8 * q};
#pragma unroll
    for (int j = 0; j < 3; ++j) {
        const u32 *a = (const u32 *)((u64)src[j] & ~(u64)3);
        r.w[3 * j] = a[0];
        r.w[3 * j + 1] = a[1];
        r.w[3 * j + 2] = a[2];
    }
    r.sh = 8 * (u32)((u64)p & 3);
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) r.sc[jj] = (int)(signed char)p[192 + 2 * (4 * h + jj) + (q >> 1)];
    r.d = *(const u16 *)(p + 208);
}

// One token's c_b for lane (g, k) of a loaded Q6_K chunk: each sub-block's integer dot
// product weighed by the scale of its 16-element half, the four lanes of the half adding
// their integers (exact), after which lane k holds sub-block k's i1 * a + i2 * b, the
// integer mf_contrib<MF_Q6_K> multiplies. wq: the lane's quants (mf_q6k8_quants). Every
// lane of the warp calls it; lanes past the row's end (!ok) read nothing and give +0.
__device__ __forceinline__ float mf_q6k8_c(const int (&wq)[4][2], const MfQ6kRaw &r, bool ok,
                                           int sb, int k, const signed char *x,
                                           const float2 *ds) {
    const int h = k >> 2, q = k & 3;
    int tt[4] = {0, 0, 0, 0};
    float2 d = make_float2(0.0f, 0.0f);
    if (ok) {
        const u64 b0 = (u64)sb * 8 + 4 * h;
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) {
            const uint2 xv = *(const uint2 *)(x + (b0 + jj) * 32 + 8 * q);
            int dot = mf_dp4a(wq[jj][0], (int)xv.x, 0);
            dot = mf_dp4a(wq[jj][1], (int)xv.y, dot);
            tt[jj] = dot * r.sc[jj];
        }
        d = ds[(u64)sb * 8 + k];
    }
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {
        tt[jj] += __shfl_xor_sync(0xffffffffu, tt[jj], 1);
        tt[jj] += __shfl_xor_sync(0xffffffffu, tt[jj], 2);
    }
    const int mine = q == 0 ? tt[0] : q == 1 ? tt[1] : q == 2 ? tt[2] : tt[3];
    MfWBlk wb;
    wb.f1 = ok ? mf_h2f(r.d) : 0.0f;
    wb.i1 = 1;
    wb.i2 = 0;
    return ok ? mf_contrib<MF_Q6_K>(wb, mine, 0, d.x, d.y) : 0.0f;
}

// The lane's quants of a loaded Q6_K chunk as int8 lanes: wq[jj] = elements 8 q .. 8 q + 7 of
// the half's sub-block jj (low 4 bits from ql, high 2 from qh, minus 32).
__device__ __forceinline__ void mf_q6k8_quants(const MfQ6kRaw &r, int (&wq)[4][2]) {
    u32 v8[3][2];
#pragma unroll
    for (int j = 0; j < 3; ++j) {
        v8[j][0] = __funnelshift_r(r.w[3 * j], r.w[3 * j + 1], r.sh);
        v8[j][1] = __funnelshift_r(r.w[3 * j + 1], r.w[3 * j + 2], r.sh);
    }
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const u32 lo = ((jj & 1) ? v8[1][i] : v8[0][i]) >> (4 * (jj >> 1));
            const u32 v = (lo & 0x0F0F0F0Fu) | (((v8[2][i] >> (2 * jj)) & 0x03030303u) << 4);
            wq[jj][i] = (int)(((v | 0x80808080u) - 0x20202020u) ^ 0x80808080u);
        }
    }
}

// A Q6_K row, the same bits as mf_rown<MF_Q6_K> with fewer memory instructions (mf_wload
// reads its 2-byte-aligned superblocks 2 bytes at a time). Lane l = 8 g + k still owns block
// b = 32 j + l (superblock 4 j + g, sub-block k) and the partials chain as there; the lanes
// of a superblock split its quants instead (mf_q6k8_load, mf_q6k8_quants). Each token's
// dots, shuffles and c_b are mf_q6k8_c's, written out here for NT tokens at once.
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
            MfQ6kRaw r;
            mf_q6k8_load(row, sb, k, r);
            const u64 b0 = (u64)sb * 8 + 4 * h;
            int wq[4][2];
            mf_q6k8_quants(r, wq);
            const int *sc = r.sc;
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
            d = mf_h2f(r.d);
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

// A warp's first row and the step to its next (W = blockDim.x / 32 rows a block at a time).
__device__ __forceinline__ int mf_mv1_first() {
    return blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
}
__device__ __forceinline__ int mf_mv1_step() { return gridDim.x * (blockDim.x >> 5); }

#define MF_MV1_ROWS(o, n_out) for (int o = mf_mv1_first(); o < (n_out); o += mf_mv1_step())

__device__ __forceinline__ int mf_mv1_next(int o, int n_out) {
    int n = o + mf_mv1_step();
    return n < n_out ? n : -1;
}

// The pipelined one-token walks (`MF_MV1_PIPE` stages, the host's `MINFER_CUDA_MV1_PIPE`; 0:
// the walks above). A warp's work is one sequence of chunks (a chunk: 4 superblocks of a row,
// one load a lane of each of M matrices), row after row of the warp's rows o, o + S, ...
// (S = gridDim.x * W), and the warp keeps the loads of the next MF_MV1_PIPE chunks in
// registers while it computes one: the next row's first chunks are on their way while a row
// ends, and the first ones are issued before the PDL wait (the weights are constants, only x
// comes from the kernel before). Each chunk's contribution and the chain are the wide walks'
// (mf_q4k16_c, mf_q6k8_c, mf_chain32, mf_lane8_sum), so a row's bits are the walks' above:
// only when its loads are issued changes. For Q4_K rows at 16-byte-aligned addresses and
// Q6_K rows at even ones (the wide walks' rows), every matrix of a launch of one type (`_p4`,
// `_p6`) or Q/K of Q4_K and V of Q6_K (`_p46`, one pipeline after the other): the host picks
// these kernels (matvec.rs `mv1_walk`), other rows take the walks above.
#ifndef MF_MV1_PIPE
#define MF_MV1_PIPE 1
#endif
#define MF_PIPE_D (MF_MV1_PIPE > 0 ? MF_MV1_PIPE : 1) // the stages a kernel is compiled with
// The stages of the kernels whose rows are short in the models measured (the Q/K/V and the
// one-token kernels with x quantized per block: a few chunks a row, a row or two a warp, so
// a row's chunks can all be in flight at once): `MINFER_CUDA_MV1_PIPE_SHORT`, else MF_PIPE_D.
#ifndef MF_MV1_PIPE_SHORT
#define MF_MV1_PIPE_SHORT MF_PIPE_D
#endif

// Blocks of 256 threads a multiprocessor the pipelined Q6_K kernels are compiled to fit
// (`__launch_bounds__(256, N)`, the host's `MINFER_CUDA_MV1_P6_BLOCKS`: registers capped at
// 65,536 / (256 N)); 0 leaves the compiler free (at one stage the matvec kernels hold 64
// registers, the Q/K/V ones 66-72, gate/up 106; at two stages 95-96 and 160).
#ifndef MF_MV1_P6_BLOCKS
#define MF_MV1_P6_BLOCKS 0
#endif
#if MF_MV1_P6_BLOCKS > 0
#define MF_P6_BOUNDS __launch_bounds__(256, MF_MV1_P6_BLOCKS)
#else
#define MF_P6_BOUNDS
#endif
#define MF_P4_BOUNDS

// Rows ahead of the one being walked that a warp of the pipelined walks asks L2 for
// (`MINFER_CUDA_MV1_PIPE_AHEAD`; 0: none): one `prefetch.global.L2` a lane per 128 bytes of each
// matrix's row, issued when the walk enters a row, so the chunk loads of the rows after it
// find their lines in L2 without holding registers for them. A hint only: no value changes.
#ifndef MF_MV1_PIPE_AHEAD
#define MF_MV1_PIPE_AHEAD 0
#endif

// Asks L2 for the `bytes` bytes at `p` (every 128-byte line they touch, rows at any even
// address included).
__device__ __forceinline__ void mf_prefetch_span(const u8 *p, int bytes) {
    const int lane = threadIdx.x & 31;
    const int lead = (int)((u64)p & 127);
    for (int off = lane * 128; off < lead + bytes; off += 32 * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p - lead + off));
}

template <int TY> struct MfSb;

template <> struct MfSb<MF_Q4_K> {
    typedef MfQ4kRaw Raw;
    static constexpr int BYTES = 144; // a superblock
    static __device__ __forceinline__ void load(const u8 *row, int sb, int k, Raw &r) {
        mf_q4k16_load(row, sb, k, r);
    }
    static __device__ __forceinline__ float c1(const Raw &r, bool ok, int sb, int k,
                                               const signed char *xq, const float2 *xds) {
        MfWBlk wb;
        wb.f1 = wb.f2 = 0.0f;
        if (ok) mf_q4k16_scales(r.hd, k, wb);
        return mf_q4k16_c(r.qv, wb, ok, sb, k, xq, xds);
    }
};

template <> struct MfSb<MF_Q6_K> {
    typedef MfQ6kRaw Raw;
    static constexpr int BYTES = 210; // a superblock
    static __device__ __forceinline__ void load(const u8 *row, int sb, int k, Raw &r) {
        mf_q6k8_load(row, sb, k, r);
    }
    static __device__ __forceinline__ float c1(const Raw &r, bool ok, int sb, int k,
                                               const signed char *xq, const float2 *xds) {
        int wq[4][2];
        if (ok) mf_q6k8_quants(r, wq);
        return mf_q6k8_c(wq, r, ok, sb, k, xq, xds);
    }
};

// A warp's pipeline: the loads of D chunks in flight and the cursor of the next to load.
template <int TY, int M, int D> struct MfPipe1 {
    typename MfSb<TY>::Raw st[D][M];
    int lo, lc;    // the next chunk to load: row, chunk of the row
    int nsb, nch;  // superblocks and chunks of a row
};

// Issues chunk c of row o of each of the M matrices (row_of(o, m): the row's first byte);
// nothing past the last row or the row's end.
template <int TY, int M, class RowOf>
__device__ __forceinline__ void mf_pipe1_load(const RowOf &row_of, int o, int c, int n_rows,
                                              int nsb, typename MfSb<TY>::Raw (&r)[M]) {
    const int lane = threadIdx.x & 31, sb = 4 * c + (lane >> 3);
    if (o < n_rows && sb < nsb) {
#pragma unroll
        for (int m = 0; m < M; ++m) MfSb<TY>::load(row_of(o, m), sb, lane & 7, r[m]);
    }
}

// Row o of each of the M matrices asked of L2 (MF_MV1_PIPE_AHEAD), if it exists.
template <int TY, int M, class RowOf>
__device__ __forceinline__ void mf_pipe1_ahead(const RowOf &row_of, int o, int n_rows, int nsb) {
    if (MF_MV1_PIPE_AHEAD > 0 && o < n_rows) {
#pragma unroll
        for (int m = 0; m < M; ++m) mf_prefetch_span(row_of(o, m), nsb * MfSb<TY>::BYTES);
    }
}

// The first D chunks' loads (call before the PDL wait), and the MF_MV1_PIPE_AHEAD rows after
// the warp's first asked of L2.
template <int TY, int M, int D, class RowOf>
__device__ __forceinline__ void mf_pipe1_prime(MfPipe1<TY, M, D> &p, const RowOf &row_of,
                                               int n_rows, int nb) {
    p.nsb = nb >> 3;
    p.nch = (p.nsb + 3) >> 2;
    p.lo = mf_mv1_first();
    p.lc = 0;
#pragma unroll
    for (int i = 0; i < D; ++i) {
        mf_pipe1_load<TY, M>(row_of, p.lo, p.lc, n_rows, p.nsb, p.st[i]);
        if (++p.lc == p.nch) {
            p.lc = 0;
            p.lo += mf_mv1_step();
        }
    }
#pragma unroll
    for (int a = 1; a <= MF_MV1_PIPE_AHEAD; ++a)
        mf_pipe1_ahead<TY, M>(row_of, mf_mv1_first() + a * mf_mv1_step(), n_rows, p.nsb);
}

// Every chunk of the warp's rows; at each row's end epi(o, r) with r[m] its value for
// matrix m on lane 0 (the canonical order's sum, before any bias).
template <int TY, int M, int D, class RowOf, class Epi>
__device__ __forceinline__ void mf_pipe1_run(MfPipe1<TY, M, D> &p, const RowOf &row_of,
                                             int n_rows, const signed char *xq,
                                             const float2 *xds, const Epi &epi) {
    const int lane = threadIdx.x & 31, g = lane >> 3, k = lane & 7;
    const int step = mf_mv1_step();
    float acc[M];
#pragma unroll
    for (int m = 0; m < M; ++m) acc[m] = 0.0f;
    int o = mf_mv1_first(), c = 0;
    while (o < n_rows) {
#pragma unroll
        for (int i = 0; i < D; ++i) {
            if (o >= n_rows) break;
            typename MfSb<TY>::Raw cur[M];
#pragma unroll
            for (int m = 0; m < M; ++m) cur[m] = p.st[i][m];
            mf_pipe1_load<TY, M>(row_of, p.lo, p.lc, n_rows, p.nsb, p.st[i]);
            if (++p.lc == p.nch) {
                p.lc = 0;
                p.lo += step;
            }
            const int sb = 4 * c + g;
#pragma unroll
            for (int m = 0; m < M; ++m)
                acc[m] = mf_chain32(acc[m], MfSb<TY>::c1(cur[m], sb < p.nsb, sb, k, xq, xds));
            if (++c == p.nch) {
                float r[M];
#pragma unroll
                for (int m = 0; m < M; ++m) {
                    r[m] = mf_lane8_sum(acc[m]);
                    acc[m] = 0.0f;
                }
                epi(o, r);
                c = 0;
                o += step;
                mf_pipe1_ahead<TY, M>(row_of, o + MF_MV1_PIPE_AHEAD * step, n_rows, p.nsb);
            }
        }
    }
}
