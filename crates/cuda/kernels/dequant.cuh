// Dequantization of one 32-element chunk `c` of a weight row (row bytes at `row`), in the
// formulas of crates/gguf/src/quants (gguf-py order). K-quant rows are whole 256-element
// super-blocks (8 chunks each); f32/f16 rows may end mid-chunk (zeros past `ne0`).
__device__ void mf_deq32(int ty, const u8 *row, int c, int ne0, float *o) {
    switch (ty) {
    case MF_F32: {
        const float *r = (const float *)row;
        for (int i = 0; i < 32; ++i) { int e = c * 32 + i; o[i] = e < ne0 ? r[e] : 0.0f; }
        break;
    }
    case MF_F16: {
        const u16 *r = (const u16 *)row;
        for (int i = 0; i < 32; ++i) { int e = c * 32 + i; o[i] = e < ne0 ? mf_h2f(r[e]) : 0.0f; }
        break;
    }
    case MF_Q8_0: {
        const u8 *b = row + (u64)c * 34;
        float d = mf_ld_f16(b);
        for (int i = 0; i < 32; ++i) o[i] = (float)(signed char)b[2 + i] * d;
        break;
    }
    case MF_Q4_0: {
        const u8 *b = row + (u64)c * 18;
        float d = mf_ld_f16(b);
        for (int j = 0; j < 16; ++j) {
            o[j] = d * (float)((int)(b[2 + j] & 15) - 8);
            o[j + 16] = d * (float)((int)(b[2 + j] >> 4) - 8);
        }
        break;
    }
    case MF_Q4_1: {
        const u8 *b = row + (u64)c * 20;
        float d = mf_ld_f16(b), m = mf_ld_f16(b + 2);
        for (int j = 0; j < 16; ++j) {
            o[j] = d * (float)(b[4 + j] & 15) + m;
            o[j + 16] = d * (float)(b[4 + j] >> 4) + m;
        }
        break;
    }
    case MF_Q5_0: {
        const u8 *b = row + (u64)c * 22;
        float d = mf_ld_f16(b);
        u32 qh = (u32)b[2] | ((u32)b[3] << 8) | ((u32)b[4] << 16) | ((u32)b[5] << 24);
        for (int j = 0; j < 16; ++j) {
            int lo = (b[6 + j] & 15) | (((qh >> j) & 1) << 4);
            int hi = (b[6 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
            o[j] = d * (float)(lo - 16);
            o[j + 16] = d * (float)(hi - 16);
        }
        break;
    }
    case MF_Q4_K: {
        const u8 *b = row + (u64)(c / 8) * 144;
        int s = c % 8;
        float d = mf_ld_f16(b), dmin = mf_ld_f16(b + 2);
        const u8 *k = b + 4;
        int sc, mn;
        if (s < 4) {
            sc = k[s] & 63;
            mn = k[s + 4] & 63;
        } else {
            sc = (k[s + 4] & 15) | ((k[s - 4] >> 6) << 4);
            mn = (k[s + 4] >> 4) | ((k[s] >> 6) << 4);
        }
        float dl = d * (float)sc, ml = dmin * (float)mn;
        const u8 *qs = b + 16 + 32 * (s / 2);
        int sh = 4 * (s % 2);
        for (int l = 0; l < 32; ++l) o[l] = dl * (float)((qs[l] >> sh) & 15) - ml;
        break;
    }
    case MF_Q6_K: {
        const u8 *b = row + (u64)(c / 8) * 210;
        float d = mf_ld_f16(b + 208);
        for (int i = 0; i < 32; ++i) {
            int e = (c % 8) * 32 + i;
            int h = e / 128, r = e % 128;
            int low = (b[64 * h + r % 64] >> (4 * (r / 64))) & 15;
            int high = (b[128 + 32 * h + r % 32] >> (2 * (r / 32))) & 3;
            float dl = d * (float)(signed char)b[192 + e / 16];
            o[i] = dl * (float)((low | (high << 4)) - 32);
        }
        break;
    }
    default:
        for (int i = 0; i < 32; ++i) o[i] = 0.0f;
    }
}
