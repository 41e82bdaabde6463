// The int8 matmul kernels (device functions and the canonical order in int8.cuh).

// x[t][0..ne0) of nt rows quantized: q[t][e] int8, ds[t][b] = (d, d * sum of the block's q),
// a group of 8 lanes per 32-element block (mf_q8_lanes8; a thread per block made one token's
// 18,944 values a 4.7 µs kernel of 5 blocks). Rows are 16-byte aligned (ne0 a multiple of
// 32, buffers 256-byte aligned). Threads: 8 per block.
extern "C" __global__ void mf_quantize_q8(const float *x, signed char *q, float2 *ds, int ne0,
                                          int nt) {
    MF_PDL_ENTRY();
    u64 i = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 3;
    const bool ok = i < (u64)nt * (ne0 >> 5);
    if (!ok) i = 0;
    mf_q8_lanes8(x + i * 32, nullptr, 1.0f, ok, q + i * 32, ds + i);
}

// One token's x[0..ne0) quantized once for the one-token kernels (mf_mmvq1, mf_gate_up1,
// mf_qkv1), laid out as mf_quantize_q8 lays out a row: with a `gain`, x is first the row's
// RMSNorm exactly as mf_rms_norm writes it (the norm a fused node folds in). One block
// (mf_q8_shared's walk: 8 lanes per 32-element block), the same bits as mf_quantize_q8.
// Before, each block of the one-token kernels quantized x into its own shared memory: a
// prologue of the whole row (18,944 values for the 7B's down projection) per block, before
// its first weight load, and shared memory that capped the blocks per SM.
extern "C" __global__ void mf_quantize_q8_1(const float *x, const float *gain, float eps,
                                            signed char *xq, float2 *xds, int ne0) {
    MF_PDL_ENTRY();
    mf_q8_shared(x, ne0, xq, xds, gain, eps);
    MF_PDL_TRIGGER();
}


#define MF_MMVQ_KERNEL(NAME, TY)                                                                  \
    extern "C" __global__ void NAME(const u8 *w, u64 row_bytes, const signed char *xq,           \
                                    const float2 *xds, float *y, const float *bias, int ne0,     \
                                    int n_out, int nt) {                                         \
        MF_PDL_ENTRY();                                                                           \
        mf_mmvq<TY>(w, row_bytes, xq, xds, y, bias, ne0, n_out, nt);                             \
    }

MF_MMVQ_KERNEL(mf_mmvq_q8_0, MF_Q8_0)
MF_MMVQ_KERNEL(mf_mmvq_q4_0, MF_Q4_0)
MF_MMVQ_KERNEL(mf_mmvq_q4_1, MF_Q4_1)
MF_MMVQ_KERNEL(mf_mmvq_q5_0, MF_Q5_0)
MF_MMVQ_KERNEL(mf_mmvq_q4_k, MF_Q4_K)
MF_MMVQ_KERNEL(mf_mmvq_q6_k, MF_Q6_K)


// mf_mmvq1's rows on the pipelined walk (walk.cuh, MF_MV1_PIPE): the same bits.
template <int TY, bool GX>
__device__ __forceinline__ void mf_mmvq1_pipe(const u8 *w, u64 row_bytes, const float *x,
                                              const float *gain, float eps,
                                              const signed char *__restrict__ gxq,
                                              const float2 *__restrict__ gxds, float *y,
                                              const float *bias, const float *res, int ne0,
                                              int n_out) {
    const auto row_of = [&](int o, int) { return w + (u64)o * row_bytes; };
    MfPipe1<TY, 1, GX ? MF_PIPE_D : MF_MV1_PIPE_SHORT> p;
    mf_pipe1_prime(p, row_of, n_out, ne0 >> 5);
    MF_PDL_ENTRY();
    MF_MV1_X(GX, x, gain, eps, gxq, gxds, ne0, xq, xds);
    const auto epi = [&](int o, const float *r) {
        if ((threadIdx.x & 31) == 0) {
            float s = r[0];
            if (bias) s = __fadd_rn(s, bias[o]);
            if (res) s = __fadd_rn(s, res[o]);
            y[o] = s;
        }
    };
    mf_pipe1_run(p, row_of, n_out, xq, xds, epi);
    MF_PDL_TRIGGER();
}

// y[o] = w[o] . x (+ bias[o]) (+ res[o]: the residual Add of Op::MatMulAdd, after the bias
// as the unfused MatMul → Add) for one token; x as MF_MV1_X says (`mf_mmvq1`: quantized by
// each block into ne0 + ne0 / 4 bytes of dynamic shared memory, with a `gain` its RMSNorm;
// `mf_mmvq1_gx`: quantized before, (xq, xds)).
template <bool GX>
__device__ __forceinline__ void mf_mmvq1_body(int ty, const u8 *w, u64 row_bytes,
                                              const float *x, const float *gain, float eps,
                                              const signed char *__restrict__ gxq,
                                              const float2 *__restrict__ gxds, float *y,
                                              const float *bias, const float *res, int ne0,
                                              int n_out) {
    int o0 = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (MF_MV1_PREFETCH && o0 < n_out) mf_prefetch_row(w + (u64)o0 * row_bytes, row_bytes);
    MF_PDL_ENTRY(); // the weights were constant before the kernel before this one ran
    MF_MV1_X(GX, x, gain, eps, gxq, gxds, ne0, xq, xds);
    MF_MV1_ROWS(o, n_out) {
        int nx = mf_mv1_next(o, n_out);
        if (MF_MV1_PREFETCH > 1 && nx >= 0) mf_prefetch_row(w + (u64)nx * row_bytes, row_bytes);
        float s = mf_row1_any(ty, w + (u64)o * row_bytes, xq, xds, ne0 >> 5);
        if ((threadIdx.x & 31) == 0) {
            if (bias) s = __fadd_rn(s, bias[o]);
            if (res) s = __fadd_rn(s, res[o]);
            y[o] = s;
        }
    }
    MF_PDL_TRIGGER();
}

extern "C" __global__ void mf_mmvq1(int ty, const u8 *w, u64 row_bytes, const float *x,
                                    const float *gain, float eps, float *y, const float *bias,
                                    const float *res, int ne0, int n_out) {
    mf_mmvq1_body<false>(ty, w, row_bytes, x, gain, eps, nullptr, nullptr, y, bias, res, ne0,
                         n_out);
}

extern "C" __global__ void mf_mmvq1_gx(int ty, const u8 *w, u64 row_bytes,
                                       const signed char *xq, const float2 *xds, float *y,
                                       const float *bias, const float *res, int ne0,
                                       int n_out) {
    mf_mmvq1_body<true>(ty, w, row_bytes, nullptr, nullptr, 0.0f, xq, xds, y, bias, res, ne0,
                        n_out);
}

// The pipelined one-token kernels (walk.cuh `MF_MV1_PIPE`): mf_mmvq1's and mf_mmvq1_gx's
// arguments and bits, for Q4_K rows at 16-byte-aligned addresses (`_p4`) and Q6_K rows at
// even ones (`_p6`); the host picks them (`ty` is not read).
#define MF_MMVQ1_PIPE_KERNELS(SUF, TY, BOUNDS)                                                     \
    extern "C" __global__ void BOUNDS mf_mmvq1_##SUF(int ty, const u8 *w, u64 row_bytes,           \
                                              const float *x, const float *gain, float eps,      \
                                              float *y, const float *bias, const float *res,     \
                                              int ne0, int n_out) {                              \
        mf_mmvq1_pipe<TY, false>(w, row_bytes, x, gain, eps, nullptr, nullptr, y, bias, res,     \
                                 ne0, n_out);                                                    \
    }                                                                                             \
    extern "C" __global__ void BOUNDS mf_mmvq1_##SUF##_gx(int ty, const u8 *w, u64 row_bytes,      \
                                                   const signed char *xq, const float2 *xds,    \
                                                   float *y, const float *bias,                 \
                                                   const float *res, int ne0, int n_out) {      \
        mf_mmvq1_pipe<TY, true>(w, row_bytes, nullptr, nullptr, 0.0f, xq, xds, y, bias, res,     \
                                ne0, n_out);                                                     \
    }

MF_MMVQ1_PIPE_KERNELS(p4, MF_Q4_K, MF_P4_BOUNDS)
MF_MMVQ1_PIPE_KERNELS(p6, MF_Q6_K, MF_P6_BOUNDS)

// Up to NT generation rows at once (the multi-row kernels mf_mmvqn2, 4 and 8; nt of them
// exist, NT / 2 < nt <= NT): y[t][o] = w[o] . x[t] (+ bias[o]) over activations
// mf_quantize_q8 already quantized (xq: nt rows of ne0 int8 values; xds: nt rows of ne0 / 32
// (d, d * sum q)). Rows are walked as mf_mmvq1
// walks them (a warp per row, one resident wave of blocks), each row's weights loaded once
// for all NT tokens, and token t's value is mf_mmvq1's bits for that token alone
// (mf_rown_any): which kernel a forward's row count picks never changes a row. No shared
// memory: the tokens' quantized rows are read from global memory (L1/L2 after the first
// warp), so the kernel's occupancy does not fall with the row length.
template <int NT>
__device__ __forceinline__ void mf_mmvqn(int ty, const u8 *w, u64 row_bytes,
                                         const signed char *xq, const float2 *xds, float *y,
                                         const float *bias, int ne0, int n_out, int nt) {
    MF_PDL_ENTRY(); // xq and xds come from the quantizer launched just before
    MF_MV1_ROWS(o, n_out) {
        float s[NT];
        mf_rown_any<NT>(ty, w + (u64)o * row_bytes, xq, xds, ne0 >> 5, nt, s);
        if ((threadIdx.x & 31) == 0) {
            const float bo = bias ? bias[o] : 0.0f;
#pragma unroll
            for (int t = 0; t < NT; ++t)
                if (t < nt) y[(u64)t * n_out + o] = bias ? __fadd_rn(s[t], bo) : s[t];
        }
    }
    MF_PDL_TRIGGER();
}

#define MF_MMVQN_KERNEL(NT)                                                                       \
    extern "C" __global__ void mf_mmvqn##NT(int ty, const u8 *w, u64 row_bytes,                  \
                                            const signed char *xq, const float2 *xds, float *y,  \
                                            const float *bias, int ne0, int n_out, int nt) {     \
        mf_mmvqn<NT>(ty, w, row_bytes, xq, xds, y, bias, ne0, n_out, nt);                        \
    }

MF_MMVQN_KERNEL(2)
MF_MMVQN_KERNEL(4)
MF_MMVQN_KERNEL(8)

// mf_gate_up1 with both matrices on the pipelined walk (one chunk of each per step).
template <int TY, bool GX>
__device__ __forceinline__ void mf_gate_up1_pipe(const u8 *wg, u64 rbg, const u8 *wu, u64 rbu,
                                                 const float *x, const float *gain, float eps,
                                                 const signed char *__restrict__ gxq,
                                                 const float2 *__restrict__ gxds, float *y,
                                                 int ne0, int n_out) {
    const auto row_of = [&](int o, int m) {
        return m ? wu + (u64)o * rbu : wg + (u64)o * rbg;
    };
    MfPipe1<TY, 2, MF_PIPE_D> p;
    mf_pipe1_prime(p, row_of, n_out, ne0 >> 5);
    MF_PDL_ENTRY();
    MF_MV1_X(GX, x, gain, eps, gxq, gxds, ne0, xq, xds);
    const auto epi = [&](int o, const float *r) {
        const float g = r[0], u = r[1];
        if ((threadIdx.x & 31) == 0) y[o] = g / (1.0f + expf(-g)) * u;
    };
    mf_pipe1_run(p, row_of, n_out, xq, xds, epi);
    MF_PDL_TRIGGER();
}

// The decode FFN's gate and up products and SwiGLU in one launch: y[o] = silu(g) * u with
// g = wg[o] . x and u = wu[o] . x, each exactly as mf_mmvq1 computes it and the SwiGLU as
// mf_swiglu writes it; with a `gain`, x is the row's RMSNorm (Op::FfnGateUp's in_norm). x as
// MF_MV1_X says (`mf_gate_up1` / `mf_gate_up1_gx`).
template <bool GX>
__device__ __forceinline__ void mf_gate_up1_body(int tyg, const u8 *wg, u64 rbg, int tyu,
                                                 const u8 *wu, u64 rbu, const float *x,
                                                 const float *gain, float eps,
                                                 const signed char *__restrict__ gxq,
                                                 const float2 *__restrict__ gxds, float *y,
                                                 int ne0, int n_out) {
    int o0 = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (MF_MV1_PREFETCH && o0 < n_out) {
        mf_prefetch_row(wg + (u64)o0 * rbg, rbg);
        mf_prefetch_row(wu + (u64)o0 * rbu, rbu);
    }
    MF_PDL_ENTRY();
    MF_MV1_X(GX, x, gain, eps, gxq, gxds, ne0, xq, xds);
    MF_MV1_ROWS(o, n_out) {
        int nx = mf_mv1_next(o, n_out);
        if (MF_MV1_PREFETCH > 1 && nx >= 0) {
            mf_prefetch_row(wg + (u64)nx * rbg, rbg);
            mf_prefetch_row(wu + (u64)nx * rbu, rbu);
        }
        float g = mf_row1_any(tyg, wg + (u64)o * rbg, xq, xds, ne0 >> 5);
        float u = mf_row1_any(tyu, wu + (u64)o * rbu, xq, xds, ne0 >> 5);
        if ((threadIdx.x & 31) == 0) y[o] = g / (1.0f + expf(-g)) * u;
    }
    MF_PDL_TRIGGER();
}

extern "C" __global__ void mf_gate_up1(int tyg, const u8 *wg, u64 rbg, int tyu, const u8 *wu,
                                       u64 rbu, const float *x, const float *gain, float eps,
                                       float *y, int ne0, int n_out) {
    mf_gate_up1_body<false>(tyg, wg, rbg, tyu, wu, rbu, x, gain, eps, nullptr, nullptr, y, ne0,
                            n_out);
}

extern "C" __global__ void mf_gate_up1_gx(int tyg, const u8 *wg, u64 rbg, int tyu,
                                          const u8 *wu, u64 rbu, const signed char *xq,
                                          const float2 *xds, float *y, int ne0, int n_out) {
    mf_gate_up1_body<true>(tyg, wg, rbg, tyu, wu, rbu, nullptr, nullptr, 0.0f, xq, xds, y, ne0,
                           n_out);
}

// mf_gate_up1 / mf_gate_up1_gx on the pipelined walk, both matrices of one type (`_p4`: Q4_K
// at 16-byte-aligned addresses, `_p6`: Q6_K at even ones; `tyg` and `tyu` are not read).
#define MF_GATE_UP1_PIPE_KERNELS(SUF, TY, BOUNDS)                                                  \
    extern "C" __global__ void BOUNDS mf_gate_up1_##SUF(int tyg, const u8 *wg, u64 rbg, int tyu,   \
                                                 const u8 *wu, u64 rbu, const float *x,          \
                                                 const float *gain, float eps, float *y,         \
                                                 int ne0, int n_out) {                           \
        mf_gate_up1_pipe<TY, false>(wg, rbg, wu, rbu, x, gain, eps, nullptr, nullptr, y, ne0,    \
                                    n_out);                                                      \
    }                                                                                             \
    extern "C" __global__ void BOUNDS mf_gate_up1_##SUF##_gx(int tyg, const u8 *wg, u64 rbg,   \
                                                      int tyu, const u8 *wu, u64 rbu,           \
                                                      const signed char *xq, const float2 *xds, \
                                                      float *y, int ne0, int n_out) {           \
        mf_gate_up1_pipe<TY, true>(wg, rbg, wu, rbu, nullptr, nullptr, 0.0f, xq, xds, y, ne0,    \
                                   n_out);                                                       \
    }

MF_GATE_UP1_PIPE_KERNELS(p4, MF_Q4_K, MF_P4_BOUNDS)
MF_GATE_UP1_PIPE_KERNELS(p6, MF_Q6_K, MF_P6_BOUNDS)
