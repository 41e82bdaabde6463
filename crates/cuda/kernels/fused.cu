// The fused decode Q/K/V node (Op::QkvRopeStore without per-head norm) in two launches
// instead of seven: `mf_qkv1` computes the q, k and v rows of one token (three matrices by row
// range, each row as mf_mmvq1 computes it, plus its bias), `mf_rope_store` rotates q into the
// output and k into the K region at the token's cell, and stores v. Every value goes through
// the same device functions as the unfused MatMul → Rope → KvStore chain (mf_row1_any,
// mf_rope_cs / mf_rope_lo / mf_rope_hi, mf_f2h, mf_kv_q8_block), so the two give the same bits.

// Rows [0, q_dim) from wq, then kv_dim from wk, then kv_dim from wv, walked as mf_mmvq1
// walks its rows (mmvq.cu; a row's matrix chosen per row).
__device__ __forceinline__ void mf_qkv_row(int o, int q_dim, int kv_dim, int tyq, const u8 *wq,
                                           u64 rbq, int tyk, const u8 *wk, u64 rbk, int tyv,
                                           const u8 *wv, u64 rbv, const float *bq,
                                           const float *bk, const float *bv, int *ty,
                                           const u8 **row, u64 *rb, const float **bias,
                                           int *r) {
    if (o < q_dim) {
        *ty = tyq, *r = o, *rb = rbq, *row = wq + (u64)o * rbq, *bias = bq;
    } else if (o < q_dim + kv_dim) {
        *ty = tyk, *r = o - q_dim, *rb = rbk, *row = wk + (u64)*r * rbk, *bias = bk;
    } else {
        *ty = tyv, *r = o - q_dim - kv_dim, *rb = rbv, *row = wv + (u64)*r * rbv, *bias = bv;
    }
}

// mf_qkv1 on the pipelined walk (walk.cuh) when the three matrices are of one type it takes.
template <int TY, bool GX>
__device__ __forceinline__ void mf_qkv1_pipe(const u8 *wq, u64 rbq, const u8 *wk, u64 rbk,
                                             const u8 *wv, u64 rbv, const float *bq,
                                             const float *bk, const float *bv, const float *x,
                                             const float *gain, float eps,
                                             const signed char *__restrict__ gxq,
                                             const float2 *__restrict__ gxds, float *row,
                                             int ne0, int q_dim, int kv_dim) {
    const int n_rows = q_dim + 2 * kv_dim;
    // Row o's first byte, its bias vector and its index there (mf_qkv_row; types unread).
    const auto at = [&](int o, const float **bias, int *r) {
        int ty;
        const u8 *w;
        u64 rb;
        mf_qkv_row(o, q_dim, kv_dim, 0, wq, rbq, 0, wk, rbk, 0, wv, rbv, bq, bk, bv, &ty, &w, &rb,
                   bias, r);
        return w;
    };
    const auto row_of = [&](int o, int) {
        const float *bias;
        int r;
        return at(o, &bias, &r);
    };
    MfPipe1<TY, 1, MF_MV1_PIPE_SHORT> p;
    mf_pipe1_prime(p, row_of, n_rows, ne0 >> 5);
    MF_PDL_ENTRY();
    MF_MV1_X(GX, x, gain, eps, gxq, gxds, ne0, xq, xds);
    const auto epi = [&](int o, const float *r) {
        if ((threadIdx.x & 31) == 0) {
            const float *bias;
            int br;
            at(o, &bias, &br);
            float s = r[0];
            if (bias) s = __fadd_rn(s, bias[br]);
            row[o] = s;
        }
    };
    mf_pipe1_run(p, row_of, n_rows, xq, xds, epi);
    MF_PDL_TRIGGER();
}

template <bool GX>
__device__ __forceinline__ void mf_qkv1_body(int tyq, const u8 *wq, u64 rbq, int tyk,
                                             const u8 *wk, u64 rbk, int tyv, const u8 *wv,
                                             u64 rbv, const float *bq, const float *bk,
                                             const float *bv, const float *x, const float *gain,
                                             float eps, const signed char *__restrict__ gxq,
                                             const float2 *__restrict__ gxds, float *row,
                                             int ne0, int q_dim, int kv_dim) {
    const int n_rows = q_dim + 2 * kv_dim;
    int ty, r;
    const u8 *w;
    u64 rb;
    const float *bias;
    int o0 = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (o0 < n_rows) {
        mf_qkv_row(o0, q_dim, kv_dim, tyq, wq, rbq, tyk, wk, rbk, tyv, wv, rbv, bq, bk, bv, &ty,
                   &w, &rb, &bias, &r);
        if (MF_MV1_PREFETCH) mf_prefetch_row(w, rb);
    }
    MF_PDL_ENTRY();
    MF_MV1_X(GX, x, gain, eps, gxq, gxds, ne0, xq, xds);
    MF_MV1_ROWS(o, n_rows) {
        int nx = mf_mv1_next(o, n_rows);
        if (MF_MV1_PREFETCH > 1 && nx >= 0) {
            int tn, rn;
            const u8 *wn;
            u64 rbn;
            const float *bn;
            mf_qkv_row(nx, q_dim, kv_dim, tyq, wq, rbq, tyk, wk, rbk, tyv, wv, rbv, bq, bk, bv,
                       &tn, &wn, &rbn, &bn, &rn);
            mf_prefetch_row(wn, rbn);
        }
        mf_qkv_row(o, q_dim, kv_dim, tyq, wq, rbq, tyk, wk, rbk, tyv, wv, rbv, bq, bk, bv, &ty,
                   &w, &rb, &bias, &r);
        float s = mf_row1_any(ty, w, xq, xds, ne0 >> 5);
        if ((threadIdx.x & 31) == 0) {
            if (bias) s = __fadd_rn(s, bias[r]);
            row[o] = s;
        }
    }
    MF_PDL_TRIGGER();
}

// x as MF_MV1_X says: `mf_qkv1` quantizes it (its RMSNorm with a gain) per block,
// `mf_qkv1_gx` reads it quantized before.
extern "C" __global__ void mf_qkv1(int tyq, const u8 *wq, u64 rbq, int tyk, const u8 *wk,
                                   u64 rbk, int tyv, const u8 *wv, u64 rbv, const float *bq,
                                   const float *bk, const float *bv, const float *x,
                                   const float *gain, float eps, float *row, int ne0,
                                   int q_dim, int kv_dim) {
    mf_qkv1_body<false>(tyq, wq, rbq, tyk, wk, rbk, tyv, wv, rbv, bq, bk, bv, x, gain, eps,
                        nullptr, nullptr, row, ne0, q_dim, kv_dim);
}

extern "C" __global__ void mf_qkv1_gx(int tyq, const u8 *wq, u64 rbq, int tyk, const u8 *wk,
                                      u64 rbk, int tyv, const u8 *wv, u64 rbv, const float *bq,
                                      const float *bk, const float *bv, const signed char *xq,
                                      const float2 *xds, float *row, int ne0, int q_dim,
                                      int kv_dim) {
    mf_qkv1_body<true>(tyq, wq, rbq, tyk, wk, rbk, tyv, wv, rbv, bq, bk, bv, nullptr, nullptr,
                       0.0f, xq, xds, row, ne0, q_dim, kv_dim);
}

// mf_qkv1 on the pipelined walks with Q and K of Q4_K and V of Q6_K (llama-quantize's Q4_K_M
// gives V more bits in some layers): a warp walks its Q and K rows on the Q4_K pipeline, then
// its V rows on the Q6_K one (primed once the first is done, which keeps one pipeline's
// registers live at a time).
template <bool GX>
__device__ __forceinline__ void mf_qkv1_pipe46(const u8 *wq, u64 rbq, const u8 *wk, u64 rbk,
                                               const u8 *wv, u64 rbv, const float *bq,
                                               const float *bk, const float *bv, const float *x,
                                               const float *gain, float eps,
                                               const signed char *__restrict__ gxq,
                                               const float2 *__restrict__ gxds, float *row,
                                               int ne0, int q_dim, int kv_dim) {
    const int n_qk = q_dim + kv_dim;
    const auto qk_of = [&](int o, int) {
        return o < q_dim ? wq + (u64)o * rbq : wk + (u64)(o - q_dim) * rbk;
    };
    const auto v_of = [&](int o, int) { return wv + (u64)o * rbv; };
    MfPipe1<MF_Q4_K, 1, MF_MV1_PIPE_SHORT> pa;
    mf_pipe1_prime(pa, qk_of, n_qk, ne0 >> 5);
    MF_PDL_ENTRY();
    MF_MV1_X(GX, x, gain, eps, gxq, gxds, ne0, xq, xds);
    const auto epi_qk = [&](int o, const float *r) {
        if ((threadIdx.x & 31) == 0) {
            const float *bias = o < q_dim ? bq : bk;
            float s = r[0];
            if (bias) s = __fadd_rn(s, bias[o < q_dim ? o : o - q_dim]);
            row[o] = s;
        }
    };
    mf_pipe1_run(pa, qk_of, n_qk, xq, xds, epi_qk);
    const auto epi_v = [&](int o, const float *r) {
        if ((threadIdx.x & 31) == 0) {
            float s = r[0];
            if (bv) s = __fadd_rn(s, bv[o]);
            row[n_qk + o] = s;
        }
    };
    MfPipe1<MF_Q6_K, 1, MF_MV1_PIPE_SHORT> pb;
    mf_pipe1_prime(pb, v_of, kv_dim, ne0 >> 5);
    mf_pipe1_run(pb, v_of, kv_dim, xq, xds, epi_v);
    MF_PDL_TRIGGER();
}

// mf_qkv1 / mf_qkv1_gx on the pipelined walk, the three matrices of one type (`_p4`: Q4_K at
// 16-byte-aligned addresses, `_p6`: Q6_K at even ones; the type codes are not read).
#define MF_QKV1_PIPE_KERNELS(SUF, TY, BOUNDS)                                                      \
    extern "C" __global__ void BOUNDS mf_qkv1_##SUF(int tyq, const u8 *wq, u64 rbq, int tyk,       \
                                             const u8 *wk, u64 rbk, int tyv, const u8 *wv,      \
                                             u64 rbv, const float *bq, const float *bk,         \
                                             const float *bv, const float *x, const float *gain, \
                                             float eps, float *row, int ne0, int q_dim,         \
                                             int kv_dim) {                                       \
        mf_qkv1_pipe<TY, false>(wq, rbq, wk, rbk, wv, rbv, bq, bk, bv, x, gain, eps, nullptr,    \
                                nullptr, row, ne0, q_dim, kv_dim);                               \
    }                                                                                             \
    extern "C" __global__ void BOUNDS mf_qkv1_##SUF##_gx(int tyq, const u8 *wq, u64 rbq, int tyk,  \
                                                  const u8 *wk, u64 rbk, int tyv, const u8 *wv, \
                                                  u64 rbv, const float *bq, const float *bk,    \
                                                  const float *bv, const signed char *xq,       \
                                                  const float2 *xds, float *row, int ne0,       \
                                                  int q_dim, int kv_dim) {                       \
        mf_qkv1_pipe<TY, true>(wq, rbq, wk, rbk, wv, rbv, bq, bk, bv, nullptr, nullptr, 0.0f,    \
                               xq, xds, row, ne0, q_dim, kv_dim);                                \
    }

MF_QKV1_PIPE_KERNELS(p4, MF_Q4_K, MF_P4_BOUNDS)
MF_QKV1_PIPE_KERNELS(p6, MF_Q6_K, MF_P6_BOUNDS)

// Q and K of Q4_K, V of Q6_K (mf_qkv1_pipe46; the type codes are not read).
extern "C" __global__ void MF_P6_BOUNDS mf_qkv1_p46(int tyq, const u8 *wq, u64 rbq, int tyk,
                                       const u8 *wk, u64 rbk, int tyv, const u8 *wv, u64 rbv,
                                       const float *bq,
                                       const float *bk, const float *bv, const float *x,
                                       const float *gain, float eps, float *row, int ne0,
                                       int q_dim, int kv_dim) {
    mf_qkv1_pipe46<false>(wq, rbq, wk, rbk, wv, rbv, bq, bk, bv, x, gain, eps, nullptr, nullptr,
                          row, ne0, q_dim, kv_dim);
}

extern "C" __global__ void MF_P6_BOUNDS mf_qkv1_p46_gx(int tyq, const u8 *wq, u64 rbq, int tyk,
                                          const u8 *wk, u64 rbk, int tyv, const u8 *wv, u64 rbv,
                                          const float *bq, const float *bk, const float *bv,
                                          const signed char *xq, const float2 *xds, float *row,
                                          int ne0, int q_dim, int kv_dim) {
    mf_qkv1_pipe46<true>(wq, rbq, wk, rbk, wv, rbv, bq, bk, bv, nullptr, nullptr, 0.0f, xq, xds,
                         row, ne0, q_dim, kv_dim);
}

// The fused decode Q/K/V in one launch where the cache holds f16 or f32 and the rows take the
// pipelined walks (`mf_qkv1r_p4|p6|p46[_gx]`; `MINFER_CUDA_QKV_ROPE=0`: the two launches
// above). A warp's unit is a pair of rows that RoPE rotates together (of Q or K; V's rows are
// paired the same way and only stored), walked as two matrices of one pipeline (walk.cuh,
// M = 2), so both values of a pair end on lane 0, whose epilogue adds the biases, rotates and
// stores: q into the output, k and v into the token's cell. Each row's sum, bias add, rotation
// and store are the two launches' (mf_pipe1_run's chain, __fadd_rn, mf_rope_cs / mf_rope_lo /
// mf_rope_hi, mf_f2h), so the bits are too; only the rope_store launch and the round trip of
// the rows through memory are gone.
struct MfRopeOut {
    const int *pos, *cells;
    float *q_out;
    u8 *kreg, *vreg;
    int kv_ty; // MF_F16 or MF_F32
    u64 cell_bytes;
    int hd, neox;
    float theta_scale, freq_scale;
};

// Pair j of a region of heads of hd rows: its rows a < b within the region and its RoPE index
// i (mf_roped's pairing: (i, i + hd / 2) for NeoX, (2 i, 2 i + 1) otherwise).
__device__ __forceinline__ void mf_rope_pair(int j, int hd, int neox, int *a, int *b, int *i) {
    const int half = hd >> 1, h = j / half;
    *i = j - h * half;
    *a = h * hd + (neox ? *i : 2 * *i);
    *b = *a + (neox ? half : 1);
}

// Lane 0's epilogue of pair j of region reg (0 q, 1 k, 2 v) with the rows' sums r[0], r[1].
__device__ __forceinline__ void mf_rope_pair_out(const MfRopeOut &o, int reg, int j,
                                                 const float *bias, const float *r) {
    int a, b, i;
    mf_rope_pair(j, o.hd, o.neox, &a, &b, &i);
    float va = r[0], vb = r[1];
    if (bias) {
        va = __fadd_rn(va, bias[a]);
        vb = __fadd_rn(vb, bias[b]);
    }
    if (reg < 2) {
        float c, sn;
        mf_rope_cs(o.pos[0], i, o.theta_scale, o.freq_scale, &c, &sn);
        const float ra = mf_rope_lo(va, vb, c, sn), rb = mf_rope_hi(va, vb, c, sn);
        va = ra;
        vb = rb;
    }
    if (reg == 0) {
        o.q_out[a] = va;
        o.q_out[b] = vb;
        return;
    }
    u8 *cell = (reg == 1 ? o.kreg : o.vreg) + (u64)o.cells[0] * o.cell_bytes;
    if (o.kv_ty == MF_F16) {
        ((u16 *)cell)[a] = mf_f2h(va);
        ((u16 *)cell)[b] = mf_f2h(vb);
    } else {
        ((float *)cell)[a] = va;
        ((float *)cell)[b] = vb;
    }
}

// The pairs of Q and K on one pipeline of TA, then those of V on one of TB (the same type:
// one pipeline over every pair; Q/K of Q4_K and V of Q6_K: two, the second primed once the
// first is done, as mf_qkv1_pipe46).
template <int TA, int TB, bool GX>
__device__ __forceinline__ void mf_qkv1r_pipe(const u8 *wq, u64 rbq, const u8 *wk, u64 rbk,
                                              const u8 *wv, u64 rbv, const float *bq,
                                              const float *bk, const float *bv, const float *x,
                                              const float *gain, float eps,
                                              const signed char *__restrict__ gxq,
                                              const float2 *__restrict__ gxds, int ne0,
                                              int q_dim, int kv_dim, const MfRopeOut &ro) {
    const int qu = q_dim >> 1, ku = kv_dim >> 1;
    constexpr bool ONE = TA == TB;
    const int n_a = ONE ? qu + 2 * ku : qu + ku;
    // Unit u's region, pair index in it, matrix and row bytes.
    const auto unit = [&](int u, int *reg, int *j, const u8 **w, u64 *rb) {
        if (u < qu) *reg = 0, *j = u, *w = wq, *rb = rbq;
        else if (u < qu + ku) *reg = 1, *j = u - qu, *w = wk, *rb = rbk;
        else *reg = 2, *j = u - qu - ku, *w = wv, *rb = rbv;
    };
    const auto row_of = [&](int u, int m) {
        int reg, j, a, b, i;
        const u8 *w;
        u64 rb;
        unit(u, &reg, &j, &w, &rb);
        mf_rope_pair(j, ro.hd, ro.neox, &a, &b, &i);
        return w + (u64)(m ? b : a) * rb;
    };
    const auto epi = [&](int u, const float *r) {
        if ((threadIdx.x & 31) == 0) {
            int reg, j;
            const u8 *w;
            u64 rb;
            unit(u, &reg, &j, &w, &rb);
            mf_rope_pair_out(ro, reg, j, reg == 0 ? bq : reg == 1 ? bk : bv, r);
        }
    };
    MfPipe1<TA, 2, MF_MV1_PIPE_SHORT> pa;
    mf_pipe1_prime(pa, row_of, n_a, ne0 >> 5);
    MF_PDL_ENTRY();
    MF_MV1_X(GX, x, gain, eps, gxq, gxds, ne0, xq, xds);
    mf_pipe1_run(pa, row_of, n_a, xq, xds, epi);
    if (!ONE) {
        const auto v_of = [&](int u, int m) { return row_of(u + qu + ku, m); };
        const auto epi_v = [&](int u, const float *r) { epi(u + qu + ku, r); };
        MfPipe1<TB, 2, MF_MV1_PIPE_SHORT> pb;
        mf_pipe1_prime(pb, v_of, ku, ne0 >> 5);
        mf_pipe1_run(pb, v_of, ku, xq, xds, epi_v);
    }
    MF_PDL_TRIGGER();
}

// The same launch over rows of any int8 type on the plain walks (`mf_qkv1r` / `mf_qkv1r_gx`:
// the 0.5B shape's Q5_0 Q/K/V): a warp's unit is again a pair of rows RoPE rotates together,
// each row mf_qkv1's mf_row1_any, then lane 0's epilogue as above, so the bits are the two
// launches' and one launch a layer is gone.
template <bool GX>
__device__ __forceinline__ void mf_qkv1r_plain(int tyq, const u8 *wq, u64 rbq, int tyk,
                                               const u8 *wk, u64 rbk, int tyv, const u8 *wv,
                                               u64 rbv, const float *bq, const float *bk,
                                               const float *bv, const float *x,
                                               const float *gain, float eps,
                                               const signed char *__restrict__ gxq,
                                               const float2 *__restrict__ gxds, int ne0,
                                               int q_dim, int kv_dim, const MfRopeOut &ro) {
    const int qu = q_dim >> 1, ku = kv_dim >> 1;
    MF_PDL_ENTRY();
    MF_MV1_X(GX, x, gain, eps, gxq, gxds, ne0, xq, xds);
    MF_MV1_ROWS(u, qu + 2 * ku) {
        int reg, j, ty;
        const u8 *w;
        u64 rb;
        if (u < qu) reg = 0, j = u, ty = tyq, w = wq, rb = rbq;
        else if (u < qu + ku) reg = 1, j = u - qu, ty = tyk, w = wk, rb = rbk;
        else reg = 2, j = u - qu - ku, ty = tyv, w = wv, rb = rbv;
        int a, b, i;
        mf_rope_pair(j, ro.hd, ro.neox, &a, &b, &i);
        float r[2];
        r[0] = mf_row1_any(ty, w + (u64)a * rb, xq, xds, ne0 >> 5);
        r[1] = mf_row1_any(ty, w + (u64)b * rb, xq, xds, ne0 >> 5);
        const float *bias = reg == 0 ? bq : reg == 1 ? bk : bv;
        if ((threadIdx.x & 31) == 0) mf_rope_pair_out(ro, reg, j, bias, r);
    }
    MF_PDL_TRIGGER();
}

// The rope-fused kernels: mf_qkv1's arguments up to x's, the row length, then mf_rope_store's
// after its row scratch.
#define MF_QKV1R_ARGS                                                                              \
    int tyq, const u8 *wq, u64 rbq, int tyk, const u8 *wk, u64 rbk, int tyv, const u8 *wv,      \
        u64 rbv, const float *bq, const float *bk, const float *bv
#define MF_QKV1R_TAIL                                                                              \
    int ne0, const int *pos, const int *cells, float *q_out, u8 *kreg, u8 *vreg, int kv_ty,     \
        u64 cell_bytes, int q_dim, int kv_dim, int hd, float theta_scale, float freq_scale, int neox
#define MF_QKV1R_RO {pos, cells, q_out, kreg, vreg, kv_ty, cell_bytes, hd, neox, theta_scale, freq_scale}
#define MF_QKV1R_KERNELS(SUF, TA, TB, BOUNDS)                                                      \
    extern "C" __global__ void BOUNDS mf_qkv1r_##SUF(MF_QKV1R_ARGS, const float *x,               \
                                                     const float *gain, float eps,               \
                                                     MF_QKV1R_TAIL) {                             \
        const MfRopeOut ro = MF_QKV1R_RO;                                                         \
        mf_qkv1r_pipe<TA, TB, false>(wq, rbq, wk, rbk, wv, rbv, bq, bk, bv, x, gain, eps,         \
                                     nullptr, nullptr, ne0, q_dim, kv_dim, ro);                   \
    }                                                                                             \
    extern "C" __global__ void BOUNDS mf_qkv1r_##SUF##_gx(MF_QKV1R_ARGS, const signed char *xq,   \
                                                          const float2 *xds, MF_QKV1R_TAIL) {     \
        const MfRopeOut ro = MF_QKV1R_RO;                                                         \
        mf_qkv1r_pipe<TA, TB, true>(wq, rbq, wk, rbk, wv, rbv, bq, bk, bv, nullptr, nullptr,      \
                                    0.0f, xq, xds, ne0, q_dim, kv_dim, ro);                       \
    }

extern "C" __global__ void mf_qkv1r(MF_QKV1R_ARGS, const float *x, const float *gain, float eps,
                                    MF_QKV1R_TAIL) {
    const MfRopeOut ro = MF_QKV1R_RO;
    mf_qkv1r_plain<false>(tyq, wq, rbq, tyk, wk, rbk, tyv, wv, rbv, bq, bk, bv, x, gain, eps,
                          nullptr, nullptr, ne0, q_dim, kv_dim, ro);
}
extern "C" __global__ void mf_qkv1r_gx(MF_QKV1R_ARGS, const signed char *xq, const float2 *xds,
                                       MF_QKV1R_TAIL) {
    const MfRopeOut ro = MF_QKV1R_RO;
    mf_qkv1r_plain<true>(tyq, wq, rbq, tyk, wk, rbk, tyv, wv, rbv, bq, bk, bv, nullptr, nullptr,
                         0.0f, xq, xds, ne0, q_dim, kv_dim, ro);
}
MF_QKV1R_KERNELS(p4, MF_Q4_K, MF_Q4_K, MF_P4_BOUNDS)
MF_QKV1R_KERNELS(p6, MF_Q6_K, MF_Q6_K, MF_P6_BOUNDS)
MF_QKV1R_KERNELS(p46, MF_Q4_K, MF_Q6_K, MF_P6_BOUNDS)

// Element e of head row `h` (hd values at `x`) after RoPE at (c, s) of its pair.
__device__ __forceinline__ float mf_roped(const float *x, int e, int hd, int neox, int pos,
                                          float theta_scale, float freq_scale) {
    int half = hd / 2;
    int j = neox ? e % half : e / 2;
    bool lo = neox ? e < half : (e & 1) == 0;
    int a = neox ? j : 2 * j, b = neox ? j + half : 2 * j + 1;
    float c, sn;
    mf_rope_cs(pos, j, theta_scale, freq_scale, &c, &sn);
    return lo ? mf_rope_lo(x[a], x[b], c, sn) : mf_rope_hi(x[a], x[b], c, sn);
}

// Threads [0, q_dim) rotate q; then a thread per K and per V value (f16/f32 cache) or per
// 32-value block (q8_0, mf_kv_q8_block). With `warp_q8` (the host's MINFER_CUDA_Q8_DECODE=1,
// until a device has gated it) a q8_0 block is one warp instead, from the next multiple of 32
// after q's threads: lane k rotates (K) or reads (V) value k, the block's max |x| is the
// warp's butterfly max (order-free, from 0 as mf_kv_q8_block's fold: a NaN counts as 0 there
// and here), and each lane rounds and stores its own byte with mf_kv_q8_block's arithmetic,
// so the bytes are its; the thread a block does its 32 rotations one after another (23 µs a
// layer on the 7B).
extern "C" __global__ void mf_rope_store(const float *row, const int *pos, const int *cells,
                                         float *q_out, u8 *kreg, u8 *vreg, int ty,
                                         u64 row_bytes, int q_dim, int kv_dim, int hd,
                                         float theta_scale, float freq_scale, int neox,
                                         int warp_q8) {
    MF_PDL_ENTRY();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int p = pos[0];
    if (i < q_dim) {
        q_out[i] = mf_roped(row + (i / hd) * hd, i % hd, hd, neox, p, theta_scale, freq_scale);
        return;
    }
    const bool q8 = ty == MF_Q8_0;
    i -= q8 && warp_q8 ? (q_dim + 31) & ~31 : q_dim;
    const int unit = q8 && !warp_q8 ? 32 : 1;
    const int units = kv_dim / unit;
    if (i < 0 || i >= 2 * units) return; // the padding, or whole warps past the last block
    const bool is_k = i < units;
    if (!is_k) i -= units;
    const float *src = row + q_dim + (is_k ? 0 : kv_dim);
    u8 *cell = (is_k ? kreg : vreg) + (u64)cells[0] * row_bytes;
    if (unit == 32) {
        float v[32];
        for (int k = 0; k < 32; ++k) {
            int e = i * 32 + k;
            v[k] = is_k ? mf_roped(src + (e / hd) * hd, e % hd, hd, neox, p, theta_scale,
                                   freq_scale)
                        : src[e];
        }
        mf_kv_q8_block(v, cell + (u64)i * 34);
        return;
    }
    const int e = i;
    const float x =
        is_k ? mf_roped(src + (e / hd) * hd, e % hd, hd, neox, p, theta_scale, freq_scale) : src[e];
    if (q8) {
        const float amax = fmaxf(0.0f, mf_warp_max(fabsf(x)));
        const float d = amax / 127.0f;
        const float id = d == 0.0f ? 0.0f : 1.0f / d;
        u8 *b = cell + (u64)(e >> 5) * 34;
        if ((e & 31) == 0) *(u16 *)b = mf_f2h(d);
        b[2 + (e & 31)] = (u8)(signed char)(int)roundf(x * id);
    } else if (ty == MF_F16) {
        ((u16 *)cell)[e] = mf_f2h(x);
    } else {
        ((float *)cell)[e] = x;
    }
}
