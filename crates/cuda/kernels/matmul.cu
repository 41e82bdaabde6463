// y[t][o] = sum_i w[o][i] x[t][i] (+ bias[o]): the correctness matmul. One block per output
// row and tile of MF_MM_T tokens; each thread dequantizes whole 32-element chunks of the
// weight row and accumulates them into the tile's tokens in f32. A token's arithmetic (chunk
// order per thread, then the fixed block reduction) does not depend on the other tokens, so
// results are batch-invariant.
#define MF_MM_T 16

extern "C" __global__ void mf_matmul(int ty, const u8 *w, u64 row_bytes, const float *x,
                                     float *y, const float *bias, int ne0, int n_out, int nt) {
    MF_PDL_ENTRY();
    __shared__ float red[32];
    int o = blockIdx.x;
    int t0 = blockIdx.y * MF_MM_T;
    const u8 *row = w + (u64)o * row_bytes;
    float acc[MF_MM_T];
    for (int k = 0; k < MF_MM_T; ++k) acc[k] = 0.0f;
    int nch = (ne0 + 31) / 32;
    // Tokens of this tile (uniform over the block): a decode row does one reduction, not 16.
    int kt = min(MF_MM_T, nt - t0);
    float wv[32];
    for (int c = threadIdx.x; c < nch; c += blockDim.x) {
        mf_deq32(ty, row, c, ne0, wv);
        int m = min(32, ne0 - c * 32);
#pragma unroll
        for (int k = 0; k < MF_MM_T; ++k) {
            int t = t0 + k;
            if (k < kt) {
                const float *xr = x + (u64)t * ne0 + c * 32;
                float s = 0.0f;
                if (m == 32 && (ne0 & 3) == 0) {
                    // Whole chunk, 16-byte aligned rows: vector loads, the same sum order.
                    const float4 *x4 = (const float4 *)xr;
                    for (int i = 0; i < 8; ++i) {
                        float4 a = x4[i];
                        s += wv[4 * i] * a.x;
                        s += wv[4 * i + 1] * a.y;
                        s += wv[4 * i + 2] * a.z;
                        s += wv[4 * i + 3] * a.w;
                    }
                } else {
                    for (int i = 0; i < m; ++i) s += wv[i] * xr[i];
                }
                acc[k] += s;
            }
        }
    }
#pragma unroll
    for (int k = 0; k < MF_MM_T; ++k) {
        // `k < kt` is the same for every thread: the block sum's barriers stay uniform.
        if (k >= kt) break;
        float s = mf_block_sum(acc[k], red);
        int t = t0 + k;
        if (threadIdx.x == 0) {
            if (bias) s += bias[o];
            y[(u64)t * n_out + o] = s;
        }
    }
}

// out[t] = row ids[t] of a table (weights of `ty`, or f32 activations), dequantized.
extern "C" __global__ void mf_get_rows(int ty, const u8 *w, u64 row_bytes, const int *ids,
                                       float *out, int ne0) {
    MF_PDL_ENTRY();
    int t = blockIdx.x;
    const u8 *row = w + (u64)ids[t] * row_bytes;
    int nch = (ne0 + 31) / 32;
    float v[32];
    for (int c = threadIdx.x; c < nch; c += blockDim.x) {
        mf_deq32(ty, row, c, ne0, v);
        int m = min(32, ne0 - c * 32);
        for (int i = 0; i < m; ++i) out[(u64)t * ne0 + c * 32 + i] = v[i];
    }
}
