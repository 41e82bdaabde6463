// Prefill matmuls on tensor cores (int8 `mma`), in the canonical block order of int8.cuh, so a
// row's bits are those of mf_mmvq / mf_mmvq1 whatever the batch (issue 15, ADR 0008).
//
// One m16n8k32 `mma` is a 16-row x 8-token tile of one 32-element block's integer dot products,
// exact like dp4a's; Q6_K needs its block's two 16-element halves apart (two scales), so it runs
// two m16n8k16 over the halves. Each product then goes through mf_contrib into one running f32
// accumulator per output. The partials P_r (blocks b = r, r + 8, ... in increasing order from
// +0) are walked residue-major in the order 0, 4, 2, 6, 1, 5, 3, 7, so each finished partial
// folds straight into the fixed tree ((P0+P4)+(P2+P6)) + ((P1+P5)+(P3+P7)): four floats per
// output live at once (the running partial, a pending partial, a pending pair, the left half).
//
// A CTA is 8 warps over a BM-row x BN-token tile (WM warps along the rows, 8 / WM along the
// tokens). Each step stages KB blocks of the current residue in shared memory: the
// weights unpacked to int8 by mf_wload with their scale terms, the activations' int8 values
// and (d, d * sum q).

// KB: blocks of one residue staged per step (4, or 8 for the `_k8` 64 x 64 tile: half the
// load-and-sync rounds on long rows); a staged row is 8 KB + 4 words (the 4 of padding make the
// fragment loads, 8 rows x 4 words, hit 32 distinct banks).

// Pass p of 8 walks residue r = p with its three bits reversed: 0, 4, 2, 6, 1, 5, 3, 7.
__device__ __forceinline__ int mf_mq_residue(int p) {
    return ((p & 1) << 2) | (p & 2) | ((p >> 2) & 1);
}

// What the finished partial of pass p (counted from the block's first pass, a multiple of
// np) does in the tree over the block's np passes (in pass order the canonical tree is a
// perfect binary tree over the passes): `one` holds a pass's partial until its pair partner
// finishes, `two` a pair until its partner pair does, `left` the finished left half; after
// the last pass `left` holds the block's subtree.
#define MF_MQ_ONE 0       // one = acc
#define MF_MQ_TWO 1       // two = one + acc
#define MF_MQ_LEFT 2      // left = two + (one + acc)
#define MF_MQ_ROOT 3      // left = left + (two + (one + acc))
#define MF_MQ_PAIR 4      // left = one + acc
#define MF_MQ_LEAF 5      // left = acc
__device__ __forceinline__ int mf_mq_fold_step(int p, int np) {
    if (np == 1) return MF_MQ_LEAF;
    if (np == 2) return (p & 1) ? MF_MQ_PAIR : MF_MQ_ONE;
    if ((p & 1) == 0) return MF_MQ_ONE;
    return p == 1 || p == 5 ? MF_MQ_TWO : p == 3 ? MF_MQ_LEFT : MF_MQ_ROOT;
}

// y[t][o] = sum_e w[o][e] x[t][e] (+ bias[o]) over the quantized activations (xq, xds), as
// mf_mmvq computes it. Grid: (ceil(n_out / BM), ceil(nt / BN), split), 256 threads. With
// split > 1 (small grids: more blocks to fill the GPU) block z walks passes
// [z * 8 / split, (z + 1) * 8 / split) only, writes its subtree to part[z][t][o], and
// mf_mmq_combine joins the subtrees in the same tree (so the same bits).
template <int TY, int BM, int BN, int WM, int KB>
__device__ __forceinline__ void mf_mmq(const u8 *w, u64 row_bytes, const signed char *xq,
                                       const float2 *xds, float *y, const float *bias, int ne0,
                                       int n_out, int nt, int split, float *part) {
    constexpr int WN = 8 / WM;
    constexpr int MT = BM / WM / 16; // 16-row mma tiles per warp
    constexpr int NT = BN / WN / 8;  // 8-token mma tiles per warp
    constexpr int WS = 8 * KB + 4;
    __shared__ __align__(16) int ws[BM * WS];
    __shared__ __align__(16) int xs[BN * WS];
    __shared__ float4 wsc[BM * KB]; // f1, f2, i1, i2 (the ints' bits)
    __shared__ float2 xsc[BN * KB];

    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int g = lane >> 2, q4 = lane & 3;
    int rw = (warp % WM) * (BM / WM), tw = (warp / WM) * (BN / WN);
    int o0 = blockIdx.x * BM, t0 = blockIdx.y * BN;
    int nb = ne0 >> 5;

    float acc[MT][NT][4], one[MT][NT][4], two[MT][NT][4], left[MT][NT][4];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int i = 0; i < 4; ++i) one[m][n][i] = two[m][n][i] = left[m][n][i] = 0.0f;

    int np = 8 / split, p0 = blockIdx.z * np;
    for (int p = p0; p < p0 + np; ++p) {
        int r = mf_mq_residue(p);
        int nj = r < nb ? (nb - r + 7) >> 3 : 0; // blocks of residue r
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
            for (int n = 0; n < NT; ++n)
#pragma unroll
                for (int i = 0; i < 4; ++i) acc[m][n][i] = 0.0f;
        for (int j0 = 0; j0 < nj; j0 += KB) {
            int kc = min(KB, nj - j0);
            __syncthreads(); // the previous step's reads are done
            // Each thread's items unrolled, so their loads are in flight together.
#pragma unroll
            for (int it = 0; it < (BM * KB + 255) / 256; ++it) {
                int i = tid + 256 * it;
                if (i >= BM * KB) break;
                int row = i / KB, kb = i % KB, o = o0 + row;
                int4 lo = make_int4(0, 0, 0, 0), hi = lo;
                float4 sc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (kb < kc && o < n_out) {
                    MfWBlk wb;
                    wb.f2 = 0.0f;
                    wb.i1 = wb.i2 = 0;
                    mf_wload_tile<TY>(w + (u64)o * row_bytes, r + 8 * (j0 + kb), wb);
                    lo = make_int4(wb.q[0], wb.q[1], wb.q[2], wb.q[3]);
                    hi = make_int4(wb.q[4], wb.q[5], wb.q[6], wb.q[7]);
                    sc = make_float4(wb.f1, wb.f2, __int_as_float(wb.i1), __int_as_float(wb.i2));
                }
                int4 *d = (int4 *)(ws + row * WS + kb * 8);
                d[0] = lo;
                d[1] = hi;
                wsc[row * KB + kb] = sc;
            }
#pragma unroll
            for (int it = 0; it < (BN * KB * 2 + 255) / 256; ++it) {
                int i = tid + 256 * it;
                if (i >= BN * KB * 2) break;
                int tok = i / (KB * 2), kb = (i >> 1) % KB, half = i & 1, t = t0 + tok;
                int4 v = make_int4(0, 0, 0, 0);
                if (kb < kc && t < nt)
                    v = ((const int4 *)(xq + (u64)t * ne0 + (u64)(r + 8 * (j0 + kb)) * 32))[half];
                *(int4 *)(xs + tok * WS + kb * 8 + half * 4) = v;
            }
#pragma unroll
            for (int it = 0; it < (BN * KB + 255) / 256; ++it) {
                int i = tid + 256 * it;
                if (i >= BN * KB) break;
                int tok = i / KB, kb = i % KB, t = t0 + tok;
                float2 ds = make_float2(0.0f, 0.0f);
                if (kb < kc && t < nt) ds = xds[(u64)t * nb + r + 8 * (j0 + kb)];
                xsc[tok * KB + kb] = ds;
            }
            __syncthreads();
            for (int kb = 0; kb < kc; ++kb) { // blocks in increasing order
                int bfr[NT][2];
#pragma unroll
                for (int n = 0; n < NT; ++n) {
                    const int *xr = xs + (tw + n * 8 + g) * WS + kb * 8 + q4;
                    bfr[n][0] = xr[0];
                    bfr[n][1] = xr[4];
                }
                float2 ds[NT][2];
#pragma unroll
                for (int n = 0; n < NT; ++n)
#pragma unroll
                    for (int k = 0; k < 2; ++k)
                        ds[n][k] = xsc[(tw + n * 8 + 2 * q4 + k) * KB + kb];
#pragma unroll
                for (int m = 0; m < MT; ++m) {
                    int ra = rw + m * 16 + g;
                    const int *w0 = ws + ra * WS + kb * 8 + q4;
                    const int *w1 = w0 + 8 * WS;
                    int afr[4] = {w0[0], w1[0], w0[4], w1[4]};
                    MfWBlk wb[2];
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        float4 sc = wsc[(ra + 8 * h) * KB + kb];
                        wb[h].f1 = sc.x;
                        wb[h].f2 = sc.y;
                        wb[h].i1 = __float_as_int(sc.z);
                        wb[h].i2 = __float_as_int(sc.w);
                    }
#pragma unroll
                    for (int n = 0; n < NT; ++n) {
                        int ca[4] = {0, 0, 0, 0}, cb[4] = {0, 0, 0, 0};
                        if (TY == MF_Q6_K) {
                            mf_mma_k16(ca, afr[0], afr[1], bfr[n][0]);
                            mf_mma_k16(cb, afr[2], afr[3], bfr[n][1]);
                        } else {
                            mf_mma_k32(ca, afr, bfr[n][0], bfr[n][1]);
                        }
                        // c[i]: row g + 8 * (i >> 1), token 2 * q4 + (i & 1) of the tile.
#pragma unroll
                        for (int i = 0; i < 4; ++i) {
                            float2 d = ds[n][i & 1];
                            float c = mf_contrib<TY>(wb[i >> 1], ca[i], cb[i], d.x, d.y);
                            acc[m][n][i] = __fadd_rn(acc[m][n][i], c);
                        }
                    }
                }
            }
        }
        // One branch per pass (uniform), a plain loop over the outputs in each.
#define MF_MQ_EACH(EXPR)                                                                        \
    _Pragma("unroll") for (int m = 0; m < MT; ++m) _Pragma("unroll") for (int n = 0; n < NT;   \
                                                                          ++n)                 \
        _Pragma("unroll") for (int i = 0; i < 4; ++i) {                                         \
            float a = acc[m][n][i], &o1 = one[m][n][i], &o2 = two[m][n][i],                    \
                  &l = left[m][n][i];                                                           \
            EXPR;                                                                               \
        }
        switch (mf_mq_fold_step(p - p0, np)) {
        case MF_MQ_ONE: MF_MQ_EACH(o1 = a) break;
        case MF_MQ_TWO: MF_MQ_EACH(o2 = __fadd_rn(o1, a)) break;
        case MF_MQ_LEFT: MF_MQ_EACH(l = __fadd_rn(o2, __fadd_rn(o1, a))) break;
        case MF_MQ_ROOT: MF_MQ_EACH(l = __fadd_rn(l, __fadd_rn(o2, __fadd_rn(o1, a)))) break;
        case MF_MQ_PAIR: MF_MQ_EACH(l = __fadd_rn(o1, a)) break;
        default: MF_MQ_EACH(l = a) break;
        }
#undef MF_MQ_EACH
    }
    MF_PDL_TRIGGER();

#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                int o = o0 + rw + m * 16 + g + 8 * (i >> 1);
                int t = t0 + tw + n * 8 + 2 * q4 + (i & 1);
                if (o < n_out && t < nt) {
                    float s = left[m][n][i];
                    if (split > 1) {
                        part[((u64)blockIdx.z * nt + t) * n_out + o] = s;
                    } else {
                        if (bias) s = __fadd_rn(s, bias[o]);
                        y[(u64)t * n_out + o] = s;
                    }
                }
            }
}

// Tile shapes (rows x tokens, warps along the rows): `mf_mmq_<type>` 64 x 64 (4 x 2 warps),
// `_r128` 128 x 64 (4 x 2), `_t32` 64 x 32 (4 x 2); exec.rs picks one (MINFER_CUDA_MMQ_TILE).
#define MF_MMQ_KERNEL(NAME, TY, BM, BN, WM, KB)                                                 \
    extern "C" __global__ void __launch_bounds__(256)                                           \
        NAME(const u8 *w, u64 row_bytes, const signed char *xq, const float2 *xds, float *y,    \
             const float *bias, int ne0, int n_out, int nt, int split, float *part) {           \
        MF_PDL_ENTRY();                                                                           \
        mf_mmq<TY, BM, BN, WM, KB>(w, row_bytes, xq, xds, y, bias, ne0, n_out, nt, split, part); \
    }

#define MF_MMQ_TILES(TYNAME, TY)                                                                \
    MF_MMQ_KERNEL(mf_mmq_##TYNAME, TY, 64, 64, 4, 4)                                            \
    MF_MMQ_KERNEL(mf_mmq_##TYNAME##_r128, TY, 128, 64, 4, 4)                                    \
    MF_MMQ_KERNEL(mf_mmq_##TYNAME##_t32, TY, 64, 32, 4, 4)                                      \
    MF_MMQ_KERNEL(mf_mmq_##TYNAME##_k8, TY, 64, 64, 4, 8)

MF_MMQ_TILES(q8_0, MF_Q8_0)
MF_MMQ_TILES(q4_0, MF_Q4_0)
MF_MMQ_TILES(q4_1, MF_Q4_1)
MF_MMQ_TILES(q5_0, MF_Q5_0)
MF_MMQ_TILES(q4_k, MF_Q4_K)
MF_MMQ_TILES(q6_k, MF_Q6_K)

// The upper levels of the tree over the `split` subtrees of mf_mmq (2, 4 or 8; n = nt * n_out
// outputs each), then the bias.
extern "C" __global__ void mf_mmq_combine(const float *part, float *y, const float *bias,
                                          u64 n, int n_out, int split) {
    MF_PDL_ENTRY();
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v[8];
#pragma unroll
    for (int z = 0; z < 8; ++z) v[z] = z < split ? part[z * n + i] : 0.0f;
#pragma unroll
    for (int w = 8; w > 1; w >>= 1)
#pragma unroll
        for (int z = 0; z < w / 2; ++z)
            if (w <= split) v[z] = __fadd_rn(v[2 * z], v[2 * z + 1]);
    float s = v[0];
    if (bias) s = __fadd_rn(s, bias[i % n_out]);
    y[i] = s;
}
