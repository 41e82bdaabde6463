// Attention over explicit windows, any head dim up to 512: the correctness kernel. One
// 128-thread block (4 warps) per (head, query). The query's window (a span [lo, hi) when `width` is 2,
// else MF_WIN_RUNS (cell, len) runs) is walked in logical order in blocks of 32 rows with an
// online softmax, so a row's result depends only on its q row and the K/V values its window
// lists, in order. An empty window gives zeros (as on the CPU).

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

__device__ __forceinline__ float mf_kv_at(int ty, const u8 *base, u64 row_bytes, u32 cell, int e) {
    const u8 *r = base + (u64)cell * row_bytes;
    if (ty == MF_F32) return ((const float *)r)[e];
    if (ty == MF_F16) return mf_h2f(((const u16 *)r)[e]);
    const u8 *b = r + (e / 32) * 34;
    return mf_ld_f16(b) * (float)(signed char)b[2 + e % 32];
}

extern "C" __global__ void mf_attn_window(int ty, const float *q, const u8 *k, const u8 *v,
                                          const int *win, float *out, u64 row_bytes,
                                          int n_head, int n_head_kv, int hd, int width,
                                          float scale) {
    __shared__ float sc[32];
    __shared__ u32 cells[32];
    int h = blockIdx.x, t = blockIdx.y, tid = threadIdx.x;
    int lane = tid & 31, warp = tid >> 5;
    int hk = h / (n_head / n_head_kv);
    const int *w = win + (u64)t * width;
    u32 len = mf_win_len(w, width);
    const float *qr = q + ((u64)t * n_head + h) * hd;
    // This lane's share of the query (elements lane, lane + 32, ...; hd <= 512).
    float qv[16];
    for (int i = 0; i < 16; ++i) {
        int d = lane + 32 * i;
        qv[i] = d < hd ? qr[d] : 0.0f;
    }
    float o[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    float m = MF_MINF, l = 0.0f;
    for (u32 j0 = 0; j0 < len; j0 += 32) {
        // Scores: warp w takes rows 8w..8w+8 of the block, its lanes split the head dim
        // (a fixed lane order and warp tree: a row's score depends on its q and K alone).
        for (int r = 0; r < 8; ++r) {
            int jj = warp * 8 + r;
            u32 j = j0 + jj;
            float s = MF_MINF;
            u32 cell = 0;
            if (j < len) {
                cell = mf_win_cell(w, width, j);
                float acc = 0.0f;
                for (int i = 0; i < 16; ++i) {
                    int d = lane + 32 * i;
                    if (d < hd) acc += qv[i] * mf_kv_at(ty, k, row_bytes, cell, hk * hd + d);
                }
                s = mf_warp_sum(acc) * scale;
            }
            if (lane == 0) {
                sc[jj] = s;
                cells[jj] = cell;
            }
        }
        __syncthreads();
        float mb = m;
        for (int jj = 0; jj < 32; ++jj) mb = fmaxf(mb, sc[jj]);
        float alpha = expf(m - mb);
        l *= alpha;
        for (int i = 0; i < 4; ++i) o[i] *= alpha;
        for (u32 jj = 0; jj < 32 && j0 + jj < len; ++jj) {
            float pj = expf(sc[jj] - mb);
            l += pj;
            for (int i = 0; i < 4; ++i) {
                int d = tid + 128 * i;
                if (d < hd) o[i] += pj * mf_kv_at(ty, v, row_bytes, cells[jj], hk * hd + d);
            }
        }
        m = mb;
        __syncthreads();
    }
    float *orow = out + ((u64)t * n_head + h) * hd;
    for (int i = 0; i < 4; ++i) {
        int d = tid + 128 * i;
        if (d < hd) orow[d] = l > 0.0f ? o[i] / l : 0.0f;
    }
}
