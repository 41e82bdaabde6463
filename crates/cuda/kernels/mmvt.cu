// The tensor-core generation-row kernels, in a module of their own (compiled beside mmvq.cu's
// one-token and multi-row kernels; the fragments and the tree come from mvt.cuh).

// ---- generation rows on tensor cores (`mf_mmvt1/2/4/8`, issues 29 and 31): the canonical
// order of int8.cuh with the block products on `mma`, so that several generation rows (a
// batch of sequences, or a drafted run being verified) share each weight read. matvec.rs
// routes 9 to 32 rows here (measured faster than the neighbours there; ADR 0008).
//
// A block of 8 warps owns 16 weight rows and 8 NT tokens (the 64-token kernel: two such
// groups of warps over the same rows, tokens 0-31 and 32-63). Warp r walks the blocks of
// residue r (b = r, r + 8, r + 16, ...; for K-quants, sub-block r of every superblock) in
// increasing order, so each lane's running sum IS the partial P_r of int8.cuh for its four
// (row, token) outputs of each m16n8 tile; the eight residues are independent sums, so the
// split over warps reorders nothing. One m16n8k32 `mma` is a block's exact integer dot products
// for 16 rows x 8 tokens (Q6_K: two m16n8k16 over its halves, which carry separate scales);
// each goes through mf_contrib as in every other kernel. The warps' partials meet in shared
// memory and one thread per output adds them in the canonical tree, then the bias. Token slots
// past the nt that exist read the last token's row (in bounds; results unused), as mf_rown's.
// Every row's bits are mf_mmvq1's for that token alone, whatever the row count or tile.

// The residue walk's unroll (an ablation switch: the bits never depend on it).
#ifndef MF_MVT_UNROLL
#define MF_MVT_UNROLL 2
#endif

// y[t][o] = w[o] . x[t] (+ bias[o]) for the 16 MT rows from blockIdx.y * 16 MT and the
// 8 NT TG tokens from blockIdx.x * 8 NT TG (of nt), x quantized by mf_quantize_q8; `red`:
// TG x 4 x 128 MT NT floats of shared memory. A warp's MT row tiles share each activation
// fragment it loads (the activations' traffic, not the weights', bounded these kernels with
// one tile: ncu on the H100 saw L1/L2 at 77 % of their throughput and DRAM at 4 %).
template <int TY, int NT, int TG, int MT>
__device__ __forceinline__ void mf_mmvt(const u8 *w, u64 row_bytes, const signed char *xq,
                                        const float2 *xds, float *y, const float *bias, int ne0,
                                        int n_out, int nt, float *red) {
    const int lane = threadIdx.x & 31, r = (threadIdx.x >> 5) & 7, g = lane >> 2, q4 = lane & 3;
    const int grp = threadIdx.x >> 8; // the warp's token group
    // Token tiles along x, so the blocks of one row tile run side by side (their weights
    // from L2 after the first).
    const int o0 = blockIdx.y * MF_MVT_ROWS * MT, t0 = (blockIdx.x * TG + grp) * 8 * NT;
    const int nb = ne0 >> 5;
    const u8 *wr[MT][2];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h)
            wr[m][h] = w + (u64)min(o0 + 16 * m + 8 * h + g, n_out - 1) * row_bytes;
    // This lane's token rows: its B fragment's column (g) and its outputs' (2 q4, 2 q4 + 1)
    // in each 8-token tile, as 32-bit offsets (registers: the wide tiles need them).
    u32 xrow[NT], drow0[NT], drow1[NT];
#pragma unroll
    for (int n = 0; n < NT; ++n) {
        xrow[n] = (u32)mf_tok(t0 + 8 * n + g, nt) * (u32)ne0;
        drow0[n] = (u32)mf_tok(t0 + 8 * n + 2 * q4, nt) * (u32)nb;
        drow1[n] = (u32)mf_tok(t0 + 8 * n + 2 * q4 + 1, nt) * (u32)nb;
    }
    float acc[MT * NT * 4]; // output (m, n, i) at (m NT + n) 4 + i
#pragma unroll
    for (int j = 0; j < MT * NT * 4; ++j) acc[j] = 0.0f;
#pragma unroll MF_MVT_UNROLL
    for (int b = r; b < nb; b += 8) {
        int a[MT][4];
        MfWBlk sw[MT][2];
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                sw[m][h].f2 = 0.0f;
                sw[m][h].i1 = sw[m][h].i2 = 0;
                mf_wfrag<TY>(wr[m][h], b, q4, a[m][h], a[m][2 + h], sw[m][h]);
            }
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            const int *xv = (const int *)(xq + (u64)xrow[n] + (u64)b * 32);
            const int x0 = xv[q4], x1 = xv[q4 + 4];
            const float2 d0 = xds[(u64)drow0[n] + b], d1 = xds[(u64)drow1[n] + b];
#pragma unroll
            for (int m = 0; m < MT; ++m)
                mf_mvt_block<TY>(acc + (m * NT + n) * 4, a[m], sw[m], x0, x1, d0, d1);
        }
    }
    MF_PDL_TRIGGER();
    mf_mvt_tree(acc, r, lane, red + grp * 4 * 32 * MT * NT * 4);
    if (r == 0) {
        const float *rg = red + grp * 4 * 32 * MT * NT * 4;
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
            for (int n = 0; n < NT; ++n)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int j = (m * NT + n) * 4 + i;
                    mf_mvt_out(acc[j], rg[j * 32 + lane], o0 + 16 * m + g + 8 * (i >> 1),
                               t0 + 8 * n + 2 * q4 + (i & 1), y, bias, n_out, nt);
                }
    }
}

// Grid (ceil(nt / 8 NT TG), ceil(n_out / 16 MT)), 256 TG threads (TG groups of 8 warps,
// group g taking the 8 NT tokens from 8 NT g of the block's): the arguments of mf_mmvqn*.
// The 64-token kernel is two groups of 32 (one group of 64 needs more than 128 registers a
// thread: spills, or one block an SM). `_m2`: 32 weight rows a block (for tall matrices, whose
// grids stay full), each activation fragment feeding two row tiles; its widest tile is 32
// tokens (two groups of 16: wider spills), in as many blocks along x as the tokens need.
#define MF_MMVT_KERNEL(NAME, NT, TG, MT, MINB)                                                    \
    extern "C" __global__ void __launch_bounds__(256 * TG, MINB)                                 \
        NAME(int ty, const u8 *w, u64 row_bytes, const signed char *xq, const float2 *xds,       \
             float *y, const float *bias, int ne0, int n_out, int nt) {                          \
        __shared__ float red[TG * 4 * 128 * MT * NT];                                             \
        MF_PDL_ENTRY();                                                                           \
        switch (ty) {                                                                             \
        case MF_Q8_0:                                                                             \
            mf_mmvt<MF_Q8_0, NT, TG, MT>(w, row_bytes, xq, xds, y, bias, ne0, n_out, nt, red);   \
            break;                                                                                \
        case MF_Q4_0:                                                                             \
            mf_mmvt<MF_Q4_0, NT, TG, MT>(w, row_bytes, xq, xds, y, bias, ne0, n_out, nt, red);   \
            break;                                                                                \
        case MF_Q4_1:                                                                             \
            mf_mmvt<MF_Q4_1, NT, TG, MT>(w, row_bytes, xq, xds, y, bias, ne0, n_out, nt, red);   \
            break;                                                                                \
        case MF_Q5_0:                                                                             \
            mf_mmvt<MF_Q5_0, NT, TG, MT>(w, row_bytes, xq, xds, y, bias, ne0, n_out, nt, red);   \
            break;                                                                                \
        case MF_Q4_K:                                                                             \
            mf_mmvt<MF_Q4_K, NT, TG, MT>(w, row_bytes, xq, xds, y, bias, ne0, n_out, nt, red);   \
            break;                                                                                \
        default:                                                                                  \
            mf_mmvt<MF_Q6_K, NT, TG, MT>(w, row_bytes, xq, xds, y, bias, ne0, n_out, nt, red);   \
            break;                                                                                \
        }                                                                                         \
    }

MF_MMVT_KERNEL(mf_mmvt1, 1, 1, 1, 3)
MF_MMVT_KERNEL(mf_mmvt2, 2, 1, 1, 2)
MF_MMVT_KERNEL(mf_mmvt4, 4, 1, 1, 2)
MF_MMVT_KERNEL(mf_mmvt8, 4, 2, 1, 1)
MF_MMVT_KERNEL(mf_mmvt1_m2, 1, 1, 2, 2)
MF_MMVT_KERNEL(mf_mmvt2_m2, 2, 1, 2, 2)
MF_MMVT_KERNEL(mf_mmvt4_m2, 2, 2, 2, 1)
