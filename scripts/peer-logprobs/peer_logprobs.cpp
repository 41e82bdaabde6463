// peer-logprobs: replays a greedy fixture through llama.cpp (the peer build of scripts/peer-build)
// with the oracle settings (n_ctx 4096, n_batch 2048, n_ubatch 512, 2 threads, f16 KV, flash
// attention auto, repack on; prompt in one batch, then one token per step) and prints, per step,
// the top-40 log-probabilities of the plain softmax of the raw logits: "S step id lp id lp ...".
// With DUMP_DIR and DUMP_STEP set it also writes every contiguous f32 tensor of that step
// (eval callback; header: 4 x i64 ne, then the data) for layer-by-layer comparison.
// Input file lines: "P ids..." (prompt), "G ids..." (generated ids to feed), "E" (run).
// Build and run: scripts/peer-logprobs/run MODEL INPUT   (or: run --system-info)
#include "llama.h"
#include "ggml.h"
#include "ggml-backend.h"
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <vector>
#include <string>
#include <algorithm>

static int g_step = -1, g_dump_step = -2;
static const char *g_dump_dir = nullptr;

static bool cb(struct ggml_tensor *t, bool ask, void *) {
    if (g_step != g_dump_step || !g_dump_dir) return false;
    if (ask) return true;
    if (t->type != GGML_TYPE_F32) return true;
    if (!ggml_is_contiguous(t)) return true;
    std::string n = t->name; for (auto &c : n) if (c == '/' || c == ' ') c = '_';
    std::string p = std::string(g_dump_dir) + "/" + n + ".bin";
    std::vector<char> buf(ggml_nbytes(t));
    ggml_backend_tensor_get(t, buf.data(), 0, buf.size());
    FILE *f = fopen(p.c_str(), "wb");
    if (!f) { fprintf(stderr, "peer-logprobs: cannot write %s\n", p.c_str()); exit(1); }
    int64_t ne[4] = {t->ne[0], t->ne[1], t->ne[2], t->ne[3]};
    fwrite(ne, 8, 4, f); fwrite(buf.data(), 1, buf.size(), f); fclose(f);
    return true;
}

int main(int argc, char **argv) {
    // usage: ldump MODEL INPUT   (INPUT lines: "P ids..." prompt, "G ids..." generated, "Q ids..." query ids per step)
    // `--system-info`: the build's CPU features (llama.cpp's own line), so a gate can tell which
    // arithmetic this peer runs (an AMX build sends Q4_K/Q8_0 matmuls to its AMX kernels, not
    // to CPU_REPACK) before it trusts the dumps.
    if (argc == 2 && strcmp(argv[1], "--system-info") == 0) { printf("%s\n", llama_print_system_info()); return 0; }
    const char *model_path = argv[1];
    FILE *in = fopen(argv[2], "r");
    if (getenv("DUMP_STEP")) g_dump_step = atoi(getenv("DUMP_STEP"));
    g_dump_dir = getenv("DUMP_DIR");
    llama_backend_init();
    auto mp = llama_model_default_params();
    llama_model *model = llama_model_load_from_file(model_path, mp);
    auto cp = llama_context_default_params();
    cp.n_ctx = 4096; cp.n_batch = 2048; cp.n_ubatch = 512; cp.n_threads = 2; cp.n_threads_batch = 2;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_AUTO;
    if (g_dump_dir) { cp.cb_eval = cb; cp.cb_eval_user_data = nullptr; }
    llama_context *ctx = llama_init_from_model(model, cp);
    const llama_vocab *vocab = llama_model_get_vocab(model);
    int nv = llama_vocab_n_tokens(vocab);
    char line[1 << 16];
    std::vector<int> prompt, gen;
    while (fgets(line, sizeof line, in)) {
        std::vector<int> v; char *p = line + 1;
        while (true) { char *e; long x = strtol(p, &e, 10); if (e == p) break; v.push_back((int)x); p = e; }
        if (line[0] == 'P') prompt = v;
        else if (line[0] == 'G') gen = v;
        else if (line[0] == 'E') {
            llama_memory_clear(llama_get_memory(ctx), true);
            int nsteps = gen.size();
            for (int k = 0; k < nsteps; k++) {
                g_step = k;
                llama_batch b = llama_batch_init(std::max<int>(prompt.size(), 1), 0, 1);
                if (k == 0) {
                    b.n_tokens = prompt.size();
                    for (size_t i = 0; i < prompt.size(); i++) { b.token[i] = prompt[i]; b.pos[i] = i; b.n_seq_id[i] = 1; b.seq_id[i][0] = 0; b.logits[i] = i + 1 == prompt.size(); }
                } else {
                    b.n_tokens = 1; b.token[0] = gen[k - 1]; b.pos[0] = prompt.size() + k - 1; b.n_seq_id[0] = 1; b.seq_id[0][0] = 0; b.logits[0] = 1;
                }
                if (llama_decode(ctx, b)) { fprintf(stderr, "decode failed\n"); return 1; }
                llama_batch_free(b);
                float *lg = llama_get_logits_ith(ctx, -1);
                double m = -1e30; for (int i = 0; i < nv; i++) m = std::max(m, (double)lg[i]);
                double z = 0; for (int i = 0; i < nv; i++) z += exp(lg[i] - m);
                std::vector<int> idx(nv); for (int i = 0; i < nv; i++) idx[i] = i;
                std::partial_sort(idx.begin(), idx.begin() + 40, idx.end(), [&](int a, int c) { return lg[a] > lg[c]; });
                printf("S %d", k);
                for (int j = 0; j < 40; j++) printf(" %d %.9f", idx[j], lg[idx[j]] - m - log(z));
                printf("\n");
                fflush(stdout);
            }
        }
    }
    return 0;
}
