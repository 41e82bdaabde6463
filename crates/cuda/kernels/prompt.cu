// Prompt-row kernels (docs/PRECISION.md "Row classes", ADR 0011): the operands of the
// cuBLASLt GEMM (weights dequantized to f16 or bf16, activations rounded to the same type),
// the bias the GEMM leaves out, and FlashAttention-2-shaped attention on f16 tensor cores.
// Each computes a row's result from that row alone, so a prompt row's bits never depend on
// the chunk it came in nor on the other rows of the forward.

__device__ __forceinline__ u16 mf_f2bf(float f) {
    u16 h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

// Two floats as one f16x2 (or bf16x2) word, `lo` in the low half.
__device__ __forceinline__ u32 mf_pack2(float lo, float hi, int bf16) {
    u32 r;
    if (bf16)
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    else
        asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// One 32-element chunk of a Q6_K row without the per-element index arithmetic of
// `mf_deq32` (the same values: d * scale, times the 6-bit value minus 32).
__device__ __forceinline__ void mf_deq32_q6k(const u8 *row, int c, float *o) {
    const u8 *b = row + (u64)(c / 8) * 210;
    int s = c % 8;
    float d = mf_ld_f16(b + 208);
    const u8 *ql = b + 64 * (s / 4) + 32 * (s % 2);
    const u8 *qh = b + 128 + 32 * (s / 4);
    int shl = 4 * ((s % 4) / 2), shh = 2 * (s % 4);
    float d0 = d * (float)(signed char)b[192 + 2 * s];
    float d1 = d * (float)(signed char)b[192 + 2 * s + 1];
#pragma unroll
    for (int i = 0; i < 32; ++i) {
        int q = ((ql[i] >> shl) & 15) | (((qh[i] >> shh) & 3) << 4);
        o[i] = (i < 16 ? d0 : d1) * (float)(q - 32);
    }
}

// A quantized matrix (`ne1` rows of `ne0`, `row_bytes` apart, contiguous) as row-major f16
// (bf16 when `bf16`). A block takes 256 consecutive 32-element chunks of the matrix: their
// bytes (a whole number of storage blocks, starting 16-byte aligned) come in by coalesced
// 16-byte loads to shared memory, then a thread dequantizes one chunk from there
// (`mf_deq32`'s formulas) and writes its 64 bytes of f16 in four 16-byte stores.
#define MF_DQ_T 256
extern "C" __global__ void __launch_bounds__(256) mf_deq_half(int ty, const u8 *w, u64 row_bytes,
                                                              u16 *out, int ne0, int ne1,
                                                              int bf16) {
    __shared__ __align__(16) u8 raw[MF_DQ_T * 34];
    MF_PDL_ENTRY();
    u64 total = (u64)ne1 * ((u32)ne0 / 32);
    u64 t0 = (u64)blockIdx.x * MF_DQ_T;
    u64 tend = min(t0 + MF_DQ_T, total);
    int kq = ty == MF_Q4_K || ty == MF_Q6_K;
    int cb = ty == MF_Q8_0 ? 34 : ty == MF_Q4_0 ? 18 : ty == MF_Q4_1 ? 20 : ty == MF_Q5_0 ? 22 : 0;
    int sb = ty == MF_Q4_K ? 144 : 210;
    u64 b0 = kq ? (t0 / 8) * sb : t0 * cb;
    u64 b1 = kq ? (tend / 8) * sb : tend * cb;
    u64 n = b1 - b0;
    const u8 *src = w + b0;
    for (u64 i = (u64)threadIdx.x * 16; i + 16 <= n; i += 256 * 16)
        *(uint4 *)(raw + i) = *(const uint4 *)(src + i);
    for (u64 i = (n / 16) * 16 + threadIdx.x; i < n; i += 256) raw[i] = src[i];
    __syncthreads();
    u64 c = t0 + threadIdx.x;
    if (c < total) {
        float o[32];
        if (ty == MF_Q6_K)
            mf_deq32_q6k(raw, threadIdx.x, o);
        else
            mf_deq32(ty, raw, threadIdx.x, 1 << 30, o);
        uint4 *dst = (uint4 *)(out + c * 32);
#pragma unroll
        for (int v = 0; v < 4; ++v) {
            uint4 q;
            q.x = mf_pack2(o[8 * v + 0], o[8 * v + 1], bf16);
            q.y = mf_pack2(o[8 * v + 2], o[8 * v + 3], bf16);
            q.z = mf_pack2(o[8 * v + 4], o[8 * v + 5], bf16);
            q.w = mf_pack2(o[8 * v + 6], o[8 * v + 7], bf16);
            dst[v] = q;
        }
    }
    (void)row_bytes;
    MF_PDL_TRIGGER();
}

// `n` f32 activations rounded to f16 (bf16), four a thread (`n` a multiple of 4).
extern "C" __global__ void mf_to_half(const float *x, u16 *y, u64 n, int bf16) {
    MF_PDL_ENTRY();
    u64 i = ((u64)blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (i < n) {
        float4 v = *(const float4 *)(x + i);
        uint2 q;
        q.x = mf_pack2(v.x, v.y, bf16);
        q.y = mf_pack2(v.z, v.w, bf16);
        *(uint2 *)(y + i) = q;
    }
    MF_PDL_TRIGGER();
}

// y[t][o] += bias[o] over `total` = rows x n_out outputs.
extern "C" __global__ void mf_bias_rows(float *y, const float *bias, int n_out, u64 total) {
    MF_PDL_ENTRY();
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) y[i] = __fadd_rn(y[i], bias[i % (u64)n_out]);
    MF_PDL_TRIGGER();
}

// ---------------------------------------------------------------------------------------
// Prompt-row attention: a block of 4 warps takes 64 consecutive queries of one head (16 a
// warp) whose windows are prefixes of one cell list (the host cuts the rows into such
// segments: one sequence's prompt chunk), walks that list in tiles of 64 keys from logical
// row 0 (K and V tiles through shared memory by cp.async, the next tile's K loading while
// this one's P·V runs), S = Q·Kᵀ and P·V on mma.sync m16n8k16 (f16 operands, f32
// accumulators), the softmax online in registers. A query's keys past its own window are
// masked to exactly nothing (p = +0, the running max and sum untouched, the rescale skipped),
// so the tiles a longer neighbour adds change none of its bits: its result depends on its
// window's values alone. Windows longer than MF_FA_SPLIT keys are cut at fixed multiples of
// it over the grid's z; each split writes a partial and mf_attn_combine merges the live ones
// in order (one live split: the same o / l the unsplit launch writes).
//
// A q8_0 cache (cells of 34-byte blocks: an f16 scale, 32 int8) takes the same path: a tile's
// raw blocks come in by cp.async (a head's HD values are 17 copies of HD/16 bytes: q8_0
// blocks are only 2-byte aligned, a head's run of them is HD/16-aligned), then the block
// dequantizes them into one shared f16 tile (each value d * q, exact in f32, rounded once to
// f16: the reference's value rounded once) that S = Q·Kᵀ, and after it P·V, read as they read
// an f16 cache's tiles. Every other step is the f16 kernel's, so the masking rule holds
// unchanged.

#define MF_FA_Q 64
#define MF_FA_K 64
// Logical keys per split of a long window (a multiple of MF_FA_K; prompt.rs `FA_SPLIT`).
#define MF_FA_SPLIT 1024

__device__ __forceinline__ void mf_mma_f16(float *d, const u32 *a, u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// One 64-key tile of K or V rows (f16 cells of `row_bytes`, the head's `HD` values at
// `head_off`) into shared rows of `HD + 8` halves; rows past the window are zero-filled.
template <int HD>
__device__ __forceinline__ void mf_fa_load(u16 *dst, const u8 *base, u64 row_bytes, u64 head_off,
                                           const int *wl, int width, u32 lmax, u32 tile) {
    const int CH = HD / 8;
    for (int i = threadIdx.x; i < MF_FA_K * CH; i += blockDim.x) {
        int j = i / CH, ch = i % CH;
        u32 kl = tile * MF_FA_K + (u32)j;
        u32 sa = mf_smem_addr(dst + j * (HD + 8) + ch * 8);
        if (kl < lmax) {
            u64 cell = mf_win_cell(wl, width, kl);
            mf_cp16(sa, base + cell * row_bytes + head_off + (u64)ch * 16, 16);
        } else {
            mf_cp16(sa, base, 0);
        }
    }
}

// One 64-key tile of a q8_0 cache's K or V blocks for one head (HD / 32 blocks, 17 * HD / 16
// bytes at `head_off` of each cell) into shared rows of those bytes, packed; rows past the
// window are zero-filled (scale 0, so their f16 values are +0 and a masked P·V term is 0).
template <int HD>
__device__ __forceinline__ void mf_fa_load_q8(u8 *dst, const u8 *base, u64 row_bytes,
                                              u64 head_off, const int *wl, int width, u32 lmax,
                                              u32 tile) {
    const int CP = HD / 16, RB = 17 * CP;
    for (int i = threadIdx.x; i < MF_FA_K * 17; i += blockDim.x) {
        int j = i / 17, ch = i % 17;
        u32 kl = tile * MF_FA_K + (u32)j;
        u32 sa = mf_smem_addr(dst + j * RB + ch * CP);
        if (kl < lmax) {
            u64 cell = mf_win_cell(wl, width, kl);
            mf_cp_small<CP>(sa, base + cell * row_bytes + head_off + (u64)ch * CP, CP);
        } else {
            mf_cp_small<CP>(sa, base, 0);
        }
    }
}

// The raw q8_0 tile `raw` as f16 rows of `HD + 8` halves (the layout mf_fa_load gives an f16
// cache): a thread takes 8 values of one block at a time, d * q exact in f32, rounded once.
template <int HD>
__device__ __forceinline__ void mf_fa_deq_q8(u16 *dst, const u8 *raw) {
    const int S = HD + 8, RB = HD / 32 * 34, U = HD / 8;
    for (int u = threadIdx.x; u < MF_FA_K * U; u += blockDim.x) {
        int j = u / U, c = u % U;
        const u8 *b = raw + j * RB + (c / 4) * 34;
        float d = mf_h2f(*(const u16 *)b);
        const u16 *qp = (const u16 *)(b + 2 + 8 * (c % 4));
        u32 w[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            u32 pr = qp[k];
            float lo = d * (float)(signed char)(pr & 0xff);
            float hi = d * (float)(signed char)(pr >> 8);
            w[k] = mf_pack2(lo, hi, 0);
        }
        *(uint4 *)(dst + j * S + c * 8) = make_uint4(w[0], w[1], w[2], w[3]);
    }
}

// Shared bytes of mf_fa (prompt.rs `FaKernel::of`): f16 KV, a K and a V tile of f16 rows; q8_0,
// one f16 tile (K's, then V's) and the raw K and V blocks.
template <int HD, bool Q8>
__device__ __forceinline__ void mf_fa(const float *q, const u8 *kc, const u8 *vc, const int *win,
                                      float *out, float *part, u64 row_bytes, int n_head,
                                      int n_head_kv, int width, float scale, int n_q,
                                      int n_split) {
    extern __shared__ __align__(16) u16 mf_fa_smem[];
    const int S = HD + 8;
    u16 *ks = mf_fa_smem, *vs = Q8 ? mf_fa_smem : mf_fa_smem + MF_FA_K * S;
    u8 *kraw = (u8 *)(mf_fa_smem + MF_FA_K * S), *vraw = kraw + MF_FA_K * (HD / 32 * 34);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int h = blockIdx.y, hk = h / (n_head / n_head_kv);
    int q0 = blockIdx.x * MF_FA_Q;
    MF_PDL_ENTRY();
    int last = min(q0 + MF_FA_Q - 1, n_q - 1);
    const int *wl = win + (u64)last * width;
    u32 lmax = mf_win_len(wl, width);
    // The head's first byte in a cell: HD f16 values, or HD / 32 q8_0 blocks.
    u64 head_off = Q8 ? (u64)hk * (HD / 32 * 34) : (u64)hk * HD * 2;
    // This block's split of the keys: MF_FA_SPLIT logical rows from split * MF_FA_SPLIT (a
    // constant, so a query's splits are fixed by its window alone).
    u32 ntiles = (lmax + MF_FA_K - 1) / MF_FA_K;
    u32 t_begin = blockIdx.z * (MF_FA_SPLIT / MF_FA_K);
    u32 t_end = min(ntiles, t_begin + MF_FA_SPLIT / MF_FA_K);
    if (Q8) {
        mf_fa_load_q8<HD>(kraw, kc, row_bytes, head_off, wl, width, lmax, t_begin);
        mf_cp_commit();
        mf_fa_load_q8<HD>(vraw, vc, row_bytes, head_off, wl, width, lmax, t_begin);
    } else {
        mf_fa_load<HD>(ks, kc, row_bytes, head_off, wl, width, lmax, t_begin);
        mf_cp_commit();
        mf_fa_load<HD>(vs, vc, row_bytes, head_off, wl, width, lmax, t_begin);
    }
    mf_cp_commit();

    int r0 = q0 + warp * 16 + g, r1 = r0 + 8;
    u32 len0 = r0 < n_q ? mf_win_len(win + (u64)r0 * width, width) : lmax;
    u32 len1 = r1 < n_q ? mf_win_len(win + (u64)r1 * width, width) : lmax;
    const int qs = n_head * HD;
    const float *qa = q + (u64)min(r0, n_q - 1) * qs + h * HD;
    const float *qb = q + (u64)min(r1, n_q - 1) * qs + h * HD;
    u32 qf[HD / 16][4];
#pragma unroll
    for (int c = 0; c < HD / 16; ++c) {
        float2 a0 = *(const float2 *)(qa + 16 * c + 2 * t);
        float2 b0 = *(const float2 *)(qb + 16 * c + 2 * t);
        float2 a1 = *(const float2 *)(qa + 16 * c + 8 + 2 * t);
        float2 b1 = *(const float2 *)(qb + 16 * c + 8 + 2 * t);
        qf[c][0] = mf_pack2(a0.x, a0.y, 0);
        qf[c][1] = mf_pack2(b0.x, b0.y, 0);
        qf[c][2] = mf_pack2(a1.x, a1.y, 0);
        qf[c][3] = mf_pack2(b1.x, b1.y, 0);
    }
    float o[HD / 8][4];
#pragma unroll
    for (int j = 0; j < HD / 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float m0 = MF_MINF, m1 = MF_MINF, l0 = 0.0f, l1 = 0.0f;
    const float sl = scale * 1.4426950408889634f;
    for (u32 tile = t_begin; tile < t_end; ++tile) {
        // K's tile is in (the wait leaves only the last group, V's, in flight), and every
        // warp is past the last tile's P·V (the f16 tile is free to rewrite).
        mf_cp_wait1();
        __syncthreads();
        if (Q8) {
            mf_fa_deq_q8<HD>(ks, kraw);
            __syncthreads();
            // The raw K blocks are read: the next tile's come in during S, softmax and P·V.
            if (tile + 1 < t_end)
                mf_fa_load_q8<HD>(kraw, kc, row_bytes, head_off, wl, width, lmax, tile + 1);
            mf_cp_commit();
        }
        float s[8][4];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
            const u16 *kr = ks + (8 * j + g) * S + 2 * t;
#pragma unroll
            for (int c = 0; c < HD / 16; ++c)
                mf_mma_f16(s[j], qf[c], *(const u32 *)(kr + 16 * c), *(const u32 *)(kr + 16 * c + 8));
        }
        if (!Q8) {
            __syncthreads();
            if (tile + 1 < t_end)
                mf_fa_load<HD>(ks, kc, row_bytes, head_off, wl, width, lmax, tile + 1);
            mf_cp_commit();
        }
        // Scale and mask (logical key index against each row's window), then the online
        // softmax: the row's max over its quad, the rescale only when the max moved.
        float mx0 = MF_MINF, mx1 = MF_MINF;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            u32 key = tile * MF_FA_K + 8 * j + 2 * t;
            s[j][0] = key < len0 ? s[j][0] * sl : MF_MINF;
            s[j][1] = key + 1 < len0 ? s[j][1] * sl : MF_MINF;
            s[j][2] = key < len1 ? s[j][2] * sl : MF_MINF;
            s[j][3] = key + 1 < len1 ? s[j][3] * sl : MF_MINF;
            mx0 = fmaxf(mx0, fmaxf(s[j][0], s[j][1]));
            mx1 = fmaxf(mx1, fmaxf(s[j][2], s[j][3]));
        }
#pragma unroll
        for (int x = 1; x < 4; x <<= 1) {
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, x));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, x));
        }
        float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
        float al0 = n0 == m0 ? 1.0f : exp2f(m0 - n0);
        float al1 = n1 == m1 ? 1.0f : exp2f(m1 - n1);
        m0 = n0;
        m1 = n1;
        float ps0 = 0.0f, ps1 = 0.0f;
        u32 pf[4][4];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            float p0 = s[j][0] == MF_MINF ? 0.0f : exp2f(s[j][0] - n0);
            float p1 = s[j][1] == MF_MINF ? 0.0f : exp2f(s[j][1] - n0);
            float p2 = s[j][2] == MF_MINF ? 0.0f : exp2f(s[j][2] - n1);
            float p3 = s[j][3] == MF_MINF ? 0.0f : exp2f(s[j][3] - n1);
            ps0 += p0 + p1;
            ps1 += p2 + p3;
            pf[j / 2][(j % 2) * 2] = mf_pack2(p0, p1, 0);
            pf[j / 2][(j % 2) * 2 + 1] = mf_pack2(p2, p3, 0);
        }
        if (al0 != 1.0f) {
            l0 *= al0;
#pragma unroll
            for (int j = 0; j < HD / 8; ++j) o[j][0] *= al0, o[j][1] *= al0;
        }
        if (al1 != 1.0f) {
            l1 *= al1;
#pragma unroll
            for (int j = 0; j < HD / 8; ++j) o[j][2] *= al1, o[j][3] *= al1;
        }
        l0 += ps0;
        l1 += ps1;
        // V's tile is in (the next K tile may still be in flight); every warp is past S.
        mf_cp_wait1();
        __syncthreads();
        if (Q8) {
            mf_fa_deq_q8<HD>(vs, vraw);
            __syncthreads();
            if (tile + 1 < t_end)
                mf_fa_load_q8<HD>(vraw, vc, row_bytes, head_off, wl, width, lmax, tile + 1);
            mf_cp_commit();
        }
        // P·V: the P fragments from the score registers (a0: rows g, keys 2t of the first
        // 8-key tile; a1: row g+8; a2, a3: the second tile), V's by ldmatrix.trans.
#pragma unroll
        for (int kc = 0; kc < 4; ++kc) {
            u32 a[4] = {pf[kc][0], pf[kc][1], pf[kc][2], pf[kc][3]};
            int mi = lane >> 3, rr = lane & 7;
            const u16 *vrow = vs + (16 * kc + rr + 8 * (mi & 1)) * S + 8 * (mi >> 1);
#pragma unroll
            for (int jp = 0; jp < HD / 16; ++jp) {
                u32 b0, b1, b2, b3;
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                             : "=r"(b0), "=r"(b1), "=r"(b2), "=r"(b3)
                             : "r"(mf_smem_addr(vrow + 16 * jp)));
                mf_mma_f16(o[2 * jp], a, b0, b1);
                mf_mma_f16(o[2 * jp + 1], a, b2, b3);
            }
        }
        if (!Q8) {
            __syncthreads();
            if (tile + 1 < t_end)
                mf_fa_load<HD>(vs, vc, row_bytes, head_off, wl, width, lmax, tile + 1);
            mf_cp_commit();
        }
    }
    MF_PDL_TRIGGER();
#pragma unroll
    for (int x = 1; x < 4; x <<= 1) {
        l0 += __shfl_xor_sync(0xffffffffu, l0, x);
        l1 += __shfl_xor_sync(0xffffffffu, l1, x);
    }
    if (n_split == 1) {
        // o / l rounded once: the bits mf_attn_combine gives a query with one live split.
        float *oa = out + (u64)r0 * qs + h * HD + 2 * t;
        float *ob = out + (u64)r1 * qs + h * HD + 2 * t;
#pragma unroll
        for (int j = 0; j < HD / 8; ++j) {
            if (r0 < n_q)
                *(float2 *)(oa + 8 * j) =
                    make_float2(__fdiv_rn(o[j][0], l0), __fdiv_rn(o[j][1], l0));
            if (r1 < n_q)
                *(float2 *)(ob + 8 * j) =
                    make_float2(__fdiv_rn(o[j][2], l1), __fdiv_rn(o[j][3], l1));
        }
        return;
    }
    // A partial in mf_attn_combine's layout (max in the natural-log domain, sum, unnormalised
    // o) per (query, head, split); a split past a query's window leaves (-inf, 0, 0).
    const float ln2 = 0.6931471805599453f;
    float mn0 = m0 == MF_MINF ? MF_MINF : m0 * ln2, mn1 = m1 == MF_MINF ? MF_MINF : m1 * ln2;
    float *pa = part + (((u64)r0 * n_head + h) * n_split + blockIdx.z) * (HD + 2);
    float *pb = part + (((u64)r1 * n_head + h) * n_split + blockIdx.z) * (HD + 2);
    if (t == 0) {
        if (r0 < n_q) pa[0] = mn0, pa[1] = l0;
        if (r1 < n_q) pb[0] = mn1, pb[1] = l1;
    }
#pragma unroll
    for (int j = 0; j < HD / 8; ++j) {
        if (r0 < n_q) pa[2 + 8 * j + 2 * t] = o[j][0], pa[3 + 8 * j + 2 * t] = o[j][1];
        if (r1 < n_q) pb[2 + 8 * j + 2 * t] = o[j][2], pb[3 + 8 * j + 2 * t] = o[j][3];
    }
}

#define MF_FA_KERNEL(NAME, HD, Q8)                                                               \
    extern "C" __global__ void __launch_bounds__(128)                                           \
        NAME(const float *q, const u8 *kc, const u8 *vc, const int *win, float *out,             \
             float *part, u64 row_bytes, int n_head, int n_head_kv, int width, float scale,      \
             int n_q, int n_split) {                                                             \
        mf_fa<HD, Q8>(q, kc, vc, win, out, part, row_bytes, n_head, n_head_kv, width, scale,     \
                      n_q, n_split);                                                             \
    }
MF_FA_KERNEL(mf_fa_64, 64, false)
MF_FA_KERNEL(mf_fa_128, 128, false)
MF_FA_KERNEL(mf_fa_q8_64, 64, true)
MF_FA_KERNEL(mf_fa_q8_128, 128, true)
