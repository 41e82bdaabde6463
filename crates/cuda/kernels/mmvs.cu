// ---- generation rows on tensor cores with staged tiles (`mf_mmvs*`, issues 29 and 31): the
// order of `mf_mmvt` (mmvt.cu; warp r walks the blocks of residue r in increasing order and
// the eight partials meet in the canonical tree of int8.cuh), with the weights and the
// activations brought into shared memory by cp.async, one chunk of 8 consecutive blocks at a
// time (a K-quant superblock), two chunks in flight. A chunk's weight rows are contiguous bytes,
// so the copies are 16-byte (Q6_K's 210-byte superblocks: 4-byte; matvec.rs sends a matrix
// whose base or rows are not aligned to the copy unit to the other kernels) and every byte is
// read once; each staged token
// chunk feeds all the block's rows, so a block of 32 or 64 rows reads the activations once
// where `mf_mmvt` read them per 16 rows (ncu on the H100: its warps waited on L1TEX loads 73 %
// of their stall cycles, and L1/L2 ran at 77 % of their throughput with DRAM at 4 %).
// Every row's bits are mf_mmvq1's for that token alone, whatever the row count, tile or
// alignment: the same fragments (mf_wfrag, read from the staged copy), the same mma, the same
// per-block contributions in the same order, the same tree.

// Bytes of a chunk of one weight row (8 blocks) and of its staged row (padded so that the
// fragment loads of 8 rows x 4 lanes fall on distinct banks, and, for Q6_K, large enough for
// the 2 bytes a 4-byte copy starts before an odd superblock).
__host__ __device__ constexpr int mf_mvs_chunk(int ty) {
    return ty == MF_Q8_0 ? 272
           : ty == MF_Q4_0 ? 144
           : ty == MF_Q4_1 ? 160
           : ty == MF_Q5_0 ? 176
           : ty == MF_Q4_K ? 144
                           : 210;
}
__host__ __device__ constexpr int mf_mvs_ws(int ty) {
    return ty == MF_Q8_0 ? 272
           : ty == MF_Q4_0 ? 144
           : ty == MF_Q4_1 ? 176
           : ty == MF_Q5_0 ? 176
           : ty == MF_Q4_K ? 144
                           : 240;
}
// A staged token: its chunk's 256 int8 values (stride 272: conflict-free fragment loads),
// then 8 (d, d * sum q) pairs.
#define MF_MVS_XS 272
#define MF_MVS_TOK (MF_MVS_XS + 64)
// Bytes of one stage (32 GR rows, 8 NT tokens), and whether two stages fit the 48 KiB a
// block may take (crates/cuda/src/matvec.rs `mvs_fits` mirrors it).
__host__ __device__ constexpr int mf_mvs_stage(int ty, int nt, int gr) {
    return 32 * gr * mf_mvs_ws(ty) + 8 * nt * MF_MVS_TOK;
}
__host__ __device__ constexpr bool mf_mvs_fits(int ty, int nt, int gr) {
    return 2 * mf_mvs_stage(ty, nt, gr) <= 48 * 1024;
}
__host__ __device__ constexpr int mf_mvs_max(int a, int b) { return a > b ? a : b; }

// The copy unit of a type's weights: 16 bytes, 4 for Q6_K (210-byte superblocks).
__host__ __device__ constexpr int mf_mvs_unit(int ty) { return ty == MF_Q6_K ? 4 : 16; }

// Chunk c of the block's 32 GR weight rows (rows past n_out repeat the last) into stage `sw`:
// each row's bytes from c's first byte (rounded down to the copy unit: `off` bytes before it)
// for a whole chunk, in units; a unit past the matrix's end `wend` is cut there (zero-filled).
// A short last chunk of a legacy type copies the next row's first bytes (unused).
template <int TY, int GR>
__device__ __forceinline__ void mf_mvs_load_w(u8 *sw, const u8 *w, u64 row_bytes, int o0,
                                              int n_out, const u8 *wend, int c, int off) {
    constexpr int R = 32 * GR, WS = mf_mvs_ws(TY), A = mf_mvs_unit(TY);
    // Units of a row's chunk: 16-byte types start on a unit (off 0); Q6_K's odd superblocks
    // start 2 bytes into one, so 53 words cover either (212 bytes, within its 240-byte row).
    constexpr int UNITS = A == 16 ? (mf_mvs_chunk(TY) + 15) / 16 : (mf_mvs_chunk(TY) + 2 + 3) / 4;
    static_assert(UNITS * A <= WS, "a staged row holds its chunk's units");
    const u64 cstart = (u64)c * mf_mvs_chunk(TY) - off;
#pragma unroll 2
    for (int k = threadIdx.x; k < R * UNITS; k += 256 * GR) {
        const int row = k / UNITS, u = k - row * UNITS;
        const u8 *src = w + (u64)min(o0 + row, n_out - 1) * row_bytes + cstart + (u64)u * A;
        const long long left = wend - src;
        const int bytes = left >= A ? A : (left > 0 ? (int)left : 0);
        const u32 dst = mf_smem_addr(sw + row * WS + u * A);
        if (A == 16)
            mf_cp16(dst, bytes ? src : w, bytes);
        else
            mf_cp_small<4>(dst, bytes ? src : w, bytes);
    }
}

// Chunk c of the block's 8 NT tokens (tokens past nt repeat the last): the int8 values in
// 16-byte units, the (d, d * sum q) pairs in 8-byte ones; units past the row's `nblk` blocks
// zero-filled.
template <int NT, int GR>
__device__ __forceinline__ void mf_mvs_load_x(u8 *sx, const signed char *xq, const float2 *xds,
                                              int ne0, int t0, int nt, int c, int nblk) {
    const int nb = ne0 >> 5;
#pragma unroll 2
    for (int k = threadIdx.x; k < 8 * NT * 24; k += 256 * GR) {
        const int j = k / 24, u = k - j * 24;
        const u64 t = mf_tok(t0 + j, nt);
        if (u < 16) {
            const bool in = u < 2 * nblk;
            mf_cp16(mf_smem_addr(sx + j * MF_MVS_XS + u * 16),
                    xq + t * (u64)ne0 + (u64)c * 256 + (in ? (u64)u * 16 : 0), in ? 16 : 0);
        } else {
            const int e = u - 16;
            const bool in = e < nblk;
            mf_cp_small<8>(mf_smem_addr(sx + 8 * NT * MF_MVS_XS + j * 64 + e * 8),
                           xds + t * (u64)nb + (u64)c * 8 + (in ? e : 0), in ? 8 : 0);
        }
    }
}

// A weight fragment from a staged row (16-byte aligned in shared memory for every type but
// Q6_K): mf_wfrag's values, Q4_K's header always in one 16-byte load.
template <int TY>
__device__ __forceinline__ void mf_mvs_frag(const u8 *row, int s, int i, int &lo, int &hi,
                                            MfWBlk &w) {
    if (TY == MF_Q4_K) {
        const uint4 hd = *(const uint4 *)row;
        const u32 k[3] = {hd.y, hd.z, hd.w};
        int sc, mn;
        if (s < 4) {
            sc = (k[0] >> (8 * s)) & 63;
            mn = (k[1] >> (8 * s)) & 63;
        } else {
            const int j = s - 4;
            sc = ((k[2] >> (8 * j)) & 15) | (((k[0] >> (8 * j + 6)) & 3) << 4);
            mn = ((k[2] >> (8 * j + 4)) & 15) | (((k[1] >> (8 * j + 6)) & 3) << 4);
        }
        w.f1 = __fmul_rn(mf_h2f((u16)(hd.x & 0xffffu)), (float)sc);
        w.f2 = __fmul_rn(mf_h2f((u16)(hd.x >> 16)), (float)mn);
        const u8 *qs = row + 16 + 32 * (s >> 1);
        const int sh = 4 * (s & 1);
        lo = (mf_ld4(qs + 4 * i) >> sh) & 0x0F0F0F0F;
        hi = (mf_ld4(qs + 16 + 4 * i) >> sh) & 0x0F0F0F0F;
    } else {
        mf_wfrag<TY>(row, s, i, lo, hi, w);
    }
}

// y[t][o] = w[o] . x[t] (+ bias[o]) for the 32 GR rows from blockIdx.y * 32 GR and the 8 NT
// tokens from blockIdx.x * 8 NT (of nt), x quantized by mf_quantize_q8. Warp (r, gr) of the
// block's 8 GR takes residue r of rows 32 gr .. 32 gr + 31 (two m16 tiles) for every token.
template <int TY, int NT, int GR>
__device__ __forceinline__ void mf_mmvs(const u8 *w, u64 row_bytes, const signed char *xq,
                                        const float2 *xds, float *y, const float *bias, int ne0,
                                        int n_out, int nt, u8 *sm) {
    constexpr int R = 32 * GR, WS = mf_mvs_ws(TY), NACC = 2 * NT * 4, A = mf_mvs_unit(TY);
    constexpr int SB = mf_mvs_stage(TY, NT, GR);
    const int lane = threadIdx.x & 31, r = (threadIdx.x >> 5) & 7, gr = threadIdx.x >> 8;
    const int g = lane >> 2, q4 = lane & 3;
    const int o0 = blockIdx.y * R, t0 = blockIdx.x * 8 * NT;
    const int nb = ne0 >> 5, nch = (nb + 7) >> 3;
    const u8 *wend = w + (u64)n_out * row_bytes;
    // The copy unit's offset of chunk c's first byte (the same in every row: row_bytes is a
    // multiple of the unit; 0 but for Q6_K's odd superblocks, and 0 by the host's routing for
    // the 16-byte types, whose bases are 16-byte aligned).
#define MF_MVS_OFF(c)                                                                             \
    (A == 16 ? 0 : (int)(((u64)w + (u64)(c) * mf_mvs_chunk(TY)) & (u64)(A - 1)))
    float acc[NACC]; // output (m, n, i) at (m NT + n) 4 + i
#pragma unroll
    for (int j = 0; j < NACC; ++j) acc[j] = 0.0f;
    // The first chunk's weights before the wait on the kernel before (they are constant), its
    // activations after.
    mf_mvs_load_w<TY, GR>(sm, w, row_bytes, o0, n_out, wend, 0, MF_MVS_OFF(0));
    MF_PDL_ENTRY();
    mf_mvs_load_x<NT, GR>(sm + R * WS, xq, xds, ne0, t0, nt, 0, min(8, nb));
    mf_cp_commit();
    for (int c = 0; c < nch; ++c) {
        u8 *st = sm + (c & 1) * SB;
        if (c + 1 < nch) {
            u8 *nx = sm + ((c + 1) & 1) * SB;
            mf_mvs_load_w<TY, GR>(nx, w, row_bytes, o0, n_out, wend, c + 1, MF_MVS_OFF(c + 1));
            mf_mvs_load_x<NT, GR>(nx + R * WS, xq, xds, ne0, t0, nt, c + 1,
                                  min(8, nb - 8 * (c + 1)));
            mf_cp_commit();
            mf_cp_wait1();
        } else {
            mf_cp_wait0();
        }
        __syncthreads();
        if (r < nb - 8 * c) { // block 8 c + r of the row: residue r's next
            const int off = MF_MVS_OFF(c);
            int fa[2][4];
            MfWBlk fw[2][2];
#pragma unroll
            for (int m = 0; m < 2; ++m)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    fw[m][h].f2 = 0.0f;
                    fw[m][h].i1 = fw[m][h].i2 = 0;
                    const u8 *row = st + (32 * gr + 16 * m + 8 * h + g) * WS;
                    // Sub-block r of a K-quant superblock, block r of a legacy chunk (off 0).
                    mf_mvs_frag<TY>(row + off, r, q4, fa[m][h], fa[m][2 + h], fw[m][h]);
                }
            const u8 *sx = st + R * WS;
            const float2 *sd = (const float2 *)(sx + 8 * NT * MF_MVS_XS);
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                const int *xv = (const int *)(sx + (8 * n + g) * MF_MVS_XS + r * 32);
                const int x0 = xv[q4], x1 = xv[q4 + 4];
                const float2 d0 = sd[(8 * n + 2 * q4) * 8 + r];
                const float2 d1 = sd[(8 * n + 2 * q4 + 1) * 8 + r];
#pragma unroll
                for (int m = 0; m < 2; ++m)
                    mf_mvt_block<TY>(acc + (m * NT + n) * 4, fa[m], fw[m], x0, x1, d0, d1);
            }
        }
        __syncthreads(); // the stage is read before the copy two chunks on refills it
    }
#undef MF_MVS_OFF
    MF_PDL_TRIGGER();
    float *rg = (float *)sm + gr * 4 * 32 * NACC;
    mf_mvt_tree(acc, r, lane, rg);
    if (r == 0) {
#pragma unroll
        for (int m = 0; m < 2; ++m)
#pragma unroll
            for (int n = 0; n < NT; ++n)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int j = (m * NT + n) * 4 + i;
                    mf_mvt_out(acc[j], rg[j * 32 + lane], o0 + 32 * gr + 16 * m + g + 8 * (i >> 1),
                               t0 + 8 * n + 2 * q4 + (i & 1), y, bias, n_out, nt);
                }
    }
}

// Grid (ceil(nt / 8 NT), ceil(n_out / 32 GR)), 256 GR threads: the arguments of mf_mmvt*
// less the type, which the kernel's name carries (one kernel per type: each gets the
// registers its own type needs). A type whose two stages do not fit (mf_mvs_fits) has no
// kernel of that shape (matvec.rs takes the 32-row one).
#define MF_MMVS_ONE(NAME, TYV, NT, GR, MINB)                                                      \
    extern "C" __global__ void __launch_bounds__(256 * GR, MINB)                                 \
        NAME(const u8 *w, u64 row_bytes, const signed char *xq, const float2 *xds, float *y,     \
             const float *bias, int ne0, int n_out, int nt) {                                    \
        static_assert(mf_mvs_fits(TYV, NT, GR), "two stages fit 48 KiB");                        \
        __shared__ __align__(16) u8 sm[mf_mvs_max(2 * mf_mvs_stage(TYV, NT, GR),                 \
                                                  GR * 4 * 32 * 8 * NT * 4)];                    \
        mf_mmvs<TYV, NT, GR>(w, row_bytes, xq, xds, y, bias, ne0, n_out, nt, sm);                \
    }
#define MF_MMVS_KERNELS(NT, GR, MINB)                                                             \
    MF_MMVS_ONE(mf_mmvs##NT##_r##GR##_q8_0, MF_Q8_0, NT, GR, MINB)                                 \
    MF_MMVS_ONE(mf_mmvs##NT##_r##GR##_q4_0, MF_Q4_0, NT, GR, MINB)                                 \
    MF_MMVS_ONE(mf_mmvs##NT##_r##GR##_q4_1, MF_Q4_1, NT, GR, MINB)                                 \
    MF_MMVS_ONE(mf_mmvs##NT##_r##GR##_q5_0, MF_Q5_0, NT, GR, MINB)                                 \
    MF_MMVS_ONE(mf_mmvs##NT##_r##GR##_q4_k, MF_Q4_K, NT, GR, MINB)                                 \
    MF_MMVS_ONE(mf_mmvs##NT##_r##GR##_q6_k, MF_Q6_K, NT, GR, MINB)

// Names: mf_mmvs<NT>_r<GR>_<type>, NT 8-token tiles, GR groups of 32 rows (r1: 32 rows a
// block, r2: 64); the 64-row 32-token shape has no Q8_0 or Q6_K kernel.
MF_MMVS_KERNELS(2, 1, 3)
MF_MMVS_KERNELS(4, 1, 3)
MF_MMVS_KERNELS(2, 2, 2)
MF_MMVS_ONE(mf_mmvs4_r2_q4_0, MF_Q4_0, 4, 2, 2)
MF_MMVS_ONE(mf_mmvs4_r2_q4_1, MF_Q4_1, 4, 2, 2)
MF_MMVS_ONE(mf_mmvs4_r2_q5_0, MF_Q5_0, 4, 2, 2)
MF_MMVS_ONE(mf_mmvs4_r2_q4_k, MF_Q4_K, 4, 2, 2)
