// Attention over explicit windows, any head dim up to 512: the correctness kernel. One
// 128-thread block (4 warps) per (head, query). The query's window (a span [lo, hi) when `width` is 2,
// else MF_WIN_RUNS (cell, len) runs) is walked in logical order in blocks of 32 rows with an
// online softmax, so a row's result depends only on its q row and the K/V values its window
// lists, in order. An empty window gives zeros (as on the CPU).

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
    MF_PDL_ENTRY();
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

// Split-K attention (flash decoding): the window's logical rows are cut into chunks of
// MF_ATTN_CHUNK; block (h, t, s) runs the online softmax over chunk s alone and writes its
// partial (max m, sum l, unnormalised o[hd]) to `part`; mf_attn_combine merges the chunks in
// order. The cut depends only on the logical row index, so a query's bits depend on its q
// and window alone (not on the batch, nor on how many chunks the grid has: chunks past the
// window's end are empty and skipped). One 128-thread block per (head, query, chunk).
#define MF_ATTN_CHUNK 256

extern "C" __global__ void mf_attn_split(int ty, const float *q, const u8 *k, const u8 *v,
                                         const int *win, float *part, u64 row_bytes,
                                         int n_head, int n_head_kv, int hd, int width,
                                         float scale, int n_split) {
    MF_PDL_ENTRY();
    __shared__ float sc[32];
    __shared__ u32 cells[32];
    int h = blockIdx.x, t = blockIdx.y, sp = blockIdx.z, tid = threadIdx.x;
    int lane = tid & 31, warp = tid >> 5;
    int hk = h / (n_head / n_head_kv);
    const int *w = win + (u64)t * width;
    u32 len = mf_win_len(w, width);
    u32 lo = (u32)sp * MF_ATTN_CHUNK;
    u32 hi = min(len, lo + MF_ATTN_CHUNK);
    float *pr = part + (((u64)t * n_head + h) * n_split + sp) * (hd + 2);
    if (lo >= len) {
        if (tid == 0) {
            pr[0] = MF_MINF;
            pr[1] = 0.0f;
        }
        return;
    }
    const float *qr = q + ((u64)t * n_head + h) * hd;
    float qv[16];
    for (int i = 0; i < 16; ++i) {
        int d = lane + 32 * i;
        qv[i] = d < hd ? qr[d] : 0.0f;
    }
    float o[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    float m = MF_MINF, l = 0.0f;
    for (u32 j0 = lo; j0 < hi; j0 += 32) {
        for (int r = 0; r < 8; ++r) {
            int jj = warp * 8 + r;
            u32 j = j0 + jj;
            float s = MF_MINF;
            u32 cell = 0;
            if (j < hi) {
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
        for (u32 jj = 0; jj < 32 && j0 + jj < hi; ++jj) {
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
    if (tid == 0) {
        pr[0] = m;
        pr[1] = l;
    }
    for (int i = 0; i < 4; ++i) {
        int d = tid + 128 * i;
        if (d < hd) pr[2 + d] = o[i];
    }
}

// out[t][h] = the chunks' partials merged in chunk order (empty chunks skipped); an empty
// window gives zeros. One block per (head, query); the chunks' (m, l) are read in parallel
// into shared memory (`2 * n_split` floats, then the indices of the non-empty ones, then their
// weights). The list of non-empty chunks is built in parallel (a ballot per 32 chunks, the
// warps' counts in order), and the max over them is order-free. Each output element then folds
// the live chunks in order with explicit fma, its loads issued 8 at a time (the fold's order,
// and so its bits, do not depend on the batching).
extern "C" __global__ void mf_attn_combine(const float *part, float *out, int n_head, int hd,
                                           int n_split) {
    MF_PDL_ENTRY();
    extern __shared__ float cm[];
    float *ml = cm;                        // m, l of chunk s at 2s, 2s + 1
    int *live = (int *)(cm + 2 * n_split); // non-empty chunks in order, then their weights
    __shared__ int wcount[32];
    __shared__ float wmax[32];
    __shared__ int n_live;
    __shared__ float mx_s;
    int h = blockIdx.x, t = blockIdx.y;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const float *pr = part + ((u64)t * n_head + h) * n_split * (hd + 2);
    for (int s = threadIdx.x; s < n_split; s += blockDim.x) {
        ml[2 * s] = pr[(u64)s * (hd + 2)];
        ml[2 * s + 1] = pr[(u64)s * (hd + 2) + 1];
    }
    if (threadIdx.x == 0) n_live = 0;
    __syncthreads();
    // Rounds of blockDim.x chunks: warp w's 32 chunks follow warp w - 1's in order.
    float mx = MF_MINF;
    for (int s0 = 0; s0 < n_split; s0 += blockDim.x) {
        int s = s0 + threadIdx.x;
        bool on = s < n_split && ml[2 * s + 1] > 0.0f;
        if (on) mx = fmaxf(mx, ml[2 * s]);
        u32 bal = __ballot_sync(0xffffffffu, on);
        if (lane == 0) wcount[warp] = __popc(bal);
        __syncthreads();
        int before = n_live;
        for (int i = 0; i < warp; ++i) before += wcount[i];
        if (on) live[before + __popc(bal & ((1u << lane) - 1u))] = s;
        __syncthreads();
        if (threadIdx.x == 0) {
            int n = n_live;
            for (int i = 0; i < nw; ++i) n += wcount[i];
            n_live = n;
        }
        __syncthreads();
    }
    mx = mf_warp_max(mx);
    if (lane == 0) wmax[warp] = mx;
    __syncthreads();
    if (threadIdx.x == 0) {
        float m = MF_MINF;
        for (int i = 0; i < nw; ++i) m = fmaxf(m, wmax[i]);
        mx_s = m;
    }
    __syncthreads();
    int nl = n_live;
    float *wt = (float *)(live + n_split);
    for (int i = threadIdx.x; i < nl; i += blockDim.x) wt[i] = expf(ml[2 * live[i]] - mx_s);
    __syncthreads();
    float *orow = out + ((u64)t * n_head + h) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float l = 0.0f, acc = 0.0f;
        for (int i0 = 0; i0 < nl; i0 += 8) {
            float p[8];
#pragma unroll
            for (int k = 0; k < 8; ++k)
                p[k] = i0 + k < nl ? pr[(u64)live[i0 + k] * (hd + 2) + 2 + d] : 0.0f;
#pragma unroll
            for (int k = 0; k < 8; ++k) {
                if (i0 + k < nl) {
                    float a = wt[i0 + k];
                    l = __fmaf_rn(ml[2 * live[i0 + k] + 1], a, l);
                    acc = __fmaf_rn(p[k], a, acc);
                }
            }
        }
        orow[d] = l > 0.0f ? __fdiv_rn(acc, l) : 0.0f;
    }
}

// Split-K attention for grouped queries (head dim <= 128, at most 16 query heads per KV
// head): block (kv head and a slice of `gb` of its query heads, query, chunk of
// MF_GQA_CHUNK window rows) serves those heads of the group, each K/V row read once per
// block, through shared memory, in tiles of 32 rows. A head's scores, softmax and sums touch
// no other head and each of its values is one thread's fixed sequence whatever the slice,
// so `gb` (the host's MINFER_CUDA_ATTN_HEADS with MINFER_CUDA_Q8_DECODE=1, else the whole
// group) changes the grid and the repeated (L2-served) K/V loads, never a bit: a decode
// step's few chunks of a whole group of 7 left most multiprocessors idle. Per query head
// the arithmetic is fixed by the row index alone: score = the dot
// over d in order, times scale; per tile, the running max, then p = exp(s - max) folded in
// row order. Partials as mf_attn_split writes them (merged by mf_attn_combine).
#define MF_GQA_CHUNK 64

extern "C" __global__ void mf_attn_gqa(int ty, const float *q, const u8 *k, const u8 *v,
                                       const int *win, float *part, u64 row_bytes, int n_head,
                                       int n_head_kv, int hd, int width, float scale,
                                       int n_split, int gb) {
    MF_PDL_ENTRY();
    extern __shared__ float sh[];
    const int GG = n_head / n_head_kv, n_hb = (GG + gb - 1) / gb;
    const int hk = blockIdx.x / n_hb, g0 = (blockIdx.x % n_hb) * gb;
    const int G = min(gb, GG - g0); // this block's heads of the group, from g0
    int t = blockIdx.y, sp = blockIdx.z, tid = threadIdx.x;
    int kst = hd + 1; // padded K rows: the score loop's threads read different banks
    float *qs = sh;
    float *ks = qs + G * hd;
    float *vs = ks + 32 * kst;
    float *ss = vs + 32 * hd;
    float *mrow = ss + G * 32; // per head: running max, this tile's max, its rescale
    float *mnew = mrow + 16;
    float *alph = mnew + 16;
    u32 *cs = (u32 *)(alph + 16);
    const int *w = win + (u64)t * width;
    u32 len = mf_win_len(w, width);
    u32 lo = (u32)sp * MF_GQA_CHUNK;
    u32 hi = min(len, lo + MF_GQA_CHUNK);
    int h0 = hk * GG + g0;
    float *pbase = part + (((u64)t * n_head + h0) * n_split + sp) * (hd + 2);
    u64 pstride = (u64)n_split * (hd + 2); // from one head's partial to the next one's
    if (lo >= len) {
        if (tid < G) {
            pbase[tid * pstride] = MF_MINF;
            pbase[tid * pstride + 1] = 0.0f;
        }
        return;
    }
    for (int e = tid; e < G * hd; e += blockDim.x) qs[e] = q[((u64)t * n_head + h0) * hd + e];
    if (tid < G) mrow[tid] = MF_MINF;
    float o[16], l[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        o[i] = 0.0f;
        l[i] = 0.0f;
    }
    for (u32 j0 = lo; j0 < hi; j0 += 32) {
        int nj = (int)min(32u, hi - j0);
        __syncthreads();
        if (tid < 32) cs[tid] = tid < nj ? mf_win_cell(w, width, j0 + tid) : 0;
        __syncthreads();
        // A warp per row, lanes along the head dim (no index division per element).
        for (int j = tid >> 5; j < nj; j += blockDim.x >> 5) {
            for (int d = tid & 31; d < hd; d += 32) {
                ks[j * kst + d] = mf_kv_at(ty, k, row_bytes, cs[j], hk * hd + d);
                vs[j * hd + d] = mf_kv_at(ty, v, row_bytes, cs[j], hk * hd + d);
            }
        }
        __syncthreads();
        for (int p = tid; p < G * 32; p += blockDim.x) {
            int g = p >> 5, j = p & 31;
            float s = MF_MINF;
            if (j < nj) {
                float acc = 0.0f;
                for (int d = 0; d < hd; ++d) acc += qs[g * hd + d] * ks[j * kst + d];
                s = acc * scale;
            }
            ss[p] = s;
        }
        __syncthreads();
        if (tid < G) {
            float mo = mrow[tid], mb = mo;
            for (int j = 0; j < nj; ++j) mb = fmaxf(mb, ss[tid * 32 + j]);
            mnew[tid] = mb;
            alph[tid] = expf(mo - mb);
            mrow[tid] = mb;
        }
        __syncthreads();
        for (int p = tid; p < G * 32; p += blockDim.x) {
            int g = p >> 5, j = p & 31;
            ss[p] = j < nj ? expf(ss[p] - mnew[g]) : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            int e = tid + i * blockDim.x;
            if (e < G * hd) {
                int g = e / hd, d = e % hd;
                float a = alph[g];
                float li = l[i] * a, oi = o[i] * a;
                for (int j = 0; j < nj; ++j) {
                    float pj = ss[g * 32 + j];
                    li += pj;
                    oi += pj * vs[j * hd + d];
                }
                l[i] = li;
                o[i] = oi;
            }
        }
    }
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        int e = tid + i * blockDim.x;
        if (e < G * hd) {
            int g = e / hd, d = e % hd;
            float *pr = pbase + g * pstride;
            pr[2 + d] = o[i];
            if (d == 0) {
                pr[0] = mrow[g];
                pr[1] = l[i];
            }
        }
    }
}
