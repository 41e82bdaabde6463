// KV regions: stores of new rows into cells (f32, f16, q8_0), the re-rope of a shift, and
// the element readers attention uses. A region is cells of `row_bytes` bytes; f32/f16 cells
// are `n` plain values, q8_0 cells are n/32 blocks of 34 bytes (f16 scale, 32 int8).

// Thread per (row, element) for f32/f16; thread per (row, block) for q8_0.
extern "C" __global__ void mf_kv_store(int ty, const float *x, const int *cells, u8 *region,
                                       u64 row_bytes, int n, int nt) {
    MF_PDL_ENTRY();
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (ty == MF_Q8_0) {
        int nb = n / 32;
        if (i >= (u64)nt * nb) return;
        int t = (int)(i / nb), blk = (int)(i % nb);
        mf_kv_q8_block(x + (u64)t * n + blk * 32,
                       region + (u64)cells[t] * row_bytes + (u64)blk * 34);
        return;
    }
    if (i >= (u64)nt * n) return;
    int t = (int)(i / n), e = (int)(i % n);
    u8 *r = region + (u64)cells[t] * row_bytes;
    float v = x[i];
    if (ty == MF_F16) ((u16 *)r)[e] = mf_f2h(v);
    else ((float *)r)[e] = v;
}

// Rotates the K rows of cells [cell, cell + n_cells) by `delta` positions, in place.
extern "C" __global__ void mf_kv_rope_shift(int ty, u8 *region, u64 row_bytes, int cell,
                                            int n_cells, int n_head, int head_dim, int delta,
                                            float theta_scale, float freq_scale, int neox) {
    MF_PDL_ENTRY();
    int half = head_dim / 2;
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (u64)n_cells * n_head * half) return;
    int j = (int)(i % half);
    u64 ch = i / half;
    int c = cell + (int)(ch / n_head), h = (int)(ch % n_head);
    float co, si;
    mf_rope_cs(delta, j, theta_scale, freq_scale, &co, &si);
    u8 *r = region + (u64)c * row_bytes;
    int base = h * head_dim;
    int a = base + (neox ? j : 2 * j), b = base + (neox ? j + half : 2 * j + 1);
    if (ty == MF_F16) {
        u16 *p = (u16 *)r;
        float x0 = mf_h2f(p[a]), x1 = mf_h2f(p[b]);
        p[a] = mf_f2h(x0 * co - x1 * si);
        p[b] = mf_f2h(x0 * si + x1 * co);
    } else {
        float *p = (float *)r;
        float x0 = p[a], x1 = p[b];
        p[a] = x0 * co - x1 * si;
        p[b] = x0 * si + x1 * co;
    }
}
