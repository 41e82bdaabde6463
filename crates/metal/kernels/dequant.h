// Dequantizers: each turns one 16-element chunk of a weight row into floats. Every kernel
// family (get-rows, mat-vec, multi-row, GEMM) is written once over this interface and
// instantiated per dtype. `c` is the chunk index within the row (elements 16c .. 16c+15).
// Block layouts follow ggml's GGUF formats (byte offsets in the comments).
#pragma once
#include "common.h"

constant char mf_kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

// F32: 4 bytes/element.
inline void mf_dq_f32(device const uchar * row, uint c, thread float * out) {
    device const uchar * p = row + c * 64;
    for (int i = 0; i < 16; ++i) { out[i] = mf_ld_f32(p + 4 * i); }
}
// F16: 2 bytes/element.
inline void mf_dq_f16(device const uchar * row, uint c, thread float * out) {
    device const uchar * p = row + c * 32;
    for (int i = 0; i < 16; ++i) { out[i] = mf_ld_f16(p + 2 * i); }
}
// BF16: the upper half of an f32 (exact widening).
inline void mf_dq_bf16(device const uchar * row, uint c, thread float * out) {
    device const uchar * p = row + c * 32;
    for (int i = 0; i < 16; ++i) {
        out[i] = as_type<float>((uint(p[2 * i]) | (uint(p[2 * i + 1]) << 8)) << 16);
    }
}
// Q4_0 (18 B / 32): d f16 @0, qs[16] @2; element j<16 = low nibble of qs[j], j>=16 high.
inline void mf_dq_q4_0(device const uchar * row, uint c, thread float * out) {
    device const uchar * b = row + (c / 2) * 18;
    float d = mf_ld_f16(b);
    uint sh = (c % 2) * 4;
    for (int i = 0; i < 16; ++i) { out[i] = d * (float(int((b[2 + i] >> sh) & 15)) - 8.0f); }
}
// Q4_1 (20 B / 32): d f16 @0, m f16 @2, qs[16] @4.
inline void mf_dq_q4_1(device const uchar * row, uint c, thread float * out) {
    device const uchar * b = row + (c / 2) * 20;
    float d = mf_ld_f16(b);
    float m = mf_ld_f16(b + 2);
    uint sh = (c % 2) * 4;
    for (int i = 0; i < 16; ++i) { out[i] = d * float((b[4 + i] >> sh) & 15) + m; }
}
// Q5_0 (22 B / 32): d f16 @0, qh u32 @2 (bit j = high bit of element j), qs[16] @6.
inline void mf_dq_q5_0(device const uchar * row, uint c, thread float * out) {
    device const uchar * b = row + (c / 2) * 22;
    float d = mf_ld_f16(b);
    uint qh = mf_ld_u32(b + 2);
    uint sh = (c % 2) * 4;
    for (int i = 0; i < 16; ++i) {
        uint j = (c % 2) * 16 + i;
        int q = int(((b[6 + i] >> sh) & 15) | (((qh >> j) & 1) << 4));
        out[i] = d * float(q - 16);
    }
}
// Q5_1 (24 B / 32): d f16 @0, m f16 @2, qh u32 @4, qs[16] @8.
inline void mf_dq_q5_1(device const uchar * row, uint c, thread float * out) {
    device const uchar * b = row + (c / 2) * 24;
    float d = mf_ld_f16(b);
    float m = mf_ld_f16(b + 2);
    uint qh = mf_ld_u32(b + 4);
    uint sh = (c % 2) * 4;
    for (int i = 0; i < 16; ++i) {
        uint j = (c % 2) * 16 + i;
        uint q = ((b[8 + i] >> sh) & 15) | (((qh >> j) & 1) << 4);
        out[i] = d * float(q) + m;
    }
}
// Q8_0 (34 B / 32): d f16 @0, qs i8[32] @2.
inline void mf_dq_q8_0(device const uchar * row, uint c, thread float * out) {
    device const uchar * b = row + (c / 2) * 34;
    float d = mf_ld_f16(b);
    device const uchar * q = b + 2 + (c % 2) * 16;
    for (int i = 0; i < 16; ++i) { out[i] = d * float(as_type<char>(q[i])); }
}
// Q8_1 (36 B / 32): d f16 @0, s f16 @2 (sum, unused here), qs i8[32] @4.
inline void mf_dq_q8_1(device const uchar * row, uint c, thread float * out) {
    device const uchar * b = row + (c / 2) * 36;
    float d = mf_ld_f16(b);
    device const uchar * q = b + 4 + (c % 2) * 16;
    for (int i = 0; i < 16; ++i) { out[i] = d * float(as_type<char>(q[i])); }
}
// Q2_K (84 B / 256): scales[16] @0 (low nibble scale, high nibble min), qs[64] @16,
// d f16 @80, dmin f16 @82. Chunk c: half n = c/8, shift pair j = (c%8)/2, half-row h = c%2.
inline void mf_dq_q2_k(device const uchar * row, uint c, thread float * out) {
    device const uchar * b = row + (c / 16) * 84;
    uint cc = c % 16;
    uint n = cc / 8, j = (cc % 8) / 2, h = cc % 2;
    float d = mf_ld_f16(b + 80);
    float dmin = mf_ld_f16(b + 82);
    uchar sc = b[n * 8 + j * 2 + h];
    float dl = d * float(sc & 15);
    float ml = dmin * float(sc >> 4);
    device const uchar * q = b + 16 + n * 32 + h * 16;
    for (int i = 0; i < 16; ++i) { out[i] = dl * float((q[i] >> (2 * j)) & 3) - ml; }
}
// Q3_K (110 B / 256): hmask[32] @0, qs[64] @32, scales[12] @96 (16 6-bit scales, bias 32),
// d f16 @108.
inline void mf_dq_q3_k(device const uchar * row, uint c, thread float * out) {
    device const uchar * b = row + (c / 16) * 110;
    uint cc = c % 16;
    uint n = cc / 8, j = (cc % 8) / 2, h = cc % 2;
    uint is = n * 8 + j * 2 + h;
    device const uchar * s = b + 96;
    uint lo = is < 8 ? (s[is] & 15) : (s[is - 8] >> 4);
    uint hi = (s[8 + is % 4] >> (2 * (is / 4))) & 3;
    float dl = mf_ld_f16(b + 108) * float(int(lo | (hi << 4)) - 32);
    device const uchar * q = b + 32 + n * 32 + h * 16;
    device const uchar * hm = b + h * 16;
    uint mbit = n * 4 + j;
    for (int i = 0; i < 16; ++i) {
        int v = int((q[i] >> (2 * j)) & 3) - (((hm[i] >> mbit) & 1) ? 0 : 4);
        out[i] = dl * float(v);
    }
}
// K-quant 6-bit scale/min pair j (0..7) from the 12 packed bytes of Q4_K/Q5_K.
inline void mf_scale_min_k4(uint j, device const uchar * q, thread float & sc, thread float & mn) {
    if (j < 4) {
        sc = float(q[j] & 63);
        mn = float(q[j + 4] & 63);
    } else {
        sc = float((q[j + 4] & 15) | ((q[j - 4] >> 6) << 4));
        mn = float((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}
// Q4_K (144 B / 256): d f16 @0, dmin f16 @2, scales[12] @4, qs[128] @16. Chunk c: 64-element
// group g = c/4, nibble h = (c%4)/2, 16-element half l0 = (c%2)*16.
inline void mf_dq_q4_k(device const uchar * row, uint c, thread float * out) {
    device const uchar * b = row + (c / 16) * 144;
    uint cc = c % 16;
    uint g = cc / 4, h = (cc % 4) / 2, l0 = (cc % 2) * 16;
    float sc, mn;
    mf_scale_min_k4(2 * g + h, b + 4, sc, mn);
    float dl = mf_ld_f16(b) * sc;
    float ml = mf_ld_f16(b + 2) * mn;
    device const uchar * q = b + 16 + g * 32 + l0;
    for (int i = 0; i < 16; ++i) { out[i] = dl * float((q[i] >> (4 * h)) & 15) - ml; }
}
// Q5_K (176 B / 256): d @0, dmin @2, scales[12] @4, qh[32] @16, qs[128] @48.
inline void mf_dq_q5_k(device const uchar * row, uint c, thread float * out) {
    device const uchar * b = row + (c / 16) * 176;
    uint cc = c % 16;
    uint g = cc / 4, h = (cc % 4) / 2, l0 = (cc % 2) * 16;
    float sc, mn;
    mf_scale_min_k4(2 * g + h, b + 4, sc, mn);
    float dl = mf_ld_f16(b) * sc;
    float ml = mf_ld_f16(b + 2) * mn;
    device const uchar * q = b + 48 + g * 32 + l0;
    device const uchar * qh = b + 16 + l0;
    uint hb = 2 * g + h;
    for (int i = 0; i < 16; ++i) {
        uint v = ((q[i] >> (4 * h)) & 15) | (((qh[i] >> hb) & 1) << 4);
        out[i] = dl * float(v) - ml;
    }
}
// Q6_K (210 B / 256): ql[128] @0, qh[64] @128, scales i8[16] @192, d f16 @208. Element
// e = n*128 + g*32 + l: low nibble from ql[n*64 + (g&1)*32 + l] (high nibble when g >= 2),
// two high bits from qh[n*32 + l] >> 2g, scale scales[n*8 + 2g + l/16].
inline void mf_dq_q6_k(device const uchar * row, uint c, thread float * out) {
    device const uchar * b = row + (c / 16) * 210;
    uint cc = c % 16;
    uint n = cc / 8, g = (cc % 8) / 2, l0 = (cc % 2) * 16;
    float d = mf_ld_f16(b + 208);
    float dl = d * float(as_type<char>(b[192 + n * 8 + 2 * g + l0 / 16]));
    device const uchar * ql = b + n * 64 + (g & 1) * 32 + l0;
    device const uchar * qh = b + 128 + n * 32 + l0;
    for (int i = 0; i < 16; ++i) {
        int q = int(((ql[i] >> (4 * (g >> 1))) & 15) | (((qh[i] >> (2 * g)) & 3) << 4)) - 32;
        out[i] = dl * float(q);
    }
}
// Q8_K (292 B / 256): d f32 @0, qs i8[256] @4, bsums i16[16] @260 (unused here).
inline void mf_dq_q8_k(device const uchar * row, uint c, thread float * out) {
    device const uchar * b = row + (c / 16) * 292;
    float d = mf_ld_f32(b);
    device const uchar * q = b + 4 + (c % 16) * 16;
    for (int i = 0; i < 16; ++i) { out[i] = d * float(as_type<char>(q[i])); }
}
// IQ4_NL (18 B / 32): d f16 @0, qs[16] @2; nibbles index the non-linear table.
inline void mf_dq_iq4_nl(device const uchar * row, uint c, thread float * out) {
    device const uchar * b = row + (c / 2) * 18;
    float d = mf_ld_f16(b);
    uint sh = (c % 2) * 4;
    for (int i = 0; i < 16; ++i) { out[i] = d * float(mf_kvalues_iq4nl[(b[2 + i] >> sh) & 15]); }
}
// IQ4_XS (136 B / 256): d f16 @0, scales_h u16 @2, scales_l[4] @4, qs[128] @8. Sub-block
// ib = (c%16)/2 of 32 elements has 6-bit scale ls (bias 32) and qs bytes 8 + 16*ib.
inline void mf_dq_iq4_xs(device const uchar * row, uint c, thread float * out) {
    device const uchar * b = row + (c / 16) * 136;
    uint cc = c % 16;
    uint ib = cc / 2;
    uint sh_h = uint(b[2]) | (uint(b[3]) << 8);
    uint ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 15) | (((sh_h >> (2 * ib)) & 3) << 4);
    float dl = mf_ld_f16(b) * float(int(ls) - 32);
    uint sh = (cc % 2) * 4;
    device const uchar * q = b + 8 + 16 * ib;
    for (int i = 0; i < 16; ++i) { out[i] = dl * float(mf_kvalues_iq4nl[(q[i] >> sh) & 15]); }
}
