// The emulator runtime: kernel registry, threadgroup arena, the SIMT scheduler that runs a
// threadgroup's threads as coroutines on one OS thread, and the worker pool that runs the
// threadgroups of one dispatch on several OS threads.
//
// Scheduling: every thread runs until it reaches a sync point (threadgroup_barrier, a simd
// collective) or returns. When none can run, the scheduler resolves: first any simdgroup whose
// live lanes all wait at the same collective site, else the threadgroup barrier (every live
// thread at the same site, and no thread returned). Anything else is divergence and is
// reported with the .metal file and line. Between sync points the run order is forward,
// reverse or seeded-random, and threadgroup memory starts as NaN-poison (0xFF bytes), so a
// missing barrier shows as output that changes with the schedule.
//
// Parallelism: threadgroups are independent (Metal gives no order between them), so a
// dispatch hands its threadgroups out, in the schedule's threadgroup order, to the calling
// thread and up to `workers - 1` threads of a persistent pool. Each OS thread has its own
// coroutine stacks and arena; a threadgroup's random schedule is seeded from the dispatch seed
// and the threadgroup's index, so every threadgroup computes the same bytes whatever the
// worker count. Of several failing threadgroups, the one earliest in the hand-out order is
// reported (the one a sequential run stops at); the later ones are not started.
#define EMU_RUNTIME
#include "emu_runtime.h"

#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

// The hand-written x86-64 switch, or POSIX ucontext elsewhere (and with -DEMU_FORCE_UCONTEXT,
// e.g. through MINFER_EMU_CXXFLAGS, to test that path on x86-64).
#if defined(__x86_64__) && !defined(EMU_FORCE_UCONTEXT)
#define EMU_X86_SWITCH 1
#else
#define EMU_X86_SWITCH 0
#endif

#if EMU_X86_SWITCH
extern "C" void emu_switch(void ** save_sp, void * new_sp);
// Saves the callee-saved integer registers on the current stack, stores the stack pointer to
// *save_sp and resumes the context whose stack is new_sp. MXCSR and the x87 control word are
// not switched: every coroutine of an OS thread shares its floating-point environment (no
// kernel changes rounding modes).
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
    movq %rsp, (%rdi)
    movq %rsi, %rsp
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

__thread MemoCursor memo_cursor = {nullptr, nullptr};
__thread GroupView group_view = {};
__thread const ThreadIds * cur_ids = nullptr;

namespace {

enum State { RUNNABLE = 0, AT_BARRIER = 1, AT_SIMD = 2, DONE = 3 };

struct Thread : ThreadIds {
#if EMU_X86_SWITCH
    void * sp = nullptr;
#else
    ucontext_t uc;
#endif
    char * stack = nullptr;     // the stack mapped for slot i (the worker's stack pool)
    char * run_stack = nullptr; // the stack this thread runs on, taken at its first resume
    bool started = false;
    int state = RUNNABLE;
    int line = 0;
    const char * file = "";
    const char * op = "";
    unsigned coll = 0;
    alignas(64) unsigned char slot[2][64];
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
constexpr uint64_t NONE = ~uint64_t(0);
constexpr unsigned MEMO_SLOTS = 128; // loads and products per simdgroup between sync points

// One dispatch, shared by every OS thread working on it (read-only but for the atomics and
// the error slot).
struct Job {
    const KernelInfo * kernel = nullptr;
    const EmuDispatch * d = nullptr;
    unsigned nthreads = 0;
    size_t dyn_off[EMU_MAX_TG_BUFFERS] = {};
    size_t dyn_end = 0; // bytes of dynamic threadgroup memory (poisoned per threadgroup)
    uint64_t total = 0;
    const std::vector<unsigned> * order = nullptr; // random schedule: the threadgroup order
    uint64_t deadline_ns = 0;                      // CLOCK_MONOTONIC; 0 = none
    std::atomic<uint64_t> next{0};                 // next hand-out position
    std::atomic<uint64_t> stop_at{NONE};           // earliest failed position
    std::mutex err_mu;
    uint64_t err_pos = NONE;
    std::string error;
    unsigned max_helpers = 0; // pool threads that may join (workers - 1)
    unsigned helpers = 0;     // pool threads working on it; guarded by the pool mutex

    unsigned group_at(uint64_t pos) const {
        if (order) return (*order)[pos];
        if (d->schedule == EMU_SCHEDULE_REVERSE) return unsigned(total - 1 - pos);
        return unsigned(pos);
    }
    bool has_work() const {
        uint64_t n = next.load(std::memory_order_relaxed);
        return n < total && n <= stop_at.load(std::memory_order_relaxed);
    }
    void record_error(uint64_t pos, std::string msg) {
        std::lock_guard<std::mutex> lk(err_mu);
        if (pos < err_pos) {
            err_pos = pos;
            error = std::move(msg);
        }
        uint64_t s = stop_at.load(std::memory_order_relaxed);
        while (pos < s && !stop_at.compare_exchange_weak(s, pos, std::memory_order_relaxed)) {
        }
    }
};

// One worker's state: coroutine machinery and arena (kept across dispatches on its OS
// thread) and the threadgroup it runs.
struct Ctx {
    std::vector<Thread> threads;
    size_t page = 4096;
#if EMU_X86_SWITCH
    void * sched_sp = nullptr;
#else
    ucontext_t sched_uc;
#endif
    Thread * cur = nullptr;
    Job * job = nullptr;
    const KernelInfo * kernel = nullptr;
    const EmuDispatch * d = nullptr;
    unsigned nthreads = 0;
    unsigned nsg = 0;
    unsigned tgpig[3] = {0, 0, 0};
    std::vector<unsigned char> arena;
    std::vector<void *> arg_ptrs; // the dispatch's argument pointers (group_view.args)
    size_t arena_len = 0; // tg_mem_limit + ARENA_SLACK of the current dispatch
    size_t static_used = 0;
    std::vector<std::pair<int, size_t>> statics;
    uint64_t simd_mask[MAX_THREADS / 32][2] = {};
    alignas(64) unsigned char simd_shared[MAX_THREADS / 32][2][64] = {};
    bool simd_shared_ok[MAX_THREADS / 32][2] = {};
    std::vector<unsigned> runnable;
    // Stacks not held by a started, unfinished thread: a thread takes one at its first resume
    // and gives it back when it returns, so threads that never wait (kernels without sync
    // points) all run on the same hot stack.
    std::vector<char *> free_stacks;
    std::vector<unsigned char> memo; // MEMO_SLOTS slots per simdgroup, content-keyed
    uint64_t next_matrix_id = 0;
    unsigned n_done = 0;
    uint64_t rng = 0;
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
        g_ctx->runnable.reserve(MAX_THREADS);
        g_ctx->free_stacks.reserve(MAX_THREADS);
        g_ctx->page = size_t(sysconf(_SC_PAGESIZE));
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
    c.n_done += 1;
    // still running on it, but nothing of this frame is needed once switched away
    c.free_stacks.push_back(t->run_stack);
#if EMU_X86_SWITCH
    void * dead;
    emu_switch(&dead, c.sched_sp);
#else
    swapcontext(&t->uc, &c.sched_uc);
#endif
    __builtin_unreachable();
}

void start_thread(Ctx & c, Thread & t) {
#if EMU_X86_SWITCH
    // Initial frame popped by emu_switch: [r15][r14][r13][r12][rbx][rbp][ret]. The top is
    // staggered by a cache line per thread, so the threads' hot frames do not all fall in
    // the same L1 sets.
    uintptr_t top = (uintptr_t(t.run_stack) + STACK_BYTES - (t.index % 64) * 64) & ~uintptr_t(15);
    uintptr_t ret_slot = top - 16; // 16-aligned, so coro_main starts with rsp % 16 == 8
    uint64_t * sp = reinterpret_cast<uint64_t *>(ret_slot) - 6;
    for (int i = 0; i < 6; ++i) sp[i] = 0;
    *reinterpret_cast<uint64_t *>(ret_slot) = uint64_t(uintptr_t(&coro_main));
    t.sp = sp;
#else
    getcontext(&t.uc);
    t.uc.uc_stack.ss_sp = t.run_stack;
    t.uc.uc_stack.ss_size = STACK_BYTES;
    t.uc.uc_link = nullptr;
    makecontext(&t.uc, coro_main, 0);
#endif
}

inline void resume(Ctx & c, Thread & t) {
    if (!t.started) {
        t.run_stack = c.free_stacks.back();
        c.free_stacks.pop_back();
        start_thread(c, t);
        t.started = true;
    }
    c.cur = &t;
    cur_ids = &t;
    // The lane's memo slots, numbered from its last sync point: a run goes from one sync point
    // to the next.
    memo_cursor.next = c.memo.data() + size_t(t.index / 32) * (MEMO_SLOTS * MEMO_BYTES);
    memo_cursor.end = memo_cursor.next + MEMO_SLOTS * MEMO_BYTES;
#if EMU_X86_SWITCH
    emu_switch(&c.sched_sp, t.sp);
#else
    swapcontext(&c.sched_uc, &t.uc);
#endif
    c.cur = nullptr;
}

inline void yield(Ctx & c) {
    Thread * t = c.cur;
#if EMU_X86_SWITCH
    emu_switch(&t->sp, c.sched_sp);
#else
    swapcontext(&t->uc, &c.sched_uc);
#endif
}

uint64_t next_rand(uint64_t & s) {
    // xorshift64*
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return s * 0x2545F4914F6CDD1DULL;
}

uint64_t mix64(uint64_t z) {
    // splitmix64's finaliser
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

void order(unsigned schedule, uint64_t & rng, std::vector<unsigned> & v) {
    if (schedule == EMU_SCHEDULE_REVERSE) {
        std::reverse(v.begin(), v.end());
    } else if (schedule == EMU_SCHEDULE_RANDOM) {
        for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[next_rand(rng) % i]);
    }
}

// Call sites come from __builtin_FILE() literals, merged within a translation unit, so the
// pointers are nearly always equal; the string compare is the fallback.
inline bool same_str(const char * a, const char * b) { return a == b || std::strcmp(a, b) == 0; }

inline bool same_site(const Thread & a, const Thread & b) {
    return a.line == b.line && same_str(a.file, b.file) && same_str(a.op, b.op);
}

// Resolves simd collectives. Returns true when at least one simdgroup was released.
bool resolve_simd(Ctx & c) {
    bool any = false;
    for (unsigned g = 0; g < c.nsg && !c.failed; ++g) {
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
        unsigned p = first->coll & 1;
        c.simd_mask[g][p] = mask;
        c.simd_shared_ok[g][p] = false;
        for (uint64_t m = mask; m; m &= m - 1) {
            unsigned k = lo + unsigned(__builtin_ctzll(m));
            c.threads[k].state = RUNNABLE;
            c.runnable.push_back(k);
        }
        any = true;
    }
    return any;
}

void resolve_barrier(Ctx & c) {
    const Thread * first = nullptr;
    unsigned waiting = 0;
    const Thread * a_done = nullptr;
    for (unsigned i = 0; i < c.nthreads; ++i) {
        const Thread & t = c.threads[i];
        if (t.state == DONE) {
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
    if (waiting && c.n_done) {
        fail(c, "barrier divergence in " + tg_name(c) + ": " + std::to_string(c.n_done) + " thread(s) (first: " +
                    std::to_string(a_done->index) + ") returned while " + std::to_string(waiting) +
                    " wait at " + site(*first));
        return;
    }
    for (unsigned i = 0; i < c.nthreads; ++i) {
        if (c.threads[i].state == AT_BARRIER) {
            c.threads[i].state = RUNNABLE;
            c.runnable.push_back(i);
        }
    }
}

void run_threadgroup(Ctx & c) {
    // Poison the dynamic threadgroup buffers; kernel-scope threadgroup variables are poisoned
    // as they are placed (tg_static).
    if (c.job->dyn_end) std::memset(c.arena.data(), 0xff, c.job->dyn_end);
    c.statics.clear();
    c.static_used = c.job->dyn_end;
    c.failed = false;
    c.n_done = 0;
    const unsigned * tg = c.d->tg;
    c.runnable.clear();
    unsigned x = 0, y = 0, z = 0;
    for (unsigned i = 0; i < c.nthreads; ++i) {
        Thread & t = c.threads[i];
        t.index = i;
        t.tid3[0] = x;
        t.tid3[1] = y;
        t.tid3[2] = z;
        if (++x == tg[0]) {
            x = 0;
            if (++y == tg[1]) {
                y = 0;
                ++z;
            }
        }
        t.state = RUNNABLE;
        t.coll = 0;
        t.started = false;
        c.runnable.push_back(i);
    }
    const unsigned schedule = c.d->schedule;
    for (;;) {
        // Released threads were appended in index order; the schedule permutes them.
        if (schedule != EMU_SCHEDULE_FORWARD) order(schedule, c.rng, c.runnable);
        for (size_t k = 0; k < c.runnable.size(); ++k) {
            resume(c, c.threads[c.runnable[k]]);
            if (c.failed) return;
        }
        c.runnable.clear();
        if (c.n_done == c.nthreads) return;
        // The submit bound: a kernel that keeps meeting sync points past its budget is stopped
        // (one that never reaches a sync point cannot be interrupted here).
        if (c.job->deadline_ns && now_ns() > c.job->deadline_ns) {
            fail(c, "no completion within the submit bound: " + tg_name(c) + " still running");
            return;
        }
        if (resolve_simd(c)) continue;
        if (c.failed) return;
        resolve_barrier(c);
        if (c.failed) return;
    }
}

// Runs threadgroups of `j` on this OS thread until none are left (or one failed).
void work(Job & j) {
    Ctx & c = ctx();
    if (!ensure_stacks(c, j.nthreads)) {
        j.record_error(j.next.load(), j.kernel->name + ": cannot map coroutine stacks");
        return;
    }
    // Every stack of the dispatch's threads is free; a threadgroup that completes returns all
    // it took, and after a failed one this worker stops.
    c.free_stacks.clear();
    for (unsigned i = j.nthreads; i-- > 0;) c.free_stacks.push_back(c.threads[i].stack);
    c.job = &j;
    c.kernel = j.kernel;
    c.d = j.d;
    c.nthreads = j.nthreads;
    c.nsg = (j.nthreads + 31) / 32;
    c.arena_len = size_t(j.d->tg_mem_limit) + ARENA_SLACK;
    if (c.memo.size() < size_t(c.nsg) * MEMO_SLOTS * MEMO_BYTES) c.memo.resize(size_t(c.nsg) * MEMO_SLOTS * MEMO_BYTES, 0);
    if (c.arena.size() < c.arena_len) c.arena.resize(c.arena_len);
    c.arg_ptrs.resize(j.d->n_args);
    for (unsigned i = 0; i < j.d->n_args; ++i) c.arg_ptrs[i] = const_cast<void *>(j.d->args[i].ptr);
    GroupView & v = group_view;
    v.args = c.arg_ptrs.data();
    v.arena = c.arena.data();
    v.dyn_off = j.dyn_off;
    for (int i = 0; i < 3; ++i) {
        v.tg[i] = j.d->tg[i];
        v.grid[i] = j.d->grid[i];
    }
    v.nsg = c.nsg;
    const EmuDispatch * d = j.d;
    for (;;) {
        uint64_t pos = j.next.fetch_add(1, std::memory_order_relaxed);
        if (pos >= j.total || pos > j.stop_at.load(std::memory_order_relaxed)) break;
        unsigned g = j.group_at(pos);
        c.tgpig[0] = g % d->grid[0];
        c.tgpig[1] = (g / d->grid[0]) % d->grid[1];
        c.tgpig[2] = g / (d->grid[0] * d->grid[1]);
        for (int i = 0; i < 3; ++i) group_view.tgpig[i] = c.tgpig[i];
        c.rng = mix64(d->seed * 0x9E3779B97F4A7C15ULL + g) | 1;
        run_threadgroup(c);
        if (c.failed) {
            j.record_error(pos, c.error);
            break;
        }
    }
    c.job = nullptr;
}

// The persistent pool: threads that help with whichever dispatch has work left. Leaked on
// purpose, so that exit never destroys a mutex a pool thread waits on.
struct Pool {
    std::mutex mu;
    std::condition_variable work_cv; // a job was posted
    std::condition_variable idle_cv; // a helper left a job
    std::vector<Job *> jobs;
    unsigned nthreads = 0;
};

Pool & pool() {
    static Pool * p = new Pool();
    return *p;
}

void helper_main() {
    Pool & p = pool();
    std::unique_lock<std::mutex> lk(p.mu);
    for (;;) {
        Job * j = nullptr;
        for (Job * cand : p.jobs) {
            if (cand->helpers < cand->max_helpers && cand->has_work()) {
                j = cand;
                break;
            }
        }
        if (!j) {
            p.work_cv.wait(lk);
            continue;
        }
        j->helpers += 1;
        lk.unlock();
        work(*j);
        lk.lock();
        j->helpers -= 1;
        if (j->helpers == 0) p.idle_cv.notify_all();
    }
}

// Runs the whole job: on this thread alone for one worker, else with pool helpers.
void run_job(Job & j, unsigned workers) {
    unsigned helpers = unsigned(std::min<uint64_t>(workers ? workers - 1 : 0, j.total ? j.total - 1 : 0));
    if (helpers == 0) {
        work(j);
        return;
    }
    j.max_helpers = helpers;
    Pool & p = pool();
    {
        std::lock_guard<std::mutex> lk(p.mu);
        while (p.nthreads < helpers) {
            std::thread(helper_main).detach();
            p.nthreads += 1;
        }
        p.jobs.push_back(&j);
    }
    // wake as many idle pool threads as may join (the busy ones look for work when done)
    for (unsigned i = 0; i < helpers; ++i) p.work_cv.notify_one();
    work(j);
    std::unique_lock<std::mutex> lk(p.mu);
    p.jobs.erase(std::find(p.jobs.begin(), p.jobs.end(), &j));
    p.idle_cv.wait(lk, [&] { return j.helpers == 0; });
}

} // namespace

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
        return c.arena.data() + c.arena_len - ARENA_SLACK;
    }
    c.statics.push_back({id, off});
    c.static_used = off + bytes;
    std::memset(c.arena.data() + off, 0xff, bytes);
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

SimdView simd_sync(const void * val, size_t n, const char * op, const char * file, int line) {
    Ctx & c = *g_ctx;
    Thread & t = *c.cur;
    if (n > sizeof(t.slot[0])) {
        fail(c, std::string(op) + " on a value wider than 64 bytes");
        n = 0;
    }
    // Collectives alternate between two slots, so a lane that races on to the next one
    // cannot overwrite a value its slower neighbours still read.
    unsigned parity = t.coll & 1;
    // the common widths as fixed-size copies (no library call)
    if (n == 4) std::memcpy(t.slot[parity], val, 4);
    else if (n == 8) std::memcpy(t.slot[parity], val, 8);
    else if (n) std::memcpy(t.slot[parity], val, n);
    t.state = AT_SIMD;
    t.file = file;
    t.line = line;
    t.op = op;
    yield(c);
    t.coll += 1;
    unsigned lo = t.index & ~31u;
    SimdView v;
    v.mask = c.simd_mask[lo / 32][parity];
    v.base = c.threads[lo].slot[parity];
    v.stride = sizeof(Thread);
    v.lane = t.index - lo;
    v.shared = c.simd_shared[lo / 32][parity];
    v.shared_ok = &c.simd_shared_ok[lo / 32][parity];
    return v;
}

uint64_t matrix_id() { return ++g_ctx->next_matrix_id; }

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

extern "C" unsigned emu_default_workers() {
    unsigned n = std::thread::hardware_concurrency();
    return n ? n : 1;
}

// The half conversions of the kernels: build.rs renames the compiler's library calls in the
// kernel objects (__extendhfsf2, __truncsfhf2: soft-float code without F16C, which is not
// assumed of the machines this runs on) to these.
extern "C" float emu_extendhfsf2(half h) { return emu::h2f(h); }
extern "C" half emu_truncsfhf2(float f) { return emu::f2h(f); }

// The shim's half conversions against the compiler's own (this file's conversions are the
// library calls): every half pattern widened, and floats narrowed at a stride over all
// patterns plus the rounding edges. Returns the number of mismatches. Signalling NaNs may
// differ in the quiet bit alone when widened: libgcc sets it, Rust's compiler-builtins (which
// a Rust binary links instead) keeps the payload as is, like h2f.
extern "C" unsigned emu_selftest_half() {
    unsigned bad = 0;
    for (unsigned h = 0; h < 65536; ++h) {
        uint16_t b = uint16_t(h);
        half x;
        std::memcpy(&x, &b, 2);
        volatile float want = float(x);
        float w = want, got = emu::h2f(x);
        uint32_t wb, gb;
        std::memcpy(&wb, &w, 4);
        std::memcpy(&gb, &got, 4);
        if ((b & 0x7fffu) > 0x7c00u) {
            wb &= ~0x400000u;
            gb &= ~0x400000u;
        }
        if (wb != gb) ++bad;
        // narrowing: this half's value, and the floats just around it and half-way up
        uint32_t base = gb;
        for (uint32_t d : {0u, 1u, 0x0fffu, 0x1000u, 0x1001u, 0x1fffu, 0xffffffffu}) {
            uint32_t fb = base + d;
            float f;
            std::memcpy(&f, &fb, 4);
            volatile float vf = f;
            half wh = half(vf), gh = emu::f2h(f);
            if (std::memcmp(&wh, &gh, 2) != 0) ++bad;
        }
    }
    // the four-at-a-time widening against h2f, every pattern
    for (unsigned h = 0; h < 65536; h += 64) {
        half src[64];
        float dst[64];
        for (unsigned i = 0; i < 64; ++i) {
            uint16_t b = uint16_t(h + i);
            std::memcpy(&src[i], &b, 2);
        }
        emu::h2f_n(src, dst, 64);
        for (unsigned i = 0; i < 64; ++i) {
            float one = emu::h2f(src[i]);
            if (std::memcmp(&one, &dst[i], 4) != 0) ++bad;
        }
    }
    for (uint64_t u = 0; u < (uint64_t(1) << 32); u += 4093) {
        uint32_t fb = uint32_t(u);
        float f;
        std::memcpy(&f, &fb, 4);
        volatile float vf = f;
        half wh = half(vf), gh = emu::f2h(f);
        if (std::memcmp(&wh, &gh, 2) != 0) ++bad;
    }
    return bad;
}

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
    Job j;
    j.kernel = k;
    j.d = d;
    j.nthreads = nthreads;
    j.deadline_ns = d->timeout_ns ? now_ns() + d->timeout_ns : 0;
    size_t off = 0;
    for (unsigned i = 0; i < d->n_tg && i < EMU_MAX_TG_BUFFERS; ++i) {
        j.dyn_off[i] = off;
        off += (d->tg_len[i] + 15) / 16 * 16;
    }
    if (off > d->tg_mem_limit) {
        set_err(d, k->name + ": threadgroup memory " + std::to_string(off) + " bytes exceeds the device limit " +
                       std::to_string(d->tg_mem_limit));
        return 1;
    }
    j.dyn_end = off;
    j.total = (unsigned long long)d->grid[0] * d->grid[1] * d->grid[2];
    std::vector<unsigned> groups;
    if (d->schedule == EMU_SCHEDULE_RANDOM) {
        groups.reserve(size_t(j.total));
        for (unsigned long long i = 0; i < j.total; ++i) groups.push_back(unsigned(i));
        uint64_t rng = d->seed * 0x9E3779B97F4A7C15ULL + 1;
        order(d->schedule, rng, groups);
        j.order = &groups;
    }
    run_job(j, d->workers);
    if (j.err_pos != NONE) {
        set_err(d, j.error);
        return 1;
    }
    return 0;
}
