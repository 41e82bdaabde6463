// What the kernels that stage tiles in shared memory and multiply int8 on the tensor cores
// share: cp.async copies into shared memory, the int8 `mma` tiles, and the weight fragments of
// the generation-row tiles (mmvt.cu `mf_mmvt*`, mmvs.cu `mf_mmvs*`).

__device__ __forceinline__ u32 mf_smem_addr(const void *p) {
    u32 r;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p));
    return r;
}

__device__ __forceinline__ void mf_cp16(u32 dst, const void *src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void mf_cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

__device__ __forceinline__ void mf_cp_wait1() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }

// cp.async of 4 or 8 bytes (`bytes` of them read, the rest zero-filled).
template <int CP>
__device__ __forceinline__ void mf_cp_small(u32 dst, const void *src, int bytes) {
    if (CP == 8)
        asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(dst), "l"(src), "r"(bytes)
                     : "memory");
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(bytes)
                     : "memory");
}

// Waits until at most N of this thread's newest commit groups are in flight.
template <int N> __device__ __forceinline__ void mf_cp_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// The int8 m16n8 tiles: one m16n8k32 `mma` is a 16-row x 8-token tile of one 32-element
// block's exact integer dot products (Q6_K: two m16n8k16 over its halves).
__device__ __forceinline__ void mf_mma_k32(int (&c)[4], int a0, int a1, int a2, int a3, int b0,
                                           int b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mf_mma_k32(int (&c)[4], const int (&a)[4], int b0, int b1) {
    mf_mma_k32(c, a[0], a[1], a[2], a[3], b0, b1);
}

__device__ __forceinline__ void mf_mma_k16(int (&c)[4], int a0, int a1, int b0) {
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
        "{%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(b0));
}

// Words i and i + 4 of a weight block's int8 lanes (mf_wload's q[i] and q[i + 4]: elements
// 4i..4i+3 and 16+4i..16+4i+3, an m16n8k32 A fragment's two words of one row) and the block's
// scale terms, with mf_wload's arithmetic.
template <int TY>
__device__ __forceinline__ void mf_wfrag(const u8 *row, int b, int i, int &lo, int &hi,
                                         MfWBlk &w);

template <> __device__ __forceinline__ void mf_wfrag<MF_Q8_0>(const u8 *row, int b, int i,
                                                              int &lo, int &hi, MfWBlk &w) {
    const u8 *p = row + (u64)b * 34;
    w.f1 = mf_ld_f16(p);
    lo = mf_ld2(p + 2 + 4 * i);
    hi = mf_ld2(p + 18 + 4 * i);
}

template <> __device__ __forceinline__ void mf_wfrag<MF_Q4_0>(const u8 *row, int b, int i,
                                                              int &lo, int &hi, MfWBlk &w) {
    const u8 *p = row + (u64)b * 18;
    w.f1 = mf_ld_f16(p);
    const int v = mf_ld2(p + 2 + 4 * i);
    lo = v & 0x0F0F0F0F;
    hi = (v >> 4) & 0x0F0F0F0F;
}

template <> __device__ __forceinline__ void mf_wfrag<MF_Q4_1>(const u8 *row, int b, int i,
                                                              int &lo, int &hi, MfWBlk &w) {
    const u8 *p = row + (u64)b * 20;
    w.f1 = mf_ld_f16(p);
    w.f2 = mf_ld_f16(p + 2);
    const int v = mf_ld4(p + 4 + 4 * i);
    lo = v & 0x0F0F0F0F;
    hi = (v >> 4) & 0x0F0F0F0F;
}

template <> __device__ __forceinline__ void mf_wfrag<MF_Q5_0>(const u8 *row, int b, int i,
                                                              int &lo, int &hi, MfWBlk &w) {
    const u8 *p = row + (u64)b * 22;
    w.f1 = mf_ld_f16(p);
    const u32 qh = (u32)mf_ld2(p + 2);
    const int v = mf_ld2(p + 6 + 4 * i);
    lo = (v & 0x0F0F0F0F) | mf_spread4(qh >> (4 * i));
    hi = ((v >> 4) & 0x0F0F0F0F) | mf_spread4(qh >> (16 + 4 * i));
}

template <> __device__ __forceinline__ void mf_wfrag<MF_Q4_K>(const u8 *row, int b, int i,
                                                              int &lo, int &hi, MfWBlk &w) {
    const u8 *p = row + (u64)(b >> 3) * 144;
    const int s = b & 7;
    int sc, mn;
    float d, dmin;
    if (((u64)p & 15) == 0) { // the header in one 16-byte load (rows of a 16-byte-aligned base)
        const uint4 hd = *(const uint4 *)p;
        const u64 k03 = (u64)hd.y | ((u64)hd.z << 32);
#define MF_K4(j)                                                                                  \
    ((int)(((j) < 8 ? (u32)(k03 >> (8 * (j))) : hd.w >> (8 * ((j) - 8))) & 0xffu))
        if (s < 4) {
            sc = MF_K4(s) & 63;
            mn = MF_K4(s + 4) & 63;
        } else {
            sc = (MF_K4(s + 4) & 15) | ((MF_K4(s - 4) >> 6) << 4);
            mn = (MF_K4(s + 4) >> 4) | ((MF_K4(s) >> 6) << 4);
        }
#undef MF_K4
        d = mf_h2f((u16)(hd.x & 0xffffu));
        dmin = mf_h2f((u16)(hd.x >> 16));
    } else {
        const u8 *k = p + 4;
        if (s < 4) {
            sc = k[s] & 63;
            mn = k[s + 4] & 63;
        } else {
            sc = (k[s + 4] & 15) | ((k[s - 4] >> 6) << 4);
            mn = (k[s + 4] >> 4) | ((k[s] >> 6) << 4);
        }
        d = mf_ld_f16(p);
        dmin = mf_ld_f16(p + 2);
    }
    w.f1 = __fmul_rn(d, (float)sc);
    w.f2 = __fmul_rn(dmin, (float)mn);
    const u8 *qs = p + 16 + 32 * (s >> 1);
    const int sh = 4 * (s & 1);
    lo = (mf_ld4(qs + 4 * i) >> sh) & 0x0F0F0F0F;
    hi = (mf_ld4(qs + 16 + 4 * i) >> sh) & 0x0F0F0F0F;
}

template <> __device__ __forceinline__ void mf_wfrag<MF_Q6_K>(const u8 *row, int b, int i,
                                                              int &lo, int &hi, MfWBlk &w) {
    const u8 *p = row + (u64)(b >> 3) * 210;
    const int s = b & 7, h = s >> 2, j = s & 3;
    const u8 *ql = p + 64 * h + 32 * (j & 1);
    const u8 *qh = p + 128 + 32 * h;
    const int shl = 4 * (j >> 1), shh = 2 * j;
    u32 v[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        const int e = 4 * (i + 4 * k);
        const u32 x = (((u32)mf_ld2(ql + e) >> shl) & 0x0F0F0F0Fu) |
                      ((((u32)mf_ld2(qh + e) >> shh) & 0x03030303u) << 4);
        v[k] = ((x | 0x80808080u) - 0x20202020u) ^ 0x80808080u;
    }
    lo = (int)v[0];
    hi = (int)v[1];
    w.f1 = mf_ld_f16(p + 208);
    w.i1 = (int)(signed char)p[192 + 2 * s];
    w.i2 = (int)(signed char)p[193 + 2 * s];
}

#define MF_MVT_ROWS 16 // weight rows per m16 tile

// One block's m16n8 tile: the exact integer products of the weight fragment `a` (rows g and
// g + 8, two words each) and the token fragment (x0, x1) on `mma`, each through mf_contrib
// (scale terms `w` of the two rows, (d, d * sum q) `d0` / `d1` of tokens 2 q4 and 2 q4 + 1)
// into the tile's four running sums: acc[i] is row g + 8 (i >> 1), token 2 q4 + (i & 1).
template <int TY>
__device__ __forceinline__ void mf_mvt_block(float *acc, const int (&a)[4], const MfWBlk (&w)[2],
                                             int x0, int x1, float2 d0, float2 d1) {
    int ca[4] = {0, 0, 0, 0}, cb[4] = {0, 0, 0, 0};
    if (TY == MF_Q6_K) {
        mf_mma_k16(ca, a[0], a[1], x0);
        mf_mma_k16(cb, a[2], a[3], x1);
    } else {
        mf_mma_k32(ca, a[0], a[1], a[2], a[3], x0, x1);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 d = (i & 1) ? d1 : d0;
        acc[i] = __fadd_rn(acc[i], mf_contrib<TY>(w[i >> 1], ca[i], cb[i], d.x, d.y));
    }
}

// The tree's last addition (R_0 + R_1), the bias, and the store of output (t, o) if it exists.
__device__ __forceinline__ void mf_mvt_out(float r0, float r1, int o, int t, float *y,
                                           const float *bias, int n_out, int nt) {
    if (o < n_out && t < nt) {
        float v = __fadd_rn(r0, r1);
        if (bias) v = __fadd_rn(v, bias[o]);
        y[(u64)t * n_out + o] = v;
    }
}

// The canonical tree over the partials of 8 residue warps (warp r holding P_r of its NACC
// outputs in `acc`), level by level in shared memory `rg` (4 x 32 NACC floats; slot = the
// output's place in the lane's registers x 32 + lane, so the accesses never share a bank):
// Q_r = P_r + P_{r+4} (warps 0-3), R_r = Q_r + Q_{r+2} (warps 0-1), then warp 0 holds R_0 in
// `acc` and R_1 in rg[j * 32 + lane] for mf_mvt_out. Every thread of the block calls it.
template <int NACC>
__device__ __forceinline__ void mf_mvt_tree(float (&acc)[NACC], int r, int lane, float *rg) {
    constexpr int SZ = 32 * NACC;
    if (r >= 4) {
#pragma unroll
        for (int j = 0; j < NACC; ++j) rg[(r - 4) * SZ + j * 32 + lane] = acc[j];
    }
    __syncthreads();
    if (r < 4) {
#pragma unroll
        for (int j = 0; j < NACC; ++j) acc[j] = __fadd_rn(acc[j], rg[r * SZ + j * 32 + lane]);
    }
    __syncthreads();
    if (r == 2 || r == 3) {
#pragma unroll
        for (int j = 0; j < NACC; ++j) rg[(r - 2) * SZ + j * 32 + lane] = acc[j];
    }
    __syncthreads();
    if (r < 2) {
#pragma unroll
        for (int j = 0; j < NACC; ++j) acc[j] = __fadd_rn(acc[j], rg[r * SZ + j * 32 + lane]);
    }
    __syncthreads();
    if (r == 1) {
#pragma unroll
        for (int j = 0; j < NACC; ++j) rg[j * 32 + lane] = acc[j];
    }
    __syncthreads();
}
