// Warp-tiled attention over f16 K/V for head dims 64 and 128 and at most MF_AW_G query heads
// per KV head: the kernel every query of such a model runs, one token or many (so a query's
// bits never depend on what shares its forward). Block (kv head, group of QT queries, chunk
// of MF_AW_CHUNK window rows), 4 warps; the group's queries share each K/V row the block
// reads when their windows list the same cells for the rows they share (one sequence's
// queries do); otherwise each query runs in a pass of its own.
//
// A query's arithmetic, fixed by its q and its window alone:
// - The window's logical rows are cut into chunks of MF_AW_CHUNK; warp w of a chunk takes its
//   32 rows [32 w, 32 w + 32) (lane = row for the scores).
// - Per warp and query head: s_j = (e + o) * scale, where e and o are the dot products over
//   the even and the odd d of q_d k_jd, each an fma chain in increasing d; m = max s_j
//   (order-free); p_j = exp(s_j - m); l = the butterfly sum of the p_j; o_d = the fma chain of
//   p_j v_jd over j in increasing order from 0. Rows past a query's window are left out.
// - The four warps' states merge in warp order: M = max over the warps holding rows, then L
//   and O folded with fma by a = exp(m_w - M) (the combine's formula); then the chunks merge
//   the same way in chunk order (by the block that finishes last: an atomic count per
//   group), out = O / L. A window within one chunk is written as O / L directly: the same
//   bits (its merge weights are exp(0) = 1).
#define MF_AW_CHUNK 128
#define MF_AW_G 8

// Whether windows a and b list the same cell for every logical row both hold.
__device__ __forceinline__ bool mf_win_prefix_eq(const int *a, const int *b, int width) {
    if (width == 2) return a[0] == b[0];
    int ia = 0, ib = 0, oa = 0, ob = 0; // run index and rows used of it, per window
    while (ia < MF_WIN_RUNS && ib < MF_WIN_RUNS) {
        if (oa >= a[2 * ia + 1]) {
            ++ia;
            oa = 0;
            continue;
        }
        if (ob >= b[2 * ib + 1]) {
            ++ib;
            ob = 0;
            continue;
        }
        if (a[2 * ia] + oa != b[2 * ib] + ob) return false;
        int n = min(a[2 * ia + 1] - oa, b[2 * ib + 1] - ob);
        oa += n;
        ob += n;
    }
    return true;
}

// out = the first `n_live` chunk partials of one (query, head) merged in chunk order, by one
// warp (lane owns d = lane + 32 c); an empty window (n_live 0) gives zeros.
template <int DPL>
__device__ __forceinline__ void mf_aw_combine(const float *pr, float *orow, int n_live,
                                              int lane) {
    constexpr int HD = 32 * DPL;
    constexpr int ST = HD + 2;
    float mx = MF_MINF;
    for (int s = lane; s < n_live; s += 32) {
        if (__ldcg(pr + (u64)s * ST + 1) > 0.0f) mx = fmaxf(mx, __ldcg(pr + (u64)s * ST));
    }
    mx = mf_warp_max(mx);
    float l = 0.0f, acc[DPL];
#pragma unroll
    for (int c = 0; c < DPL; ++c) acc[c] = 0.0f;
    for (int s0 = 0; s0 < n_live; s0 += 32) {
        int s = s0 + lane;
        float ls = s < n_live ? __ldcg(pr + (u64)s * ST + 1) : 0.0f;
        float as = ls > 0.0f ? expf(__ldcg(pr + (u64)s * ST) - mx) : 0.0f;
        int nb = min(32, n_live - s0);
        for (int i0 = 0; i0 < nb; i0 += 16) {
            float ov[16][DPL];
#pragma unroll
            for (int k = 0; k < 16; ++k)
#pragma unroll
                for (int c = 0; c < DPL; ++c)
                    ov[k][c] = i0 + k < nb
                                   ? __ldcg(pr + (u64)(s0 + i0 + k) * ST + 2 + lane + 32 * c)
                                   : 0.0f;
#pragma unroll
            for (int k = 0; k < 16; ++k) {
                float a = __shfl_sync(0xffffffffu, as, (i0 + k) & 31);
                float lk = __shfl_sync(0xffffffffu, ls, (i0 + k) & 31);
                if (i0 + k < nb && lk > 0.0f) {
                    l = __fmaf_rn(lk, a, l);
#pragma unroll
                    for (int c = 0; c < DPL; ++c) acc[c] = __fmaf_rn(ov[k][c], a, acc[c]);
                }
            }
        }
    }
#pragma unroll
    for (int c = 0; c < DPL; ++c) orow[lane + 32 * c] = l > 0.0f ? __fdiv_rn(acc[c], l) : 0.0f;
}

// Dynamic shared memory: HD * QT * GB floats of q, 4 * 32 * QT * GB of p, 4 * 32 cells; the
// warps' merge reuses it (3 * (2 + HD) * QT * GB floats). ST (staged K): after the larger of
// the two (at a 16-byte boundary), each warp's 32 K rows of the tile, MF_AW_KS(HD) bytes a row.
//
// ST: how the K rows reach the lanes, never what they hold. Unstaged, lane j loads its own
// row (HD / 8 16-byte loads, each touching 32 rows' lines: the L1 serves one line a cycle);
// staged, the warp copies its 32 rows into shared memory by cp.async, two rows an
// instruction (coalesced), rows past the window zero-filled as the lanes would load them,
// and lane j reads its row from there (rows MF_AW_KS apart: no bank conflicts). The same
// values meet the same arithmetic: the same bits.
//
// GB: query heads of the KV group a block holds (MF_AW_G: the whole group; fewer: the group's
// heads shared out over ceil(G / GB) blocks, blockIdx.x = kv head * that + part, each block
// reading the same K/V rows). A head's arithmetic involves no other head (its scores, softmax
// state, sums and merges are its own), so how the heads are shared out changes the grid and
// the loads, never a bit; fewer heads a block is more blocks for a short decode window.
#define MF_AW_KS(HD) (2 * (HD) + 16)

// Where the staged K rows start (bytes into the dynamic shared memory).
template <int HD, int QG> __device__ constexpr int mf_aw_stage_at() {
    constexpr int tile = HD * QG + 4 * 32 * QG + 4 * 32; // floats: q, p, cells
    constexpr int merge = 3 * QG * (2 + HD);            // floats: the warps' merge
    return ((tile > merge ? tile : merge) * 4 + 15) / 16 * 16;
}

template <int QT, int DPL, int GB, bool ST>
__device__ __forceinline__ void mf_attn_w(const float *q, const u8 *k, const u8 *v,
                                          const int *win, float *part, float *out, int *count,
                                          u64 row_bytes, int n_head, int n_head_kv, int width,
                                          float scale, int n_split, int ne1) {
    constexpr int HD = 32 * DPL;
    constexpr int QG = QT * GB; // (query, head) slots of the block: qi * GB + g
    extern __shared__ float sh[];
    float *qs = sh;           // [HD][QG]
    float *ps = qs + HD * QG; // [warp][row][QG]
    u32 *cs = (u32 *)(ps + 4 * 32 * QG);
    __shared__ int is_last;
    MF_PDL_ENTRY();
    const int G = n_head / n_head_kv;
    const int n_hb = (G + GB - 1) / GB; // blocks a KV group's heads are shared out over
    const int hk = blockIdx.x / n_hb, hb = blockIdx.x % n_hb, tq = blockIdx.y, sp = blockIdx.z;
    const int g0 = hb * GB;            // the group's first head this block holds
    const int gn = min(GB, G - g0);    // and how many
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int t0 = tq * QT;
    u32 len[QT];
    u32 maxlen = 0;
#pragma unroll
    for (int i = 0; i < QT; ++i) {
        len[i] = t0 + i < ne1 ? mf_win_len(win + (u64)(t0 + i) * width, width) : 0;
        maxlen = max(maxlen, len[i]);
    }
    const int n_chunks = (int)((maxlen + MF_AW_CHUNK - 1) / MF_AW_CHUNK);
    if (sp >= n_chunks) {
        // Past every window of the group; with all of them empty, block 0 writes the zeros.
        if (sp == 0) {
            for (int e = tid; e < QT * gn * HD; e += blockDim.x) {
                int qi = e / (gn * HD), r = e % (gn * HD);
                if (t0 + qi < ne1) out[((u64)(t0 + qi) * n_head + hk * G + g0) * HD + r] = 0.0f;
            }
        }
        MF_PDL_TRIGGER();
        return;
    }
    // The longest window gives the cells; a query whose window lists other cells for the
    // rows they share runs in a pass of its own (queries of one sequence never do).
    int longest = 0;
#pragma unroll
    for (int i = QT - 1; i >= 0; --i)
        if (len[i] == maxlen) longest = i;
    const int *wl = win + (u64)(t0 + longest) * width;
    bool shared_cells = true;
#pragma unroll
    for (int i = 0; i < QT; ++i)
        if (len[i] > 0 && !mf_win_prefix_eq(win + (u64)(t0 + i) * width, wl, width))
            shared_cells = false;
    for (int e = tid; e < QG * HD; e += blockDim.x) {
        int slot = e / HD, d = e % HD;
        int qi = slot / GB, g = slot % GB;
        float x = 0.0f;
        if (t0 + qi < ne1 && g < gn) x = q[((u64)(t0 + qi) * n_head + hk * G + g0 + g) * HD + d];
        qs[d * QG + slot] = x;
    }
    __syncthreads();
    float o[QG][DPL], m[QG], l[QG];
#pragma unroll
    for (int i = 0; i < QG; ++i) {
        m[i] = MF_MINF;
        l[i] = 0.0f;
#pragma unroll
        for (int c = 0; c < DPL; ++c) o[i][c] = 0.0f;
    }
    const u32 j0 = (u32)sp * MF_AW_CHUNK + (u32)warp * 32; // this warp's rows
    const u32 j = j0 + lane;
    const u64 hoff = (u64)hk * HD * 2;
    float *pw = ps + warp * 32 * QG;
    u32 *cw = cs + warp * 32;
    const int n_pass = shared_cells ? 1 : QT;
    for (int pass = 0; pass < n_pass; ++pass) {
        // One pass: every query (shared cells), or query `pass` alone (the others' rows all
        // left out, which leaves their states exactly as they are).
        u32 plen[QT], pmax = 0;
#pragma unroll
        for (int i = 0; i < QT; ++i) {
            plen[i] = shared_cells || i == pass ? len[i] : 0;
            pmax = max(pmax, plen[i]);
        }
        if (j0 >= pmax) continue; // uniform over the warp
        const int *w0 = shared_cells ? wl : win + (u64)(t0 + pass) * width;
        const bool on = j < pmax;
        const u32 cell = on ? mf_win_cell(w0, width, j) : 0;
        cw[lane] = cell;
        // This lane's K row and the V elements of this lane in every row: every load issued
        // before any arithmetic (one memory round trip a tile).
        uint4 kr[HD / 8];
        const uint4 *kp = (const uint4 *)(k + (u64)cell * row_bytes + hoff);
        if (!ST) {
#pragma unroll
            for (int i = 0; i < HD / 8; ++i) kr[i] = on ? kp[i] : make_uint4(0, 0, 0, 0);
        }
        __syncwarp();
        const int nj = (int)min(32u, pmax - j0);
        u8 *kst = (u8 *)sh + mf_aw_stage_at<HD, QG>() + warp * 32 * MF_AW_KS(HD);
        if (ST) {
            constexpr int PR = HD / 8; // 16-byte pieces a row
#pragma unroll
            for (int it = 0; it < PR; ++it) {
                const int e = it * 32 + lane, r = e / PR, pc = e % PR;
                const u8 *src = k + (u64)cw[r] * row_bytes + hoff + 16 * pc;
                mf_cp16(mf_smem_addr(kst + r * MF_AW_KS(HD) + 16 * pc), src, r < nj ? 16 : 0);
            }
            mf_cp_commit();
        }
        u32 vr[32][DPL / 2];
#pragma unroll
        for (int r = 0; r < 32; ++r) {
            const u32 *vp = (const u32 *)(v + (u64)cw[r] * row_bytes + hoff) + lane * (DPL / 2);
#pragma unroll
            for (int c = 0; c < DPL / 2; ++c) vr[r][c] = r < nj ? vp[c] : 0u;
        }
        if (ST) {
            mf_cp_wait<0>();
            __syncwarp();
        }
        float se[QG], so[QG];
#pragma unroll
        for (int i = 0; i < QG; ++i) se[i] = so[i] = 0.0f;
#pragma unroll
        for (int i = 0; i < HD / 8; ++i) {
            const uint4 kq =
                ST ? *(const uint4 *)(kst + lane * MF_AW_KS(HD) + 16 * i) : kr[i];
            const u32 words[4] = {kq.x, kq.y, kq.z, kq.w};
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const float k0 = mf_h2f((u16)(words[c] & 0xffffu));
                const float k1 = mf_h2f((u16)(words[c] >> 16));
                const int d = i * 8 + 2 * c;
                if (QG % 4 == 0) {
                    const float4 *q0 = (const float4 *)(qs + d * QG);
                    const float4 *q1 = (const float4 *)(qs + (d + 1) * QG);
#pragma unroll
                    for (int s4 = 0; s4 < QG / 4; ++s4) {
                        const float4 a = q0[s4], b = q1[s4];
                        se[4 * s4 + 0] = __fmaf_rn(a.x, k0, se[4 * s4 + 0]);
                        se[4 * s4 + 1] = __fmaf_rn(a.y, k0, se[4 * s4 + 1]);
                        se[4 * s4 + 2] = __fmaf_rn(a.z, k0, se[4 * s4 + 2]);
                        se[4 * s4 + 3] = __fmaf_rn(a.w, k0, se[4 * s4 + 3]);
                        so[4 * s4 + 0] = __fmaf_rn(b.x, k1, so[4 * s4 + 0]);
                        so[4 * s4 + 1] = __fmaf_rn(b.y, k1, so[4 * s4 + 1]);
                        so[4 * s4 + 2] = __fmaf_rn(b.z, k1, so[4 * s4 + 2]);
                        so[4 * s4 + 3] = __fmaf_rn(b.w, k1, so[4 * s4 + 3]);
                    }
                } else { // fewer slots than a float4: the same fma chains, a slot at a time
#pragma unroll
                    for (int i2 = 0; i2 < QG; ++i2) {
                        se[i2] = __fmaf_rn(qs[d * QG + i2], k0, se[i2]);
                        so[i2] = __fmaf_rn(qs[(d + 1) * QG + i2], k1, so[i2]);
                    }
                }
            }
        }
#pragma unroll
        for (int i = 0; i < QG; ++i) {
            const bool in = j < plen[i / GB];
            const float sv = in ? __fmul_rn(__fadd_rn(se[i], so[i]), scale) : MF_MINF;
            const float mt = mf_warp_max(sv);
            const float p = in ? expf(sv - mt) : 0.0f;
            const float lt = mf_warp_sum(p);
            pw[lane * QG + i] = p;
            if (mt != MF_MINF) { // this pass holds rows of the slot (at most one pass does)
                m[i] = mt;
                l[i] = lt;
            }
        }
        __syncwarp();
#pragma unroll
        for (int r = 0; r < 32; ++r) {
            float vf[DPL];
#pragma unroll
            for (int c = 0; c < DPL / 2; ++c) {
                vf[2 * c] = mf_h2f((u16)(vr[r][c] & 0xffffu));
                vf[2 * c + 1] = mf_h2f((u16)(vr[r][c] >> 16));
            }
            if (QG % 4 == 0) {
                const float4 *pp = (const float4 *)(pw + r * QG);
#pragma unroll
                for (int s4 = 0; s4 < QG / 4; ++s4) {
                    const float4 p4 = pp[s4];
                    const float pv[4] = {p4.x, p4.y, p4.z, p4.w};
#pragma unroll
                    for (int u = 0; u < 4; ++u) {
                        const int i = 4 * s4 + u;
                        if (j0 + r < plen[i / GB]) {
#pragma unroll
                            for (int c = 0; c < DPL; ++c)
                                o[i][c] = __fmaf_rn(pv[u], vf[c], o[i][c]);
                        }
                    }
                }
            } else {
#pragma unroll
                for (int i = 0; i < QG; ++i) {
                    const float pv = pw[r * QG + i];
                    if (j0 + r < plen[i / GB]) {
#pragma unroll
                        for (int c = 0; c < DPL; ++c) o[i][c] = __fmaf_rn(pv, vf[c], o[i][c]);
                    }
                }
            }
        }
        __syncwarp();
    }
    MF_PDL_TRIGGER();
    // The warps' states merge in warp order (warp 0 does it; lane L of every warp owns the
    // same elements, d = lane * DPL + c).
    __syncthreads();
    float *mw = sh; // [3][QG] m, then [3][QG] l, then [3][QG][HD] o
    float *lw = mw + 3 * QG;
    float *ow = lw + 3 * QG;
    if (warp > 0) {
#pragma unroll
        for (int i = 0; i < QG; ++i) {
            if (lane == 0) {
                mw[(warp - 1) * QG + i] = m[i];
                lw[(warp - 1) * QG + i] = l[i];
            }
#pragma unroll
            for (int c = 0; c < DPL; ++c)
                ow[((warp - 1) * QG + i) * HD + lane * DPL + c] = o[i][c];
        }
    }
    __syncthreads();
    const bool direct = n_chunks == 1;
    if (warp == 0) {
#pragma unroll
        for (int i = 0; i < QG; ++i) {
            const int qi = i / GB, g = i % GB;
            if (t0 + qi >= ne1 || g >= gn) continue;
            float M = l[i] > 0.0f ? m[i] : MF_MINF;
#pragma unroll
            for (int w = 0; w < 3; ++w)
                if (lw[w * QG + i] > 0.0f) M = fmaxf(M, mw[w * QG + i]);
            float L = 0.0f, O[DPL];
#pragma unroll
            for (int c = 0; c < DPL; ++c) O[c] = 0.0f;
            if (l[i] > 0.0f) {
                const float a = expf(m[i] - M);
                L = __fmaf_rn(l[i], a, L);
#pragma unroll
                for (int c = 0; c < DPL; ++c) O[c] = __fmaf_rn(o[i][c], a, O[c]);
            }
#pragma unroll
            for (int w = 0; w < 3; ++w) {
                const float lv = lw[w * QG + i];
                if (lv > 0.0f) {
                    const float a = expf(mw[w * QG + i] - M);
                    L = __fmaf_rn(lv, a, L);
#pragma unroll
                    for (int c = 0; c < DPL; ++c)
                        O[c] = __fmaf_rn(ow[(w * QG + i) * HD + lane * DPL + c], a, O[c]);
                }
            }
            const u64 row = (u64)(t0 + qi) * n_head + hk * G + g0 + g;
            if (direct) {
#pragma unroll
                for (int c = 0; c < DPL; ++c)
                    out[row * HD + lane * DPL + c] = L > 0.0f ? __fdiv_rn(O[c], L) : 0.0f;
            } else {
                float *pr = part + (row * n_split + sp) * (HD + 2);
                if (lane == 0) {
                    pr[0] = M;
                    pr[1] = L;
                }
#pragma unroll
                for (int c = 0; c < DPL; ++c) pr[2 + lane * DPL + c] = O[c];
            }
        }
        if (!direct) {
            // Count this chunk done; the group's last merges the chunks.
            __threadfence();
            __syncwarp();
            if (lane == 0)
                is_last = atomicAdd(count + (u64)tq * gridDim.x + blockIdx.x, 1) == n_chunks - 1;
        }
    }
    if (direct) return;
    __syncthreads();
    if (!is_last) return;
    if (tid == 0) count[(u64)tq * gridDim.x + blockIdx.x] = 0; // ready for the next launch
    __threadfence();
    // The merge of the chunks: the warps take the slots in turn.
    for (int i = warp; i < QG; i += 4) {
        const int qi = i / GB, g = i % GB;
        if (t0 + qi >= ne1 || g >= gn) continue;
        u32 lq = 0;
#pragma unroll
        for (int k2 = 0; k2 < QT; ++k2)
            if (k2 == qi) lq = len[k2];
        const u64 row = (u64)(t0 + qi) * n_head + hk * G + g0 + g;
        const int n_live = (int)((lq + MF_AW_CHUNK - 1) / MF_AW_CHUNK);
        mf_aw_combine<DPL>(part + row * n_split * (HD + 2), out + row * HD, n_live, lane);
    }
}

#define MF_ATTN_W_KERNEL(NAME, QT, DPL, GB, ST)                                                  \
    extern "C" __global__ void __launch_bounds__(128)                                           \
        NAME(const float *q, const u8 *k, const u8 *v, const int *win, float *part, float *out, \
             int *count, u64 row_bytes, int n_head, int n_head_kv, int width, float scale,      \
             int n_split, int ne1) {                                                             \
        mf_attn_w<QT, DPL, GB, ST>(q, k, v, win, part, out, count, row_bytes, n_head,           \
                                   n_head_kv, width, scale, n_split, ne1);                       \
    }

MF_ATTN_W_KERNEL(mf_attn_w1_64, 1, 2, MF_AW_G, false)
MF_ATTN_W_KERNEL(mf_attn_w2_64, 2, 2, MF_AW_G, false)
MF_ATTN_W_KERNEL(mf_attn_w1_128, 1, 4, MF_AW_G, false)
// A KV group's heads shared out over blocks of 2 or 4 heads (one query a block: decode).
MF_ATTN_W_KERNEL(mf_attn_w1_64_h2, 1, 2, 2, false)
MF_ATTN_W_KERNEL(mf_attn_w1_64_h4, 1, 2, 4, false)
MF_ATTN_W_KERNEL(mf_attn_w1_128_h2, 1, 4, 2, false)
MF_ATTN_W_KERNEL(mf_attn_w1_128_h4, 1, 4, 4, false)
// The same with the K rows staged in shared memory (`_s`, MINFER_CUDA_ATTN_STAGE).
MF_ATTN_W_KERNEL(mf_attn_w1_64_s, 1, 2, MF_AW_G, true)
MF_ATTN_W_KERNEL(mf_attn_w2_64_s, 2, 2, MF_AW_G, true)
MF_ATTN_W_KERNEL(mf_attn_w1_128_s, 1, 4, MF_AW_G, true)
MF_ATTN_W_KERNEL(mf_attn_w1_64_h2_s, 1, 2, 2, true)
MF_ATTN_W_KERNEL(mf_attn_w1_64_h4_s, 1, 2, 4, true)
MF_ATTN_W_KERNEL(mf_attn_w1_128_h2_s, 1, 4, 2, true)
MF_ATTN_W_KERNEL(mf_attn_w1_128_h4_s, 1, 4, 4, true)
