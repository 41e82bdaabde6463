// Elementwise ops, RMSNorm and RoPE. The output may alias src 0 (the graph lets Add, Mul,
// Silu, SwiGLU and Rope write in place): every thread reads its inputs before writing.

extern "C" __global__ void mf_add(const float *a, const float *b, float *o, u64 n) {
    MF_PDL_ENTRY();
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) o[i] = a[i] + b[i];
}

extern "C" __global__ void mf_mul(const float *a, const float *b, float *o, u64 n) {
    MF_PDL_ENTRY();
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) o[i] = a[i] * b[i];
}

extern "C" __global__ void mf_silu(const float *a, float *o, u64 n) {
    MF_PDL_ENTRY();
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { float x = a[i]; o[i] = x / (1.0f + expf(-x)); }
}

extern "C" __global__ void mf_swiglu(const float *a, const float *b, float *o, u64 n) {
    MF_PDL_ENTRY();
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { float x = a[i]; o[i] = x / (1.0f + expf(-x)) * b[i]; }
}

// One block per group of `group` elements (a row, or one head of a row).
extern "C" __global__ void mf_rms_norm(const float *x, const float *w, float *o, int group,
                                       float eps) {
    MF_PDL_ENTRY();
    // Every warp computes the scale itself (mf_rms_scale: the order fused kernels repeat).
    u64 base = (u64)blockIdx.x * group;
    float scale = mf_rms_scale(x + base, group, eps);
    for (int i = threadIdx.x; i < group; i += blockDim.x)
        o[base + i] = mf_rms_apply(x[base + i], scale, w[i]);
}

// One thread per (token, head, pair); neox pairs (j, j + d/2), normal (2j, 2j + 1).
extern "C" __global__ void mf_rope(const float *x, const int *pos, float *o, int n_head,
                                   int head_dim, int nt, float theta_scale, float freq_scale,
                                   int neox) {
    MF_PDL_ENTRY();
    int half = head_dim / 2;
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    u64 total = (u64)nt * n_head * half;
    if (i >= total) return;
    int j = (int)(i % half);
    u64 th = i / half; // token * n_head + head
    int t = (int)(th / n_head);
    float c, s;
    mf_rope_cs(pos[t], j, theta_scale, freq_scale, &c, &s);
    u64 base = th * head_dim;
    u64 a = base + (neox ? j : 2 * j), b = base + (neox ? j + half : 2 * j + 1);
    float x0 = x[a], x1 = x[b];
    o[a] = mf_rope_lo(x0, x1, c, s);
    o[b] = mf_rope_hi(x0, x1, c, s);
}
