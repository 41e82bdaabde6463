/*
 * Runs llama.cpp's own compiled MUL_MAT on Q6_K weights and f32 activations, for
 * crates/cpu/tests/ggml_q6k_tiled.rs (minfer's ggml_x86::q6k_tiled must match it bit for bit).
 *
 * Usage: q6k_tiled DIR NTH [NTH ...]
 *   DIR/cases.txt holds one case per line: "NAME K M N". Per case the harness reads
 *   DIR/NAME.w (M rows of K/256 Q6_K blocks) and DIR/NAME.x (N rows of K f32), and writes
 *   DIR/NAME.q8 (the N activation rows as ggml's Q8_K quantizer encodes them, the bytes the
 *   matmul consumed) and DIR/NAME.y (out[t * M + r], f32). The graph runs once per thread
 *   count NTH; every run after the first must give the same bytes (exit 3 otherwise).
 *   With N >= 8 the CPU backend takes its tiled path; GGML_CPU_TILED_MM=0 in the environment
 *   turns that off (vec_dot instead), which the test uses as its control.
 *
 * Build against the AVX2 peer build (scripts/peer-build, -march=native on this AVX2 VM):
 *   V=$HOME/.cache/minfer/peer/src/llama_cpp_python-0.3.36/vendor/llama.cpp
 *   B=$HOME/.cache/minfer/peer/build
 *   gcc -O2 -c q6k_tiled.c -I$V/ggml/include -o q6k_tiled.o
 *   g++ q6k_tiled.o -o q6k_tiled $B/ggml/src/libggml.a $B/ggml/src/libggml-cpu.a \
 *       $B/ggml/src/libggml-base.a -lm -fopenmp -lpthread
 * (the test does exactly this under its CARGO_TARGET_TMPDIR).
 *
 * AVX-512 build (the Zen 5 -march=native flavour: AVX512 F/BW/DQ/VL/CD + VNNI, BF16, VBMI,
 * AVX-VNNI; no AVX512-FP16, no AMX), from the same source on any x86 host with GCC (compiling
 * needs no AVX-512), ggml targets only:
 *   cmake -S $V -B build512 -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
 *       -DGGML_NATIVE=OFF -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON \
 *       -DGGML_AVX512_VBMI=ON -DGGML_AVX_VNNI=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON \
 *       -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_OPENMP=ON -DGGML_CUDA=OFF -DLLAMA_CURL=OFF
 *   cmake --build build512 -j --target ggml ggml-cpu ggml-base
 *   then the gcc/g++ lines above with B=build512 (the libraries land in build512/ggml/src/;
 *   `-S $V/ggml` builds ggml alone and puts them in build512/src/ instead).
 * Remote comparison: scripts/ggml-harness/q6k-tiled-avx512 [DIR] does the build above here
 * (compiling needs no AVX-512), links this harness statically into DIR/q6k_tiled and writes
 * the test's inputs to DIR/cases (MINFER_Q6K_TILED_STAGE=DIR/cases cargo test -p minfer-cpu
 * --release --test ggml_q6k_tiled). On the AVX-512 host: `DIR/q6k_tiled DIR/cases 1 4 16`;
 * back here, with OUTS holding the .y and .q8 files it wrote:
 *   MINFER_Q6K_TILED_REMOTE=OUTS cargo test -p minfer-cpu --release --test ggml_q6k_tiled
 * compares every output with GgmlSimd::Avx512, bit for bit.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-cpu.h"
#include "ggml.h"

static void *read_file(const char *dir, const char *name, const char *ext, size_t want) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.%s", dir, name, ext);
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", path);
        exit(2);
    }
    void *buf = malloc(want ? want : 1);
    size_t got = fread(buf, 1, want, f);
    fclose(f);
    if (got != want) {
        fprintf(stderr, "%s: %zu bytes, expected %zu\n", path, got, want);
        exit(2);
    }
    return buf;
}

static void write_file(const char *dir, const char *name, const char *ext, const void *buf, size_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.%s", dir, name, ext);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(buf, 1, n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(2);
    }
}

/* One MUL_MAT graph, computed with nth threads into y (n * m floats). */
static void run_case(const void *wq, const float *x, int64_t k, int64_t m, int64_t n, int nth, float *y) {
    const size_t wbytes = (size_t) m * (k / 256) * 210;
    const size_t mem = wbytes + (size_t) (n * k + n * m) * sizeof(float) + 16 * 1024 * 1024;
    struct ggml_init_params ip = { mem, NULL, false };
    struct ggml_context *ctx = ggml_init(ip);
    struct ggml_tensor *w = ggml_new_tensor_2d(ctx, GGML_TYPE_Q6_K, k, m);
    struct ggml_tensor *a = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, n);
    if (ggml_nbytes(w) != wbytes) {
        fprintf(stderr, "Q6_K tensor is %zu bytes, expected %zu\n", ggml_nbytes(w), wbytes);
        exit(2);
    }
    memcpy(w->data, wq, wbytes);
    memcpy(a->data, x, (size_t) (n * k) * sizeof(float));
    struct ggml_tensor *out = ggml_mul_mat(ctx, w, a);
    struct ggml_cgraph *gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    struct ggml_cplan plan = ggml_graph_plan(gf, nth, NULL);
    void *work = malloc(plan.work_size ? plan.work_size : 1);
    plan.work_data = work;
    if (ggml_graph_compute(gf, &plan) != GGML_STATUS_SUCCESS) {
        fprintf(stderr, "graph compute failed\n");
        exit(2);
    }
    memcpy(y, out->data, (size_t) (n * m) * sizeof(float));
    free(work);
    ggml_free(ctx);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s DIR NTH [NTH ...]\n", argv[0]);
        return 2;
    }
    const char *dir = argv[1];
    ggml_cpu_init();
    const ggml_from_float_t q8k = ggml_get_type_traits_cpu(GGML_TYPE_Q8_K)->from_float;

    char path[4096];
    snprintf(path, sizeof path, "%s/cases.txt", dir);
    FILE *cases = fopen(path, "r");
    if (!cases) {
        fprintf(stderr, "cannot open %s\n", path);
        return 2;
    }
    char name[256];
    long long k, m, n;
    int count = 0;
    while (fscanf(cases, "%255s %lld %lld %lld", name, &k, &m, &n) == 4) {
        if (k <= 0 || k % 256 != 0 || m <= 0 || n <= 0) {
            fprintf(stderr, "%s: bad shape k=%lld m=%lld n=%lld\n", name, k, m, n);
            return 2;
        }
        const size_t wbytes = (size_t) m * (k / 256) * 210;
        void *wq = read_file(dir, name, "w", wbytes);
        float *x = read_file(dir, name, "x", (size_t) (n * k) * sizeof(float));

        const size_t arow = (size_t) (k / 256) * 292;
        uint8_t *act = malloc(arow * n);
        for (long long t = 0; t < n; t++) {
            q8k(x + t * k, act + t * arow, k);
        }
        write_file(dir, name, "q8", act, arow * n);

        float *y = malloc((size_t) (n * m) * sizeof(float));
        float *y2 = malloc((size_t) (n * m) * sizeof(float));
        run_case(wq, x, k, m, n, atoi(argv[2]), y);
        for (int i = 3; i < argc; i++) {
            run_case(wq, x, k, m, n, atoi(argv[i]), y2);
            if (memcmp(y, y2, (size_t) (n * m) * sizeof(float)) != 0) {
                fprintf(stderr, "%s: %s threads differ from %s threads\n", name, argv[i], argv[2]);
                return 3;
            }
        }
        write_file(dir, name, "y", y, (size_t) (n * m) * sizeof(float));
        free(wq);
        free(x);
        free(act);
        free(y);
        free(y2);
        count++;
    }
    fclose(cases);
    printf("%d cases\n", count);
    return 0;
}
