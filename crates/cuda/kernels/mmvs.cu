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

// Bytes of a chunk of one weight row (8 blocks) and of its staged row: the chunk's 16-byte
// units from the one its first byte falls in (a Q6_K superblock, 210 bytes, starts at any even
// offset of a unit: 14 units), padded so that the fragment loads of 8 rows x 4 lanes fall on
// distinct banks.
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
// Whether a type's chunks start on a copy unit in every row (the host sends only matrices
// whose base and rows are 16-byte aligned); Q6_K's start 0-14 bytes into one, per row.
__host__ __device__ constexpr bool mf_mvs_aligned(int ty) { return ty != MF_Q6_K; }
__host__ __device__ constexpr int mf_mvs_units(int ty) {
    return mf_mvs_aligned(ty) ? mf_mvs_chunk(ty) / 16 : (mf_mvs_chunk(ty) + 14 + 15) / 16;
}
// A staged token: its chunk's 256 int8 values (stride 272: conflict-free fragment loads),
// then 8 (d, d * sum q) pairs.
#define MF_MVS_XS 272
#define MF_MVS_TOK (MF_MVS_XS + 64)
// Bytes of one stage (`rows` weight rows, 8 NT tokens); the stages a block keeps in flight: as
// many as fit the 48 KiB of static shared memory a block may take, at most 6 (crates/cuda/src/
// matvec.rs `mvs_fits` mirrors the rule that two fit; a shape with fewer has no kernel).
__host__ __device__ constexpr int mf_mvs_stage(int ty, int nt, int rows) {
    return rows * mf_mvs_ws(ty) + 8 * nt * MF_MVS_TOK;
}
__host__ __device__ constexpr int mf_mvs_stages(int ty, int nt, int rows) {
    return 48 * 1024 / mf_mvs_stage(ty, nt, rows) < 6 ? 48 * 1024 / mf_mvs_stage(ty, nt, rows)
                                                      : 6;
}
__host__ __device__ constexpr int mf_mvs_max(int a, int b) { return a > b ? a : b; }

// A thread's share of a stage's copies, fixed for the whole walk, all in 16-byte units: weight
// unit k = tid + j 256 G (row k / units, unit k % units) and token unit k (token k / 20:
// units 0-15 its int8 values, block u / 2 of the chunk; 16-19 its (d, d * sum q) pairs,
// blocks 2 (u - 16) and the next), as the chunk-0 source, the offset in the stage, and what
// a chunk moves it by. The host sends only rows of an even number of blocks (the pairs' units).
template <int TY, int NT, int G, int MT> struct MfMvsPlan {
    static constexpr int R = 16 * MT * G, T = 256 * G, UNITS = mf_mvs_units(TY);
    static constexpr int KW = (R * UNITS + T - 1) / T, KX = (8 * NT * 20 + T - 1) / T;
    const u8 *ws[KW];
    u32 wd[KW];
    int wo[KW]; // Q6_K: the row's first byte's offset in its unit; -1: a unit of the last row
    const u8 *xs[KX];
    u32 xd[KX];
    int xb[KX]; // the unit's first block in the chunk (the copy is in while it is < nblk)
};

template <int TY, int NT, int G, int MT>
__device__ __forceinline__ void mf_mvs_plan(MfMvsPlan<TY, NT, G, MT> &p, const u8 *w, u64 row_bytes,
                                            int o0, int n_out, const signed char *xq,
                                            const float2 *xds, int ne0, int t0, int nt) {
    using P = MfMvsPlan<TY, NT, G, MT>;
    const int nb = ne0 >> 5;
#pragma unroll
    for (int j = 0; j < P::KW; ++j) {
        const int k = threadIdx.x + j * P::T;
        const int row = min(k / P::UNITS, P::R - 1), u = k - (k / P::UNITS) * P::UNITS;
        const int o = min(o0 + row, n_out - 1);
        const u8 *rs = w + (u64)o * row_bytes;
        p.ws[j] = rs + (u64)u * 16;
        p.wd[j] = (u32)(row * mf_mvs_ws(TY) + u * 16);
        // The last row's units may pass the matrix's end (cut there); no other row's can.
        p.wo[j] = o == n_out - 1 ? -1 : (mf_mvs_aligned(TY) ? 0 : (int)((u64)rs & 15));
    }
#pragma unroll
    for (int j = 0; j < P::KX; ++j) {
        const int k = threadIdx.x + j * P::T;
        const int tk = min(k / 20, 8 * NT - 1), u = k - (k / 20) * 20;
        const u64 t = mf_tok(t0 + tk, nt);
        if (u < 16) {
            p.xs[j] = (const u8 *)(xq + t * (u64)ne0) + u * 16;
            p.xd[j] = (u32)(tk * MF_MVS_XS + u * 16);
            p.xb[j] = u >> 1;
        } else {
            p.xs[j] = (const u8 *)(xds + t * (u64)nb + 2 * (u - 16));
            p.xd[j] = (u32)(8 * NT * MF_MVS_XS + tk * 64 + (u - 16) * 16);
            p.xb[j] = 2 * (u - 16);
        }
    }
}

// Chunk c's weight units into the stage at shared address `sw` (a unit of the last row past
// the matrix's end `wend` is cut there and zero-filled; a short last chunk of a legacy type
// copies the next row's first bytes, unused). Q6_K: from the unit the chunk's first byte falls
// in (the base is 16-byte aligned; a chunk moves the offset by 210 = 2 mod 16 bytes).
template <int TY, int NT, int G, int MT>
__device__ __forceinline__ void mf_mvs_load_w(const MfMvsPlan<TY, NT, G, MT> &p, u32 sw,
                                              const u8 *wend, const u8 *w, u64 row_bytes,
                                              int c) {
    using P = MfMvsPlan<TY, NT, G, MT>;
#pragma unroll
    for (int j = 0; j < P::KW; ++j) {
        if (P::KW * P::T == P::R * P::UNITS || threadIdx.x + j * P::T < P::R * P::UNITS) {
            int off = p.wo[j];
            if (!mf_mvs_aligned(TY) && off < 0) // the last row: its offset again
                off = (int)((u64)(wend - row_bytes) & 15);
            if (!mf_mvs_aligned(TY)) off = (off + 2 * c) & 15;
            const u8 *src = p.ws[j] + (u64)c * mf_mvs_chunk(TY) - (mf_mvs_aligned(TY) ? 0 : off);
            if (p.wo[j] >= 0) {
                mf_cp16(sw + p.wd[j], src, 16);
            } else {
                const long long left = wend - src;
                const int bytes = left >= 16 ? 16 : (left > 0 ? (int)left : 0);
                mf_cp16(sw + p.wd[j], bytes ? src : w, bytes);
            }
        }
    }
}

// Chunk c's token units into the stage's token part at shared address `sx` (units past the
// row's `nblk` blocks of the chunk zero-filled).
template <int TY, int NT, int G, int MT>
__device__ __forceinline__ void mf_mvs_load_x(const MfMvsPlan<TY, NT, G, MT> &p, u32 sx, int c,
                                              int nblk) {
    using P = MfMvsPlan<TY, NT, G, MT>;
#pragma unroll
    for (int j = 0; j < P::KX; ++j) {
        if (P::KX * P::T == 8 * NT * 20 || threadIdx.x + j * P::T < 8 * NT * 20) {
            const bool in = p.xb[j] < nblk;
            const u64 step = p.xd[j] < 8 * NT * MF_MVS_XS ? 256 : 64;
            mf_cp16(sx + p.xd[j], p.xs[j] + (in ? (u64)c * step : 0), in ? 16 : 0);
        }
    }
}

// Q4_K's scale terms of sub-block s for the 32 rows of a warp's group, one row a lane (lane l:
// row l of the stage's group, whose 16-byte header it reads), with mf_wfrag's arithmetic:
// f1 = d * sc, f2 = dmin * mn. The fragment's lanes take theirs by shuffle.
__device__ __forceinline__ float2 mf_mvs_q4k_scales(const u8 *row, int s) {
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
    return make_float2(__fmul_rn(mf_h2f((u16)(hd.x & 0xffffu)), (float)sc),
                       __fmul_rn(mf_h2f((u16)(hd.x >> 16)), (float)mn));
}

// y[t][o] = w[o] . x[t] (+ bias[o]) for the 16 MT G rows from blockIdx.y * 16 MT G and the 8 NT
// tokens from blockIdx.x * 8 NT (of nt), x quantized by mf_quantize_q8. Warp (r, gr) of the
// block's 8 G takes residue r of rows 16 MT gr .. 16 MT gr + 16 MT - 1 (MT m16 tiles: two
// spread a weight fragment's decode and each activation fragment over more rows, one gives a
// matrix of few rows twice the warps) for every token.
// S stages in flight (mf_mvs_stages), one barrier a chunk: the copy into the stage read in
// the chunk before starts after the barrier every warp passes once it has read it.
template <int TY, int NT, int G, int MT>
__device__ __forceinline__ void mf_mmvs(const u8 *w, u64 row_bytes, const signed char *xq,
                                        const float2 *xds, float *y, const float *bias, int ne0,
                                        int n_out, int nt, u8 *sm) {
    constexpr int RG = 16 * MT, R = RG * G, WS = mf_mvs_ws(TY), NACC = MT * NT * 4;
    constexpr int SB = mf_mvs_stage(TY, NT, R), S = mf_mvs_stages(TY, NT, R);
    static_assert(S >= 2, "two stages fit");
    const int lane = threadIdx.x & 31, r = (threadIdx.x >> 5) & 7, gr = threadIdx.x >> 8;
    const int g = lane >> 2, q4 = lane & 3;
    const int o0 = blockIdx.y * R, t0 = blockIdx.x * 8 * NT;
    const int nb = ne0 >> 5, nch = (nb + 7) >> 3;
    const u8 *wend = w + (u64)n_out * row_bytes;
    MfMvsPlan<TY, NT, G, MT> plan;
    mf_mvs_plan<TY, NT, G, MT>(plan, w, row_bytes, o0, n_out, xq, xds, ne0, t0, nt);
    const u32 sm0 = mf_smem_addr(sm);
    // Q6_K: where each of this lane's four rows starts in its staged row, chunk 0 (a chunk
    // moves it by 210 bytes: 2 mod 16).
    int woff[MT][2];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h)
            woff[m][h] =
                mf_mvs_aligned(TY)
                    ? 0
                    : (int)((u64)(w + (u64)min(o0 + RG * gr + 16 * m + 8 * h + g, n_out - 1) *
                                          row_bytes) &
                            15);
    float acc[NACC]; // output (m, n, i) at (m NT + n) 4 + i
#pragma unroll
    for (int j = 0; j < NACC; ++j) acc[j] = 0.0f;
    // The first S - 1 chunks' weights before the wait on the kernel before (they are
    // constant), their activations after; one commit group a chunk (group 0 holds the weights).
#pragma unroll
    for (int c = 0; c < S - 1; ++c)
        if (c < nch) mf_mvs_load_w<TY, NT, G, MT>(plan, sm0 + c * SB, wend, w, row_bytes, c);
    MF_PDL_ENTRY();
#pragma unroll
    for (int c = 0; c < S - 1; ++c) {
        if (c < nch) mf_mvs_load_x<TY, NT, G, MT>(plan, sm0 + c * SB + R * WS, c, min(8, nb - 8 * c));
        mf_cp_commit();
    }
    int stage = 0;
    for (int c = 0; c < nch; ++c) {
        mf_cp_wait<S - 2>();
        __syncthreads();
        {
            const int cn = c + S - 1;
            const int sn = stage == 0 ? S - 1 : stage - 1;
            if (cn < nch) {
                mf_mvs_load_w<TY, NT, G, MT>(plan, sm0 + sn * SB, wend, w, row_bytes, cn);
                mf_mvs_load_x<TY, NT, G, MT>(plan, sm0 + sn * SB + R * WS, cn, min(8, nb - 8 * cn));
            }
            mf_cp_commit();
        }
        const u8 *st = sm + stage * SB;
        stage = stage + 1 == S ? 0 : stage + 1;
        if (r < nb - 8 * c) { // block 8 c + r of the row: residue r's next
            int fa[MT][4];
            MfWBlk fw[MT][2];
            float2 q4k;
            // (One m16 tile: lanes 16-31 decode rows 0-15 again, unused.)
            if (TY == MF_Q4_K) q4k = mf_mvs_q4k_scales(st + (RG * gr + (lane & (RG - 1))) * WS, r);
#pragma unroll
            for (int m = 0; m < MT; ++m)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    fw[m][h].f2 = 0.0f;
                    fw[m][h].i1 = fw[m][h].i2 = 0;
                    const int rw = 16 * m + 8 * h + g;
                    const u8 *row = st + (RG * gr + rw) * WS;
                    if (TY == MF_Q4_K) {
                        fw[m][h].f1 = __shfl_sync(0xffffffffu, q4k.x, rw);
                        fw[m][h].f2 = __shfl_sync(0xffffffffu, q4k.y, rw);
                        const u8 *qs = row + 16 + 32 * (r >> 1);
                        const int sh = 4 * (r & 1);
                        fa[m][h] = (mf_ld4(qs + 4 * q4) >> sh) & 0x0F0F0F0F;
                        fa[m][2 + h] = (mf_ld4(qs + 16 + 4 * q4) >> sh) & 0x0F0F0F0F;
                    } else if (mf_mvs_aligned(TY)) {
                        // Block r of a legacy chunk.
                        mf_wfrag<TY>(row, r, q4, fa[m][h], fa[m][2 + h], fw[m][h]);
                    } else {
                        // Sub-block r of a Q6_K superblock, `off` bytes into its staged row.
                        const int off = (woff[m][h] + 2 * c) & 15;
                        mf_wfrag<TY>(row + off, r, q4, fa[m][h], fa[m][2 + h], fw[m][h]);
                    }
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
                for (int m = 0; m < MT; ++m)
                    mf_mvt_block<TY>(acc + (m * NT + n) * 4, fa[m], fw[m], x0, x1, d0, d1);
            }
        }
    }
    mf_cp_wait<0>();
    __syncthreads(); // every warp is done with the stages the tree's buffer overlays
    MF_PDL_TRIGGER();
    float *rg = (float *)sm + gr * 4 * 32 * NACC;
    mf_mvt_tree(acc, r, lane, rg);
    if (r == 0) {
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
            for (int n = 0; n < NT; ++n)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int j = (m * NT + n) * 4 + i;
                    mf_mvt_out(acc[j], rg[j * 32 + lane], o0 + RG * gr + 16 * m + g + 8 * (i >> 1),
                               t0 + 8 * n + 2 * q4 + (i & 1), y, bias, n_out, nt);
                }
    }
}

// Grid (ceil(nt / 8 NT), ceil(n_out / 16 MT G)), 256 G threads: the arguments of mf_mmvt*
// less the type, which the kernel's name carries (one kernel per type: each gets the
// registers its own type needs). A type whose two stages do not fit (mf_mvs_stages) has no
// kernel of that shape (matvec.rs takes the 32-row one).
#define MF_MMVS_ONE(NAME, TYV, NT, G, MT, MINB)                                                  \
    extern "C" __global__ void __launch_bounds__(256 * G, MINB)                                  \
        NAME(const u8 *w, u64 row_bytes, const signed char *xq, const float2 *xds, float *y,     \
             const float *bias, int ne0, int n_out, int nt) {                                    \
        __shared__ __align__(16) u8 sm[mf_mvs_max(mf_mvs_stages(TYV, NT, 16 * MT * G) *          \
                                                      mf_mvs_stage(TYV, NT, 16 * MT * G),        \
                                                  G * 4 * 32 * MT * NT * 4 * 4)];                \
        mf_mmvs<TYV, NT, G, MT>(w, row_bytes, xq, xds, y, bias, ne0, n_out, nt, sm);             \
    }
#define MF_MMVS_KERNELS(NT, SHAPE, G, MT, MINB)                                                  \
    MF_MMVS_ONE(mf_mmvs##NT##_##SHAPE##_q8_0, MF_Q8_0, NT, G, MT, MINB)                          \
    MF_MMVS_ONE(mf_mmvs##NT##_##SHAPE##_q4_0, MF_Q4_0, NT, G, MT, MINB)                          \
    MF_MMVS_ONE(mf_mmvs##NT##_##SHAPE##_q4_1, MF_Q4_1, NT, G, MT, MINB)                          \
    MF_MMVS_ONE(mf_mmvs##NT##_##SHAPE##_q5_0, MF_Q5_0, NT, G, MT, MINB)                          \
    MF_MMVS_ONE(mf_mmvs##NT##_##SHAPE##_q4_k, MF_Q4_K, NT, G, MT, MINB)                          \
    MF_MMVS_ONE(mf_mmvs##NT##_##SHAPE##_q6_k, MF_Q6_K, NT, G, MT, MINB)

// Names: mf_mmvs<NT>_<shape>_<type>, NT 8-token tiles; r1: 32 rows a block, 8 warps of two m16
// tiles; r2: 64 rows, 16 such warps; w16: 32 rows, 16 warps of one tile (matrices of few rows).
// The 64-row 32-token shape has no Q8_0 or Q6_K kernel (two stages do not fit).
MF_MMVS_KERNELS(1, r1, 1, 2, 4)
MF_MMVS_KERNELS(1, r2, 2, 2, 2)
MF_MMVS_KERNELS(1, w16, 2, 1, 2)
MF_MMVS_KERNELS(2, r1, 1, 2, 3)
MF_MMVS_KERNELS(2, r2, 2, 2, 2)
MF_MMVS_KERNELS(2, w16, 2, 1, 2)
MF_MMVS_KERNELS(4, r1, 1, 2, 2)
MF_MMVS_KERNELS(4, w16, 2, 1, 1)
MF_MMVS_ONE(mf_mmvs4_r2_q4_0, MF_Q4_0, 4, 2, 2, 1)
MF_MMVS_ONE(mf_mmvs4_r2_q4_1, MF_Q4_1, 4, 2, 2, 1)
MF_MMVS_ONE(mf_mmvs4_r2_q5_0, MF_Q5_0, 4, 2, 2, 1)
MF_MMVS_ONE(mf_mmvs4_r2_q4_k, MF_Q4_K, 4, 2, 2, 1)
