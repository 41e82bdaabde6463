// The emulator runtime: kernel registry, threadgroup arena, and the SIMT scheduler that runs a
// threadgroup's threads as coroutines on one OS thread.
//
// Scheduling: every thread runs until it reaches a sync point (threadgroup_barrier, a simd
// collective) or returns. When none can run, the scheduler resolves: first any simdgroup whose
// live lanes all wait at the same collective site, else the threadgroup barrier (every live
// thread at the same site, and no thread returned). Anything else is divergence and is
// reported with the .metal file and line. Between sync points the run order is forward,
// reverse or seeded-random, and threadgroup memory starts as NaN-poison (0xFF bytes), so a
// missing barrier shows as output that changes with the schedule.
#define EMU_RUNTIME
#include "emu_runtime.h"

#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#if defined(__x86_64__)
extern "C" void emu_switch(void ** save_sp, void * new_sp);
// Saves the callee-saved registers, MXCSR and the x87 control word on the current stack,
// stores the stack pointer to *save_sp and resumes the context whose stack is new_sp.
asm(R"(
.text
.globl emu_switch
.type emu_switch,@function
emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
.size emu_switch, .-emu_switch
.section .note.GNU-stack,"",@progbits
.text
)");
#else
#include <ucontext.h>
#endif

namespace emu {
namespace {

enum State { RUNNABLE = 0, AT_BARRIER = 1, AT_SIMD = 2, DONE = 3 };

struct Thread {
#if defined(__x86_64__)
    void * sp = nullptr;
#else
    ucontext_t uc;
#endif
    char * stack = nullptr;
    unsigned index = 0;
    unsigned tid3[3] = {0, 0, 0};
    int state = RUNNABLE;
    const char * file = "";
    int line = 0;
    const char * op = "";
    unsigned coll = 0;
    alignas(16) unsigned char slot[2][64];
};

struct KernelInfo {
    std::string name;
    void (*fn)();
    std::vector<ParamInfo> params;
    std::string file;
};

std::vector<KernelInfo> & registry() {
    static std::vector<KernelInfo> r;
    return r;
}

constexpr size_t STACK_BYTES = 128 * 1024;
constexpr unsigned MAX_THREADS = 1024;
constexpr size_t ARENA_SLACK = 64 * 1024;

struct Ctx {
    // coroutine machinery, kept across dispatches on this OS thread
    std::vector<Thread> threads;
    char * stacks = nullptr;
    size_t page = 4096;
#if defined(__x86_64__)
    void * sched_sp = nullptr;
    unsigned mxcsr_init = 0x1f80;
#else
    ucontext_t sched_uc;
#endif
    Thread * cur = nullptr;
    // dispatch
    const KernelInfo * kernel = nullptr;
    const EmuDispatch * d = nullptr;
    unsigned nthreads = 0;
    unsigned tgpig[3] = {0, 0, 0};
    std::vector<unsigned char> arena;
    size_t dyn_off[EMU_MAX_TG_BUFFERS] = {};
    size_t static_base = 0, static_used = 0;
    std::vector<std::pair<int, size_t>> statics;
    uint64_t simd_mask[MAX_THREADS / 32][2] = {};
    uint64_t rng = 0;
    uint64_t deadline_ns = 0; // CLOCK_MONOTONIC; 0 = none
    bool failed = false;
    std::string error;
};

// One Ctx per OS thread, freed (stacks unmapped) when the thread exits.
struct CtxHolder {
    Ctx * c = nullptr;
    ~CtxHolder();
};
thread_local CtxHolder g_holder;
thread_local Ctx * g_ctx = nullptr;

size_t stack_span(const Ctx & c) { return STACK_BYTES + c.page; }

CtxHolder::~CtxHolder() {
    if (!c) return;
    for (Thread & t : c->threads) {
        if (t.stack) munmap(t.stack - c->page, stack_span(*c));
    }
    delete c;
    g_ctx = nullptr;
}

Ctx & ctx() {
    if (!g_ctx) {
        g_ctx = new Ctx();
        g_holder.c = g_ctx;
        g_ctx->threads.resize(MAX_THREADS);
        g_ctx->page = size_t(sysconf(_SC_PAGESIZE));
#if defined(__x86_64__)
        g_ctx->mxcsr_init = __builtin_ia32_stmxcsr();
#endif
    }
    return *g_ctx;
}

// Maps stacks for the first n threads on demand, each with a guard page at its low end so
// an overflow faults instead of corrupting a neighbour.
bool ensure_stacks(Ctx & c, unsigned n) {
    for (unsigned i = 0; i < n; ++i) {
        Thread & t = c.threads[i];
        if (t.stack) continue;
        void * mem = mmap(nullptr, stack_span(c), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (mem == MAP_FAILED) return false;
        mprotect(mem, c.page, PROT_NONE);
        t.stack = static_cast<char *>(mem) + c.page;
    }
    return true;
}

uint64_t now_ns() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

void fail(Ctx & c, const std::string & msg) {
    if (!c.failed) {
        c.failed = true;
        c.error = msg;
    }
}

std::string site(const Thread & t) {
    return std::string(t.op) + " at " + t.file + ":" + std::to_string(t.line);
}

std::string tg_name(const Ctx & c) {
    return c.kernel->name + " threadgroup (" + std::to_string(c.tgpig[0]) + "," + std::to_string(c.tgpig[1]) + "," +
           std::to_string(c.tgpig[2]) + ")";
}

void coro_main() {
    Ctx & c = *g_ctx;
    Thread * t = c.cur;
    c.kernel->fn();
    t->state = DONE;
#if defined(__x86_64__)
    void * dead;
    emu_switch(&dead, c.sched_sp);
#else
    swapcontext(&t->uc, &c.sched_uc);
#endif
    __builtin_unreachable();
}

void start_thread(Ctx & c, Thread & t) {
#if defined(__x86_64__)
    // Initial frame popped by emu_switch: [mxcsr|fpucw][r15][r14][r13][r12][rbx][rbp][ret].
    uintptr_t top = (uintptr_t(t.stack) + STACK_BYTES) & ~uintptr_t(15);
    uintptr_t ret_slot = top - 16; // 16-aligned, so coro_main starts with rsp % 16 == 8
    uint64_t * sp = reinterpret_cast<uint64_t *>(ret_slot) - 7;
    for (int i = 1; i < 7; ++i) sp[i] = 0;
    uint32_t csr[2] = {c.mxcsr_init, 0x037f};
    std::memcpy(sp, csr, 8);
    *reinterpret_cast<uint64_t *>(ret_slot) = uint64_t(uintptr_t(&coro_main));
    t.sp = sp;
#else
    getcontext(&t.uc);
    t.uc.uc_stack.ss_sp = t.stack;
    t.uc.uc_stack.ss_size = STACK_BYTES;
    t.uc.uc_link = nullptr;
    makecontext(&t.uc, coro_main, 0);
#endif
}

void resume(Ctx & c, Thread & t) {
    c.cur = &t;
#if defined(__x86_64__)
    emu_switch(&c.sched_sp, t.sp);
#else
    swapcontext(&c.sched_uc, &t.uc);
#endif
    c.cur = nullptr;
}

void yield(Ctx & c) {
    Thread * t = c.cur;
#if defined(__x86_64__)
    emu_switch(&t->sp, c.sched_sp);
#else
    swapcontext(&t->uc, &c.sched_uc);
#endif
}

uint64_t next_rand(Ctx & c) {
    // xorshift64*
    c.rng ^= c.rng >> 12;
    c.rng ^= c.rng << 25;
    c.rng ^= c.rng >> 27;
    return c.rng * 0x2545F4914F6CDD1DULL;
}

void order(Ctx & c, std::vector<unsigned> & v) {
    if (c.d->schedule == EMU_SCHEDULE_REVERSE) {
        for (size_t i = 0; i < v.size() / 2; ++i) std::swap(v[i], v[v.size() - 1 - i]);
    } else if (c.d->schedule == EMU_SCHEDULE_RANDOM) {
        for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[next_rand(c) % i]);
    }
}

bool same_site(const Thread & a, const Thread & b) {
    return a.line == b.line && std::strcmp(a.file, b.file) == 0 && std::strcmp(a.op, b.op) == 0;
}

// Resolves simd collectives. Returns true when at least one simdgroup was released.
bool resolve_simd(Ctx & c) {
    bool any = false;
    unsigned nsg = (c.nthreads + 31) / 32;
    for (unsigned g = 0; g < nsg && !c.failed; ++g) {
        unsigned lo = g * 32, hi = std::min(c.nthreads, lo + 32);
        const Thread * first = nullptr;
        for (unsigned i = lo; i < hi; ++i) {
            if (c.threads[i].state == AT_SIMD) {
                first = &c.threads[i];
                break;
            }
        }
        if (!first) continue;
        uint64_t mask = 0;
        for (unsigned i = lo; i < hi; ++i) {
            const Thread & t = c.threads[i];
            if (t.state == DONE) continue;
            if (t.state != AT_SIMD || !same_site(t, *first)) {
                fail(c, "simdgroup divergence in " + tg_name(c) + ", simdgroup " + std::to_string(g) + ": lane " +
                            std::to_string(first->index - lo) + " waits at " + site(*first) + " while lane " +
                            std::to_string(i - lo) + " waits at " + site(t));
                return false;
            }
            mask |= uint64_t(1) << (i - lo);
        }
        c.simd_mask[g][first->coll & 1] = mask;
        for (unsigned i = lo; i < hi; ++i) {
            if (c.threads[i].state == AT_SIMD) c.threads[i].state = RUNNABLE;
        }
        any = true;
    }
    return any;
}

void resolve_barrier(Ctx & c) {
    const Thread * first = nullptr;
    unsigned done = 0, waiting = 0;
    const Thread * a_done = nullptr;
    for (unsigned i = 0; i < c.nthreads; ++i) {
        const Thread & t = c.threads[i];
        if (t.state == DONE) {
            ++done;
            if (!a_done) a_done = &t;
        } else if (t.state == AT_BARRIER) {
            ++waiting;
            if (!first) first = &t;
            else if (!same_site(t, *first)) {
                fail(c, "barrier divergence in " + tg_name(c) + ": thread " + std::to_string(first->index) +
                            " waits at " + site(*first) + " while thread " + std::to_string(t.index) + " waits at " +
                            site(t));
                return;
            }
        }
    }
    if (waiting && done) {
        fail(c, "barrier divergence in " + tg_name(c) + ": " + std::to_string(done) + " thread(s) (first: " +
                    std::to_string(a_done->index) + ") returned while " + std::to_string(waiting) +
                    " wait at " + site(*first));
        return;
    }
    for (unsigned i = 0; i < c.nthreads; ++i) {
        if (c.threads[i].state == AT_BARRIER) c.threads[i].state = RUNNABLE;
    }
}

void run_threadgroup(Ctx & c) {
    std::memset(c.arena.data(), 0xff, c.arena.size());
    c.statics.clear();
    c.static_used = c.static_base;
    std::memset(c.simd_mask, 0, sizeof(c.simd_mask));
    const unsigned * tg = c.d->tg;
    for (unsigned i = 0; i < c.nthreads; ++i) {
        Thread & t = c.threads[i];
        t.index = i;
        t.tid3[0] = i % tg[0];
        t.tid3[1] = (i / tg[0]) % tg[1];
        t.tid3[2] = i / (tg[0] * tg[1]);
        t.state = RUNNABLE;
        t.coll = 0;
        start_thread(c, t);
    }
    std::vector<unsigned> runnable;
    runnable.reserve(c.nthreads);
    for (;;) {
        runnable.clear();
        for (unsigned i = 0; i < c.nthreads; ++i) {
            if (c.threads[i].state == RUNNABLE) runnable.push_back(i);
        }
        order(c, runnable);
        for (unsigned i : runnable) {
            resume(c, c.threads[i]);
            if (c.failed) return;
        }
        bool all_done = true;
        for (unsigned i = 0; i < c.nthreads; ++i) all_done &= c.threads[i].state == DONE;
        if (all_done) return;
        // The submit bound: a kernel that keeps meeting sync points past its budget is stopped
        // (one that never reaches a sync point cannot be interrupted here).
        if (c.deadline_ns && now_ns() > c.deadline_ns) {
            fail(c, "no completion within the submit bound: " + tg_name(c) + " still running");
            return;
        }
        if (resolve_simd(c)) continue;
        if (c.failed) return;
        resolve_barrier(c);
        if (c.failed) return;
    }
}

} // namespace

void * arg_buffer_ptr(int index) {
    Ctx & c = *g_ctx;
    return const_cast<void *>(c.d->args[index].ptr);
}

void * arg_threadgroup_ptr(int index) {
    Ctx & c = *g_ctx;
    return c.arena.data() + c.dyn_off[index];
}

void builtin3(int which, unsigned out[3]) {
    Ctx & c = *g_ctx;
    const Thread & t = *c.cur;
    const unsigned * tg = c.d->tg;
    const unsigned * grid = c.d->grid;
    out[0] = out[1] = out[2] = 0;
    switch (which) {
    case B_THREAD_POSITION_IN_GRID:
        for (int i = 0; i < 3; ++i) out[i] = c.tgpig[i] * tg[i] + t.tid3[i];
        break;
    case B_THREADGROUP_POSITION_IN_GRID:
        for (int i = 0; i < 3; ++i) out[i] = c.tgpig[i];
        break;
    case B_THREAD_POSITION_IN_THREADGROUP:
        for (int i = 0; i < 3; ++i) out[i] = t.tid3[i];
        break;
    case B_THREAD_INDEX_IN_THREADGROUP: out[0] = t.index; break;
    case B_THREADS_PER_THREADGROUP:
        for (int i = 0; i < 3; ++i) out[i] = tg[i];
        break;
    case B_THREADGROUPS_PER_GRID:
        for (int i = 0; i < 3; ++i) out[i] = grid[i];
        break;
    case B_SIMDGROUP_INDEX_IN_THREADGROUP: out[0] = t.index / 32; break;
    case B_THREAD_INDEX_IN_SIMDGROUP: out[0] = t.index % 32; break;
    case B_THREADS_PER_SIMDGROUP: out[0] = 32; break;
    case B_SIMDGROUPS_PER_THREADGROUP: out[0] = (c.nthreads + 31) / 32; break;
    case B_THREADS_PER_GRID:
        for (int i = 0; i < 3; ++i) out[i] = grid[i] * tg[i];
        break;
    default: break;
    }
}

void * tg_static(int id, size_t bytes, size_t align) {
    Ctx & c = *g_ctx;
    for (auto & s : c.statics) {
        if (s.first == id) return c.arena.data() + s.second;
    }
    size_t off = (c.static_used + align - 1) / align * align;
    if (off + bytes > c.d->tg_mem_limit) {
        fail(c, "threadgroup memory of " + c.kernel->name + " needs " + std::to_string(off + bytes) +
                    " bytes, device limit " + std::to_string(c.d->tg_mem_limit));
        // keep the thread running on slack memory until the scheduler aborts at its next stop
        return c.arena.data() + c.arena.size() - ARENA_SLACK;
    }
    c.statics.push_back({id, off});
    c.static_used = off + bytes;
    return c.arena.data() + off;
}

void tg_barrier(const char * file, int line) {
    Ctx & c = *g_ctx;
    Thread & t = *c.cur;
    t.state = AT_BARRIER;
    t.file = file;
    t.line = line;
    t.op = "threadgroup_barrier";
    yield(c);
}

uint64_t simd_sync(const void * val, size_t n, const char * op, const char * file, int line) {
    Ctx & c = *g_ctx;
    Thread & t = *c.cur;
    if (n > sizeof(t.slot[0])) {
        fail(c, std::string(op) + " on a value wider than 64 bytes");
        n = 0;
    }
    if (n) std::memcpy(t.slot[t.coll & 1], val, n);
    t.state = AT_SIMD;
    t.file = file;
    t.line = line;
    t.op = op;
    yield(c);
    return c.simd_mask[t.index / 32][t.coll & 1];
}

const void * simd_value(unsigned lane) {
    Ctx & c = *g_ctx;
    const Thread & t = *c.cur;
    unsigned idx = (t.index / 32) * 32 + lane;
    return c.threads[idx].slot[t.coll & 1];
}

unsigned simd_lane() { return g_ctx->cur->index % 32; }

void simd_done() { g_ctx->cur->coll += 1; }

void register_kernel(const char * name, void (*fn)(), const ParamInfo * params, int n_params, const char * file) {
    KernelInfo k;
    k.name = name;
    k.fn = fn;
    k.params.assign(params, params + n_params);
    k.file = file;
    registry().push_back(std::move(k));
}

} // namespace emu

using namespace emu;

extern "C" void emu_register_all();

namespace {
void ensure_registered() {
    static bool done = false; // guarded by the Rust side's Once
    if (!done) {
        emu_register_all();
        done = true;
    }
}
const KernelInfo * find_kernel(const char * name) {
    for (auto & k : registry()) {
        if (k.name == name) return &k;
    }
    return nullptr;
}
void set_err(const EmuDispatch * d, const std::string & msg) {
    if (d->err && d->err_cap) {
        size_t n = std::min(msg.size(), size_t(d->err_cap - 1));
        std::memcpy(d->err, msg.data(), n);
        d->err[n] = 0;
    }
}
} // namespace

extern "C" void emu_init() { ensure_registered(); }

extern "C" unsigned emu_kernel_count() { return unsigned(registry().size()); }

extern "C" const char * emu_kernel_name(unsigned i) { return i < registry().size() ? registry()[i].name.c_str() : nullptr; }

extern "C" int emu_dispatch(const EmuDispatch * d) {
    const KernelInfo * k = find_kernel(d->kernel);
    if (!k) {
        set_err(d, std::string("no kernel named ") + d->kernel);
        return 1;
    }
    // Check the bindings against what the kernel declares.
    for (const ParamInfo & p : k->params) {
        if (p.kind == P_BUFFER) {
            if (p.index < 0 || unsigned(p.index) >= d->n_args || !d->args[p.index].ptr) {
                set_err(d, k->name + " binds buffer(" + std::to_string(p.index) + ") but the dispatch passes " +
                               std::to_string(d->n_args) + " argument(s)");
                return 1;
            }
            if (p.ref_size && d->args[p.index].len < p.ref_size) {
                set_err(d, k->name + " reads " + std::to_string(p.ref_size) + " bytes at buffer(" +
                               std::to_string(p.index) + ") but only " + std::to_string(d->args[p.index].len) +
                               " are bound (params struct mismatch?)");
                return 1;
            }
        } else if (p.kind == P_THREADGROUP) {
            if (p.index < 0 || unsigned(p.index) >= d->n_tg || d->tg_len[p.index] == 0) {
                set_err(d, k->name + " uses threadgroup(" + std::to_string(p.index) + ") but no length was set");
                return 1;
            }
        }
    }
    unsigned nthreads = d->tg[0] * d->tg[1] * d->tg[2];
    if (nthreads == 0 || nthreads > MAX_THREADS || nthreads > d->max_threads) {
        set_err(d, k->name + ": threadgroup of " + std::to_string(nthreads) + " threads (limit " +
                       std::to_string(std::min(MAX_THREADS, d->max_threads)) + ")");
        return 1;
    }
    Ctx & c = ctx();
    if (!ensure_stacks(c, nthreads)) {
        set_err(d, k->name + ": cannot map coroutine stacks");
        return 1;
    }
    c.kernel = k;
    c.d = d;
    c.nthreads = nthreads;
    c.failed = false;
    c.error.clear();
    c.rng = d->seed * 0x9E3779B97F4A7C15ULL + 1;
    c.deadline_ns = d->timeout_ns ? now_ns() + d->timeout_ns : 0;
    size_t off = 0;
    for (unsigned i = 0; i < d->n_tg && i < EMU_MAX_TG_BUFFERS; ++i) {
        c.dyn_off[i] = off;
        off += (d->tg_len[i] + 15) / 16 * 16;
    }
    if (off > d->tg_mem_limit) {
        set_err(d, k->name + ": threadgroup memory " + std::to_string(off) + " bytes exceeds the device limit " +
                       std::to_string(d->tg_mem_limit));
        return 1;
    }
    c.static_base = off;
    c.arena.assign(d->tg_mem_limit + ARENA_SLACK, 0);
    std::vector<unsigned> groups;
    unsigned long long total = (unsigned long long)d->grid[0] * d->grid[1] * d->grid[2];
    groups.reserve(size_t(total));
    for (unsigned long long i = 0; i < total; ++i) groups.push_back(unsigned(i));
    order(c, groups);
    for (unsigned g : groups) {
        c.tgpig[0] = g % d->grid[0];
        c.tgpig[1] = (g / d->grid[0]) % d->grid[1];
        c.tgpig[2] = g / (d->grid[0] * d->grid[1]);
        run_threadgroup(c);
        if (c.failed) {
            set_err(d, c.error);
            return 1;
        }
    }
    return 0;
}
