// q4k: runs one Q4_K x f32 ggml_mul_mat through llama.cpp's CPU backend with the weight in the
// CPU_REPACK buffer type (the weight is repacked into block_q4_Kx8 on upload, then the op runs
// forward_mul_mat: ggml_quantize_mat_q8_K_4x8 + ggml_gemm_q4_K_8x8_q8_K for rows in groups of
// four, quantize_row_q8_K + ggml_gemv_q4_K_8x8_q8_K for the rest), exactly as llama.cpp runs a
// model's Q4_K weights. Used by crates/cpu/tests/ggml_q4k.rs to check minfer's
// ggml_x86::q4k_repack bit for bit.
//
// Usage: q4k WFMT W X K M N OUT [THREADS]
//   WFMT  q4k: W holds M rows of K/256 Q4_K blocks (144 bytes each)
//         f32: W holds M x K f32 values, quantized here with ggml_quantize_chunk (llama.cpp's
//              Q4_K quantizer, no imatrix); the Q4_K bytes are written to OUT.q4k
//   X     N x K f32 activations;  OUT: N x M f32 (OUT[t*M + r])
// Files are raw little-endian. Exit status 0 only if the op ran on the repack buffer.
//
// Build against the AVX2 peer build (what scripts/ggml-harness/build does):
//   g++ -O2 -march=native -I$V/include -I$V/ggml/include q4k.cpp -o q4k \
//     $B/ggml/src/libggml.a $B/ggml/src/libggml-cpu.a $B/ggml/src/libggml-base.a \
//     -fopenmp -lpthread -ldl
//   with V=$HOME/.cache/minfer/peer/src/llama_cpp_python-0.3.36/vendor/llama.cpp, B=$HOME/.cache/minfer/peer/build
//
// AVX-512 build (to check GgmlSimd::Avx512 on an AVX-512 machine; offline, from the peer SOURCE,
// ggml only; the flags give what -march=native defines on Zen 5: AVX512 F/CD/VL/DQ/BW, VBMI,
// VNNI, BF16 and AVX-VNNI, no AVX512-FP16, no AMX):
//   cmake -S $V/ggml -B /tmp/ggml-avx512 -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
//     -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
//     -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON \
//     -DGGML_AVX_VNNI=ON -DGGML_OPENMP=ON -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF
//   cmake --build /tmp/ggml-avx512 -j --target ggml ggml-cpu ggml-base
//   g++ -O2 -march=znver4 -mavxvnni -I$V/ggml/include q4k.cpp -o q4k-avx512 \
//     /tmp/ggml-avx512/src/libggml.a /tmp/ggml-avx512/src/libggml-cpu.a \
//     /tmp/ggml-avx512/src/libggml-base.a -fopenmp -lpthread -ldl
//   (or -mavx512f -mavx512bw -mavx512dq -mavx512vl -mavx512vnni -mavx512bf16 -mavx512vbmi
//    -mavxvnni -mfma -mf16c instead of -march=znver4 -mavxvnni; the harness itself has no SIMD)
// then: MINFER_Q4K_HARNESS=$PWD/q4k-avx512 MINFER_Q4K_FLAVOUR=avx512 \
//   cargo test --release -p minfer-cpu --test ggml_q4k -- --nocapture
#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

static std::vector<char> read_file(const char *path, size_t want) {
    std::vector<char> v(want);
    FILE *f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "q4k: cannot open %s\n", path); exit(2); }
    size_t got = fread(v.data(), 1, want, f);
    char extra;
    bool more = fread(&extra, 1, 1, f) == 1;
    fclose(f);
    if (got != want || more) {
        fprintf(stderr, "q4k: %s: expected exactly %zu bytes\n", path, want);
        exit(2);
    }
    return v;
}

static void write_file(const std::string &path, const void *data, size_t n) {
    FILE *f = fopen(path.c_str(), "wb");
    if (!f || fwrite(data, 1, n, f) != n) { fprintf(stderr, "q4k: cannot write %s\n", path.c_str()); exit(2); }
    fclose(f);
}

int main(int argc, char **argv) {
    if (argc < 8) {
        fprintf(stderr, "usage: q4k q4k|f32 W X K M N OUT [THREADS]\n");
        return 2;
    }
    const std::string wfmt = argv[1];
    const int64_t K = atoll(argv[4]), M = atoll(argv[5]), N = atoll(argv[6]);
    const std::string out_path = argv[7];
    const int threads = argc > 8 ? atoi(argv[8]) : 1;
    if (K % 256 != 0 || M % 8 != 0 || N < 1) { fprintf(stderr, "q4k: bad shape\n"); return 2; }

    const size_t wbytes = (size_t) M * (K / 256) * 144;
    std::vector<char> wq;
    if (wfmt == "q4k") {
        wq = read_file(argv[2], wbytes);
    } else if (wfmt == "f32") {
        std::vector<char> wf = read_file(argv[2], (size_t) M * K * 4);
        wq.resize(wbytes);
        size_t n = ggml_quantize_chunk(GGML_TYPE_Q4_K, (const float *) wf.data(), wq.data(), 0, M, K, nullptr);
        if (n != wbytes) { fprintf(stderr, "q4k: quantize wrote %zu bytes\n", n); return 2; }
        write_file(out_path + ".q4k", wq.data(), wbytes);
    } else {
        fprintf(stderr, "q4k: WFMT must be q4k or f32\n");
        return 2;
    }
    std::vector<char> x = read_file(argv[3], (size_t) N * K * 4);

    ggml_backend_t cpu = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(cpu, threads);
    ggml_backend_dev_t dev = ggml_backend_get_device(cpu);
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    auto get_extra = (ggml_backend_dev_get_extra_bufts_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
    ggml_backend_buffer_type_t repack = nullptr;
    for (ggml_backend_buffer_type_t *b = get_extra ? get_extra(dev) : nullptr; b && *b; ++b) {
        if (strcmp(ggml_backend_buft_name(*b), "CPU_REPACK") == 0) repack = *b;
    }
    if (!repack) { fprintf(stderr, "q4k: no CPU_REPACK buffer type in this build\n"); return 3; }

    // The weight alone in its own context, allocated in the repack buffer (as llama.cpp's
    // model loader places weights); ggml_backend_tensor_set repacks it.
    ggml_init_params wp = { ggml_tensor_overhead() * 2, nullptr, true };
    ggml_context *wctx = ggml_init(wp);
    ggml_tensor *w = ggml_new_tensor_2d(wctx, GGML_TYPE_Q4_K, K, M);
    ggml_backend_buffer_t wbuf = ggml_backend_alloc_ctx_tensors_from_buft(wctx, repack);
    if (!wbuf) { fprintf(stderr, "q4k: repack buffer allocation failed\n"); return 3; }
    ggml_backend_buffer_set_usage(wbuf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    ggml_backend_tensor_set(w, wq.data(), 0, wbytes);

    ggml_init_params gp = { ggml_tensor_overhead() * 8 + ggml_graph_overhead(), nullptr, true };
    ggml_context *ctx = ggml_init(gp);
    ggml_tensor *xt = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, K, N);
    ggml_tensor *y = ggml_mul_mat(ctx, w, xt);
    ggml_cgraph *gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, y);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, cpu);
    ggml_backend_tensor_set(xt, x.data(), 0, x.size());
    // The op must be one the repack buffer claims, or the CPU backend would read the
    // repacked bytes as plain Q4_K.
    if (!ggml_backend_dev_supports_op(dev, y) || w->extra == nullptr) {
        fprintf(stderr, "q4k: the mul_mat does not take the repack path\n");
        return 3;
    }
    if (ggml_backend_graph_compute(cpu, gf) != GGML_STATUS_SUCCESS) { fprintf(stderr, "q4k: compute failed\n"); return 3; }
    std::vector<float> out((size_t) N * M);
    ggml_backend_tensor_get(y, out.data(), 0, out.size() * 4);
    write_file(out_path, out.data(), out.size() * 4);

    ggml_backend_buffer_free(buf);
    ggml_backend_buffer_free(wbuf);
    ggml_free(ctx);
    ggml_free(wctx);
    ggml_backend_free(cpu);
    return 0;
}
