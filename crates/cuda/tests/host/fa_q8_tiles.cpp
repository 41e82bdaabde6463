// Host check of the q8_0 prompt attention's tile path (kernels/prompt.cu `mf_fa_load_q8`,
// `mf_fa_deq_q8`), no GPU needed: scripts/fa-q8-host-check extracts those two functions'
// source, and this file compiles them with g++ against host stand-ins for cp.async (a copy
// with zero-fill that refuses a misaligned address), shared memory (one array) and the f16
// conversions (_Float16, round to nearest even), runs each function for the 128 threads of
// a block in turn (neither reads what another thread writes), and checks that every value of
// the f16 tile is the cache's d * q rounded once, +0 past the window, for spans and kv maps,
// head dims 64 and 128, 1-4 KV heads, every head. Prints PASS or FAIL.
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <random>
typedef uint8_t u8; typedef uint16_t u16; typedef uint32_t u32; typedef uint64_t u64;
#define __device__
#define __forceinline__ inline
#define MF_WIN_RUNS 8
#define MF_FA_K 64
struct Dim { int x; };
static Dim threadIdx{0}, blockDim{128};
static u8 SMEM[64 * 1024] __attribute__((aligned(16)));
static u32 mf_smem_addr(const void *p) { return (u32)((const u8 *)p - SMEM); }
template <int CP> static void mf_cp_small(u32 dst, const void *src, int bytes) {
    if (((uintptr_t)src) % CP) { printf("misaligned src %p CP %d\n", src, CP); exit(1); }
    if (dst % CP) { printf("misaligned dst %u\n", dst); exit(1); }
    memset(SMEM + dst, 0, CP); memcpy(SMEM + dst, src, bytes);
}
static float mf_h2f(u16 h) { _Float16 f; memcpy(&f, &h, 2); return (float)f; }
static u16 f2h(float x) { _Float16 f = (_Float16)x; u16 h; memcpy(&h, &f, 2); return h; }
static u32 mf_pack2(float lo, float hi, int bf16) { return (u32)f2h(lo) | ((u32)f2h(hi) << 16); }
struct uint4_ { u32 x, y, z, w; };
#define uint4 uint4_
static uint4 make_uint4(u32 a, u32 b, u32 c, u32 d) { return {a, b, c, d}; }
#include "win.inc"
#include "fa_q8_funcs.inc"

template <int HD> int check(int n_kv, bool kvmap, unsigned seed) {
    std::mt19937 rng(seed);
    const int nb = n_kv * HD / 32, rowb = nb * 34, n_cells = 3000;
    std::vector<u8> kv((size_t)n_cells * rowb + 64);
    u8 *base = kv.data();  // std::vector of u8 is 16-aligned from new
    for (int c = 0; c < n_cells; ++c)
        for (int b = 0; b < nb; ++b) {
            u8 *blk = base + (size_t)c * rowb + b * 34;
            u16 d = f2h(((rng() % 2000) + 1) * 1e-4f * ((rng() & 1) ? 1 : -1));
            memcpy(blk, &d, 2);
            for (int k = 0; k < 32; ++k) blk[2 + k] = (u8)(int8_t)((int)(rng() % 255) - 127);
        }
    int win[16] = {0};
    int width;
    if (kvmap) { width = 16; win[0] = 400; win[1] = 150; win[2] = 20; win[3] = 300; win[4] = 2000; win[5] = 37; }
    else { width = 2; win[0] = 7; win[1] = 7 + 487; }
    u32 lmax = mf_win_len(win, width);
    int bad = 0, checked = 0;
    const int S = HD + 8, RB = 17 * (HD / 16);
    u16 *tile = (u16 *)SMEM;
    u8 *raw = SMEM + 64 * S * 2;
    for (int hk = 0; hk < n_kv; ++hk) {
        u64 head_off = (u64)hk * (HD / 32 * 34);
        for (u32 t = 0; t < (lmax + 63) / 64 + 1; ++t) {
            memset(SMEM, 0xAB, sizeof SMEM);
            for (threadIdx.x = 0; threadIdx.x < 128; ++threadIdx.x)
                mf_fa_load_q8<HD>(raw, base, rowb, head_off, win, width, lmax, t);
            for (threadIdx.x = 0; threadIdx.x < 128; ++threadIdx.x) mf_fa_deq_q8<HD>(tile, raw);
            for (int j = 0; j < 64; ++j) {
                u32 kl = t * 64 + j;
                for (int e = 0; e < HD; ++e) {
                    float want = 0.0f;
                    if (kl < lmax) {
                        u32 cell = mf_win_cell(win, width, kl);
                        const u8 *blk = base + (size_t)cell * rowb + (hk * HD + e) / 32 * 34;
                        u16 d; memcpy(&d, blk, 2);
                        want = mf_h2f(d) * (float)(int8_t)blk[2 + e % 32];
                    }
                    u16 got = tile[j * S + e];
                    ++checked;
                    if (got != f2h(want)) { if (bad < 5) printf("HD %d hk %d t %u j %d e %d: got %04x want %04x\n", HD, hk, t, j, e, got, f2h(want)); ++bad; }
                }
            }
        }
    }
    printf("HD %d n_kv %d kvmap %d: %d of %d values differ\n", HD, n_kv, kvmap, bad, checked);
    return bad;
}
int main() {
    int bad = 0;
    for (int n_kv : {1, 2, 3, 4}) for (bool m : {false, true}) { bad += check<64>(n_kv, m, 1 + n_kv); bad += check<128>(n_kv, m, 9 + n_kv); }
    printf(bad ? "FAIL\n" : "PASS\n");
    return bad != 0;
}
