// A stand-in for <metal_stdlib>: just enough of MSL for the project's kernels to compile as
// C++17 under the emulator. Address-space words are empty macros (`constant` is `const`);
// kernel parameters and kernel-scope threadgroup variables were already rewritten by the
// build script into calls of the ::emu binding functions below. Sync points (barriers and
// simd collectives) take the caller's file/line through __builtin_FILE()/__builtin_LINE()
// defaults, which the emitted #line directives point at the .metal source.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>


namespace emu {
enum Builtin {
    B_THREAD_POSITION_IN_GRID = 0,
    B_THREADGROUP_POSITION_IN_GRID,
    B_THREAD_POSITION_IN_THREADGROUP,
    B_THREAD_INDEX_IN_THREADGROUP,
    B_THREADS_PER_THREADGROUP,
    B_THREADGROUPS_PER_GRID,
    B_SIMDGROUP_INDEX_IN_THREADGROUP,
    B_THREAD_INDEX_IN_SIMDGROUP,
    B_THREADS_PER_SIMDGROUP,
    B_SIMDGROUPS_PER_THREADGROUP,
    B_THREADS_PER_GRID,
};
enum ParamKind { P_BUFFER = 0, P_THREADGROUP = 1, P_BUILTIN = 2 };
struct ParamInfo {
    int kind;
    int index;
    size_t ref_size; // sizeof the referenced struct for `constant T&` buffers, else 0
};

// What the running thread reads of its dispatch, threadgroup and own position: set by the
// runtime per dispatch (args, arena), per threadgroup (tgpig) and per resume (cur_ids), so the
// kernels' parameter reads are plain loads.
struct ThreadIds {
    unsigned index;
    unsigned tid3[3];
};
struct GroupView {
    void * const * args;    // buffer/bytes argument i
    unsigned char * arena;  // threadgroup memory
    const size_t * dyn_off; // offset of threadgroup(i) in the arena
    unsigned tgpig[3], tg[3], grid[3];
    unsigned nsg;
};
extern __thread GroupView group_view;
extern __thread const ThreadIds * cur_ids;
inline void * arg_buffer_ptr(int index) { return group_view.args[index]; }
inline void * arg_threadgroup_ptr(int index) { return group_view.arena + group_view.dyn_off[index]; }
inline void builtin3(int which, unsigned out[3]) {
    const GroupView & g = group_view;
    const ThreadIds & t = *cur_ids;
    out[0] = out[1] = out[2] = 0;
    switch (which) {
    case B_THREAD_POSITION_IN_GRID:
        for (int i = 0; i < 3; ++i) out[i] = g.tgpig[i] * g.tg[i] + t.tid3[i];
        break;
    case B_THREADGROUP_POSITION_IN_GRID:
        for (int i = 0; i < 3; ++i) out[i] = g.tgpig[i];
        break;
    case B_THREAD_POSITION_IN_THREADGROUP:
        for (int i = 0; i < 3; ++i) out[i] = t.tid3[i];
        break;
    case B_THREAD_INDEX_IN_THREADGROUP: out[0] = t.index; break;
    case B_THREADS_PER_THREADGROUP:
        for (int i = 0; i < 3; ++i) out[i] = g.tg[i];
        break;
    case B_THREADGROUPS_PER_GRID:
        for (int i = 0; i < 3; ++i) out[i] = g.grid[i];
        break;
    case B_SIMDGROUP_INDEX_IN_THREADGROUP: out[0] = t.index / 32; break;
    case B_THREAD_INDEX_IN_SIMDGROUP: out[0] = t.index % 32; break;
    case B_THREADS_PER_SIMDGROUP: out[0] = 32; break;
    case B_SIMDGROUPS_PER_THREADGROUP: out[0] = g.nsg; break;
    case B_THREADS_PER_GRID:
        for (int i = 0; i < 3; ++i) out[i] = g.grid[i] * g.tg[i];
        break;
    default: break;
    }
}
void * tg_static(int id, size_t bytes, size_t align);
void tg_barrier(const char * file, int line);
// What a lane sees of its simdgroup after a collective: the participating lanes, and where
// lane i's deposited value lies (base + i * stride).
struct SimdView {
    uint64_t mask;
    const unsigned char * base;
    size_t stride;
    unsigned lane; // the caller's lane
    // A lane-independent result of this collective (simd_sum's), computed by the first lane
    // that gets here and reused by the others; *shared_ok is cleared at every release.
    unsigned char * shared;
    bool * shared_ok;
    const void * value(unsigned i) const { return base + size_t(i) * stride; }
};
// A simd collective: deposits `n` bytes of `val`, waits for every live lane of the simdgroup
// at the same call site, and returns the view of the simdgroup's deposits.
SimdView simd_sync(const void * val, size_t n, const char * op, const char * file, int line);
// The running lane's next memo slot and the end of its simdgroup's slots; the runtime sets
// them at every resume (a lane's operations are numbered from its last sync point).
struct MemoCursor {
    unsigned char * next;
    unsigned char * end;
};
extern __thread MemoCursor memo_cursor;
constexpr size_t MEMO_BYTES = 1088; // tag + ids + a, b, c, d of an 8x8 float product
// Scratch of at least `bytes` for the caller's next simdgroup-matrix load or product: one
// slot per (simdgroup, operation number since the lane's last sync point), shared by the
// simdgroup's lanes; nullptr when none fits.
inline void * mma_memo(size_t bytes) {
    MemoCursor & m = memo_cursor;
    if (bytes > MEMO_BYTES || m.next == m.end) return nullptr;
    void * p = m.next;
    m.next += MEMO_BYTES;
    return p;
}
// A fresh identity for a simdgroup matrix's content (unique on this OS thread, below 2^63).
uint64_t matrix_id();
void register_kernel(const char * name, void (*fn)(), const ParamInfo * params, int n_params,
                     const char * file);

template <class T> struct is_vec : std::false_type {};
} // namespace emu

namespace metal {
typedef _Float16 half;
typedef unsigned int uint;
typedef unsigned short ushort;
typedef unsigned char uchar;
typedef uint64_t ulong;

// bfloat: the upper 16 bits of an f32 (round to nearest even on narrowing).
struct bfloat {
    uint16_t bits;
    bfloat() = default;
    bfloat(float f) {
        uint32_t u;
        std::memcpy(&u, &f, 4);
        if ((u & 0x7fffffffu) > 0x7f800000u) {
            bits = uint16_t((u >> 16) | 0x40u);
        } else {
            bits = uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
        }
    }
    operator float() const {
        uint32_t u = uint32_t(bits) << 16;
        float f;
        std::memcpy(&f, &u, 4);
        return f;
    }
};

template <class T, int N> struct vec_base;
template <class T> struct alignas(2 * sizeof(T)) vec_base<T, 2> { T x, y; };
template <class T> struct alignas(4 * sizeof(T)) vec_base<T, 3> { T x, y, z; };
template <class T> struct alignas(4 * sizeof(T)) vec_base<T, 4> { T x, y, z, w; };

template <class T, int N> struct vec : vec_base<T, N> {
    static constexpr int size = N;
    typedef T elem;
    vec() = default;
    vec(T s) {
        for (int i = 0; i < N; ++i) (*this)[i] = s;
    }
    template <class... A, class = std::enable_if_t<sizeof...(A) == N && (N > 1)>>
    vec(A... a) {
        T tmp[N] = {T(a)...};
        for (int i = 0; i < N; ++i) (*this)[i] = tmp[i];
    }
    template <class U> explicit vec(const vec<U, N> & o) {
        for (int i = 0; i < N; ++i) (*this)[i] = T(o[i]);
    }
    T & operator[](int i) { return reinterpret_cast<T *>(this)[i]; }
    const T & operator[](int i) const { return reinterpret_cast<const T *>(this)[i]; }
};

#define EMU_VEC_BINOP(op)                                                                      \
    template <class T, int N> vec<T, N> operator op(vec<T, N> a, const vec<T, N> & b) {        \
        for (int i = 0; i < N; ++i) a[i] = a[i] op b[i];                                       \
        return a;                                                                              \
    }                                                                                          \
    template <class T, int N> vec<T, N> operator op(vec<T, N> a, T b) {                        \
        for (int i = 0; i < N; ++i) a[i] = a[i] op b;                                          \
        return a;                                                                              \
    }                                                                                          \
    template <class T, int N> vec<T, N> operator op(T a, vec<T, N> b) {                        \
        for (int i = 0; i < N; ++i) b[i] = a op b[i];                                          \
        return b;                                                                              \
    }                                                                                          \
    template <class T, int N> vec<T, N> & operator op##=(vec<T, N> & a, const vec<T, N> & b) { \
        for (int i = 0; i < N; ++i) a[i] = a[i] op b[i];                                       \
        return a;                                                                              \
    }                                                                                          \
    template <class T, int N> vec<T, N> & operator op##=(vec<T, N> & a, T b) {                 \
        for (int i = 0; i < N; ++i) a[i] = a[i] op b;                                          \
        return a;                                                                              \
    }
EMU_VEC_BINOP(+)
EMU_VEC_BINOP(-)
EMU_VEC_BINOP(*)
EMU_VEC_BINOP(/)
#undef EMU_VEC_BINOP
template <class T, int N> vec<T, N> operator-(vec<T, N> a) {
    for (int i = 0; i < N; ++i) a[i] = -a[i];
    return a;
}
template <class T, int N> T dot(const vec<T, N> & a, const vec<T, N> & b) {
    T s = T(0);
    for (int i = 0; i < N; ++i) s += a[i] * b[i];
    return s;
}

#define EMU_VEC_TYPES(T, name)            \
    typedef vec<T, 2> name##2;            \
    typedef vec<T, 3> name##3;            \
    typedef vec<T, 4> name##4;
EMU_VEC_TYPES(float, float)
EMU_VEC_TYPES(half, half)
EMU_VEC_TYPES(int, int)
EMU_VEC_TYPES(uint, uint)
EMU_VEC_TYPES(short, short)
EMU_VEC_TYPES(ushort, ushort)
EMU_VEC_TYPES(char, char)
EMU_VEC_TYPES(uchar, uchar)
EMU_VEC_TYPES(ulong, ulong)
#undef EMU_VEC_TYPES

template <class T, class U> T as_type(const U & u) {
    static_assert(sizeof(T) == sizeof(U), "as_type needs equal sizes");
    T t;
    std::memcpy(&t, &u, sizeof(T));
    return t;
}

} // namespace metal

namespace emu {
// half -> float without the library call g++ emits when F16C is not assumed; bit exact with
// the compiler's conversion, NaN payloads kept as they are (checked over every pattern by
// emu_selftest_half).
inline float h2f(metal::half h) {
    uint16_t b;
    std::memcpy(&b, &h, 2);
    uint32_t em = b & 0x7fffu;
    uint32_t r;
    if (em >= 0x7c00u) {
        r = 0x7f800000u | (em & 0x3ffu) << 13;
    } else if (em >= 0x0400u) {
        r = (em << 13) + 0x38000000u; // rebias the exponent by 127 - 15
    } else {
        float f = float(int(em)) * 5.9604644775390625e-8f; // subnormal: em * 2^-24, exact
        std::memcpy(&r, &f, 4);
    }
    r |= uint32_t(b & 0x8000u) << 16;
    float out;
    std::memcpy(&out, &r, 4);
    return out;
}
// float -> half, round to nearest even, overflow to infinity, NaNs quieted keeping the top
// payload bits (as the compiler's conversion; checked by emu_selftest_half).
inline metal::half f2h(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    uint32_t h;
    if (ax > 0x7f800000u) {
        h = 0x7e00u | ((ax >> 13) & 0x1ffu);
    } else if (ax >= 0x477ff000u) {
        h = 0x7c00u; // rounds to 65520 or more: infinity
    } else if (ax < 0x38800000u) {
        // below 2^-14: adding 0.5 aligns the half subnormal's bits at the bottom of the
        // float's mantissa, rounded to nearest even by the addition itself
        float a, t;
        std::memcpy(&a, &ax, 4);
        t = a + 0.5f;
        uint32_t tb;
        std::memcpy(&tb, &t, 4);
        h = tb - 0x3f000000u;
    } else {
        // rebias the exponent by 15 - 127 and round the 13 dropped bits to nearest even
        h = (ax + 0xc8000fffu + ((ax >> 13) & 1u)) >> 13;
    }
    uint16_t b = uint16_t(h | sign);
    metal::half out;
    std::memcpy(&out, &b, 2);
    return out;
}
// Byte equality without an early exit (the memo's hits compare everything anyway); n is a
// multiple of 8 for the matrices it compares, any tail is compared bytewise.
inline bool same_bytes(const void * a, const void * b, size_t n) {
    const unsigned char * p = static_cast<const unsigned char *>(a);
    const unsigned char * q = static_cast<const unsigned char *>(b);
    uint64_t acc = 0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t x, y;
        std::memcpy(&x, p + i, 8);
        std::memcpy(&y, q + i, 8);
        acc |= x ^ y;
    }
    for (; i < n; ++i) acc |= uint64_t(p[i] ^ q[i]);
    return acc == 0;
}
// h2f of n halves (n a multiple of 4), four at a time with GCC vector types (SSE2 / NEON):
// the same bits as h2f, by masks instead of branches.
inline void h2f_n(const metal::half * src, float * dst, size_t n) {
    typedef int32_t v4i __attribute__((vector_size(16)));
    typedef float v4f __attribute__((vector_size(16)));
    for (size_t i = 0; i < n; i += 4) {
        uint16_t h[4];
        std::memcpy(h, src + i, 8);
        v4i b = {h[0], h[1], h[2], h[3]};
        v4i em = b & 0x7fff;
        v4i norm = (em << 13) + 0x38000000;
        v4i inf = 0x7f800000 | ((em & 0x3ff) << 13);
        v4f sf = __builtin_convertvector(em, v4f) * 5.9604644775390625e-8f;
        v4i sub;
        std::memcpy(&sub, &sf, 16);
        v4i is_inf = em >= 0x7c00;
        v4i is_norm = em >= 0x400;
        v4i r = (inf & is_inf) | (norm & ~is_inf & is_norm) | (sub & ~is_norm);
        r |= (b & 0x8000) << 16;
        std::memcpy(dst + i, &r, 16);
    }
}
// Widening to float for the simdgroup-matrix paths (half through h2f).
template <class U> inline float to_f(U x) { return float(x); }
inline float to_f(float x) { return x; }
inline float to_f(metal::half x) { return h2f(x); }
} // namespace emu

namespace metal {
// ---- math (builtins only: <cmath> would add ambiguous global overloads) ----
#define EMU_F1(name, builtin)                                                  \
    inline float name(float x) { return builtin(x); }                          \
    inline half name(half x) { return half(builtin(float(x))); }
EMU_F1(exp, __builtin_expf)
EMU_F1(exp2, __builtin_exp2f)
EMU_F1(log, __builtin_logf)
EMU_F1(sqrt, __builtin_sqrtf)
EMU_F1(fabs, __builtin_fabsf)
EMU_F1(sin, __builtin_sinf)
EMU_F1(cos, __builtin_cosf)
EMU_F1(tanh, __builtin_tanhf)
EMU_F1(floor, __builtin_floorf)
EMU_F1(ceil, __builtin_ceilf)
EMU_F1(round, __builtin_roundf)
EMU_F1(rint, __builtin_rintf)
EMU_F1(trunc, __builtin_truncf)
#undef EMU_F1
inline float rsqrt(float x) { return 1.0f / __builtin_sqrtf(x); }
inline half rsqrt(half x) { return half(1.0f / __builtin_sqrtf(float(x))); }
inline float abs(float x) { return __builtin_fabsf(x); }
inline int abs(int x) { return x < 0 ? -x : x; }
inline float pow(float a, float b) { return __builtin_powf(a, b); }
inline float powr(float a, float b) { return __builtin_powf(a, b); }
inline float fmax(float a, float b) { return __builtin_fmaxf(a, b); }
inline float fmin(float a, float b) { return __builtin_fminf(a, b); }
template <class T> inline T max(T a, T b) { return a > b ? a : b; }
template <class T> inline T min(T a, T b) { return a < b ? a : b; }
template <class T> inline T clamp(T x, T lo, T hi) { return min(max(x, lo), hi); }
inline bool isnan(float x) { return __builtin_isnan(x); }
inline bool isinf(float x) { return __builtin_isinf(x); }
template <class T> inline T select(T a, T b, bool c) { return c ? b : a; }

namespace fast {
inline float exp(float x) { return __builtin_expf(x); }
inline float log(float x) { return __builtin_logf(x); }
inline float sqrt(float x) { return __builtin_sqrtf(x); }
inline float rsqrt(float x) { return 1.0f / __builtin_sqrtf(x); }
inline float sin(float x) { return __builtin_sinf(x); }
inline float cos(float x) { return __builtin_cosf(x); }
inline float pow(float a, float b) { return __builtin_powf(a, b); }
inline float divide(float a, float b) { return a / b; }
} // namespace fast
namespace precise {
inline float exp(float x) { return __builtin_expf(x); }
inline float log(float x) { return __builtin_logf(x); }
inline float sqrt(float x) { return __builtin_sqrtf(x); }
inline float rsqrt(float x) { return 1.0f / __builtin_sqrtf(x); }
inline float sin(float x) { return __builtin_sinf(x); }
inline float cos(float x) { return __builtin_cosf(x); }
inline float pow(float a, float b) { return __builtin_powf(a, b); }
inline float divide(float a, float b) { return a / b; }
} // namespace precise

// ---- synchronisation ----
enum class mem_flags : unsigned { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };
inline mem_flags operator|(mem_flags a, mem_flags b) { return mem_flags(unsigned(a) | unsigned(b)); }

inline void threadgroup_barrier(mem_flags, const char * file = __builtin_FILE(), int line = __builtin_LINE()) {
    emu::tg_barrier(file, line);
}
inline void simdgroup_barrier(mem_flags, const char * file = __builtin_FILE(), int line = __builtin_LINE()) {
    emu::simd_sync(nullptr, 0, "simdgroup_barrier", file, line);
}

// ---- simd collectives: lanes reduce in lane order (Metal uses a tree; tolerances cover it) ----
template <class T> inline T emu_lane_value(const emu::SimdView & s, unsigned lane) {
    T v;
    std::memcpy(&v, s.value(lane), sizeof(T));
    return v;
}
// Shuffle sources outside the simdgroup or on an inactive lane get all-ones bits (NaN for
// floats): real hardware leaves them unspecified, so a kernel must not use them.
template <class T> inline T emu_poison() {
    T v;
    std::memset(&v, 0xff, sizeof(T));
    return v;
}
template <class T> inline T simd_sum(T v, const char * f = __builtin_FILE(), int l = __builtin_LINE()) {
    emu::SimdView s = emu::simd_sync(&v, sizeof(T), "simd_sum", f, l);
    T acc = T(0);
    if (*s.shared_ok) {
        std::memcpy(&acc, s.shared, sizeof(T));
        return acc;
    }
    for (unsigned i = 0; i < 32; ++i) if (s.mask >> i & 1) acc += emu_lane_value<T>(s, i);
    std::memcpy(s.shared, &acc, sizeof(T));
    *s.shared_ok = true;
    return acc;
}
template <class T> inline T simd_max(T v, const char * f = __builtin_FILE(), int l = __builtin_LINE()) {
    emu::SimdView s = emu::simd_sync(&v, sizeof(T), "simd_max", f, l);
    T acc = v;
    for (unsigned i = 0; i < 32; ++i) if (s.mask >> i & 1) acc = max(acc, emu_lane_value<T>(s, i));
    return acc;
}
template <class T> inline T simd_min(T v, const char * f = __builtin_FILE(), int l = __builtin_LINE()) {
    emu::SimdView s = emu::simd_sync(&v, sizeof(T), "simd_min", f, l);
    T acc = v;
    for (unsigned i = 0; i < 32; ++i) if (s.mask >> i & 1) acc = min(acc, emu_lane_value<T>(s, i));
    return acc;
}
template <class T> inline T simd_prefix_exclusive_sum(T v, const char * f = __builtin_FILE(), int l = __builtin_LINE()) {
    emu::SimdView s = emu::simd_sync(&v, sizeof(T), "simd_prefix_exclusive_sum", f, l);
    T acc = T(0);
    for (unsigned i = 0; i < s.lane; ++i) if (s.mask >> i & 1) acc += emu_lane_value<T>(s, i);
    return acc;
}
template <class T> inline T simd_broadcast(T v, ushort src, const char * f = __builtin_FILE(), int l = __builtin_LINE()) {
    emu::SimdView s = emu::simd_sync(&v, sizeof(T), "simd_broadcast", f, l);
    return (src < 64 && (s.mask >> src & 1)) ? emu_lane_value<T>(s, src) : emu_poison<T>();
}
template <class T> inline T simd_shuffle(T v, ushort src, const char * f = __builtin_FILE(), int l = __builtin_LINE()) {
    emu::SimdView s = emu::simd_sync(&v, sizeof(T), "simd_shuffle", f, l);
    return (src < 64 && (s.mask >> src & 1)) ? emu_lane_value<T>(s, src) : emu_poison<T>();
}
template <class T> inline T simd_shuffle_down(T v, ushort delta, const char * f = __builtin_FILE(), int l = __builtin_LINE()) {
    emu::SimdView s = emu::simd_sync(&v, sizeof(T), "simd_shuffle_down", f, l);
    unsigned src = s.lane + delta;
    return (src < 32 && (s.mask >> src & 1)) ? emu_lane_value<T>(s, src) : emu_poison<T>();
}
template <class T> inline T simd_shuffle_xor(T v, ushort mask, const char * f = __builtin_FILE(), int l = __builtin_LINE()) {
    emu::SimdView s = emu::simd_sync(&v, sizeof(T), "simd_shuffle_xor", f, l);
    unsigned src = s.lane ^ mask;
    return (src < 32 && (s.mask >> src & 1)) ? emu_lane_value<T>(s, src) : emu_poison<T>();
}

// ---- simdgroup matrices: every lane holds the whole matrix and computes it redundantly ----
// A matrix also carries `emu_id`, an identity of its content: 0 = unknown, else the matrix
// holds exactly the bytes that id was given to (ids come from the OS thread's counter,
// `emu::matrix_id`, or, with the top bit set, from a filled value). Lanes of a simdgroup run
// one after another between sync points and repeat the same loads and products; the memo
// slots (one per simdgroup and operation number since the lane's last sync point) let each
// lane after the first prove its operands equal to the first lane's (content for loads,
// identity for products) and take the first lane's result instead of recomputing it. A slot
// is written whole by one lane between two of its reads (coroutines are never preempted),
// and any mismatch recomputes, so a hit is always the same pure function of the same bits.
template <class T, int C, int R = C> struct simdgroup_matrix {
    T e[R][C];
    uint64_t emu_id = 0;
};
typedef simdgroup_matrix<float, 8, 8> simdgroup_float8x8;
typedef simdgroup_matrix<half, 8, 8> simdgroup_half8x8;
typedef simdgroup_matrix<bfloat, 8, 8> simdgroup_bfloat8x8;
template <class T, int C, int R = C> simdgroup_matrix<T, C, R> make_filled_simdgroup_matrix(T v) {
    simdgroup_matrix<T, C, R> m;
    for (int i = 0; i < R; ++i)
        for (int j = 0; j < C; ++j) m.e[i][j] = v;
    if constexpr (sizeof(T) <= 4) {
        uint32_t bits = 0;
        std::memcpy(&bits, &v, sizeof(T));
        m.emu_id = (uint64_t(1) << 63) | bits; // the same bits give the same content
    }
    return m;
}
// Load memo slot: [tag][id][content].
template <class T, int C, int R>
inline void emu_memo_load(simdgroup_matrix<T, C, R> & d) {
    static const char tag = 0; // one per instantiation, program-wide
    constexpr size_t n = sizeof(d.e);
    unsigned char * m = static_cast<unsigned char *>(emu::mma_memo(16 + n));
    if (!m) {
        d.emu_id = 0;
        return;
    }
    const void * t;
    std::memcpy(&t, m, sizeof(t));
    if (t == &tag && emu::same_bytes(m + 16, d.e, n)) {
        std::memcpy(&d.emu_id, m + 8, 8);
        return;
    }
    t = &tag;
    d.emu_id = emu::matrix_id();
    std::memcpy(m, &t, sizeof(t));
    std::memcpy(m + 8, &d.emu_id, 8);
    std::memcpy(m + 16, d.e, n);
}
template <class T, int C, int R, class U>
inline void simdgroup_load(simdgroup_matrix<T, C, R> & d, const U * src, ulong elements_per_row = C,
                           ulong2 origin = ulong2(0, 0), bool transpose = false) {
    auto cvt = [](const U & v) -> T {
        if constexpr (std::is_same_v<T, float>) return emu::to_f(v);
        else return T(v);
    };
    if (!transpose) {
        for (int i = 0; i < R; ++i) {
            const U * row = src + (origin[1] + i) * elements_per_row + origin[0];
            for (int j = 0; j < C; ++j) d.e[i][j] = cvt(row[j]);
        }
    } else {
        for (int i = 0; i < R; ++i)
            for (int j = 0; j < C; ++j) d.e[i][j] = cvt(src[(origin[0] + j) * elements_per_row + origin[1] + i]);
    }
    emu_memo_load(d);
}
template <class T, int C, int R, class U>
inline void simdgroup_store(const simdgroup_matrix<T, C, R> & m, U * dst, ulong elements_per_row = C,
                            ulong2 origin = ulong2(0, 0), bool transpose = false) {
    if (!transpose) {
        for (int i = 0; i < R; ++i) {
            U * row = dst + (origin[1] + i) * elements_per_row + origin[0];
            for (int j = 0; j < C; ++j) row[j] = U(m.e[i][j]);
        }
    } else {
        for (int i = 0; i < R; ++i)
            for (int j = 0; j < C; ++j) dst[(origin[0] + j) * elements_per_row + origin[1] + i] = U(m.e[i][j]);
    }
}
// The product itself: widen once (emu::h2f for half), then multiply in float, each output
// element summed over k in order.
template <class TD, class TA, class TB, class TC, int N>
inline void emu_mma(simdgroup_matrix<TD, N, N> & d, const simdgroup_matrix<TA, N, N> & a,
                    const simdgroup_matrix<TB, N, N> & b, const simdgroup_matrix<TC, N, N> & c) {
    float fa[N][N], fb[N][N], fc[N][N];
    auto widen = [](const auto & src, float(&dst)[N][N]) {
        using E = std::remove_cv_t<std::remove_reference_t<decltype(src[0][0])>>;
        if constexpr (std::is_same_v<E, half> && (N * N) % 4 == 0) {
            emu::h2f_n(&src[0][0], &dst[0][0], N * N);
        } else {
            for (int i = 0; i < N; ++i)
                for (int j = 0; j < N; ++j) dst[i][j] = emu::to_f(src[i][j]);
        }
    };
    widen(a.e, fa);
    widen(b.e, fb);
    widen(c.e, fc);
    if constexpr (N == 8) {
        // rows as 8-float vectors (two SSE registers), the same operations in the same order
        typedef float row8 __attribute__((vector_size(32), aligned(4)));
        for (int i = 0; i < 8; ++i) {
            row8 acc;
            std::memcpy(&acc, fc[i], 32);
            for (int k = 0; k < 8; ++k) {
                row8 bk;
                std::memcpy(&bk, fb[k], 32);
                acc += fa[i][k] * bk;
            }
            std::memcpy(fc[i], &acc, 32);
        }
    } else {
        for (int i = 0; i < N; ++i)
            for (int k = 0; k < N; ++k)
                for (int j = 0; j < N; ++j) fc[i][j] += fa[i][k] * fb[k][j];
    }
    for (int i = 0; i < N; ++i)
        for (int j = 0; j < N; ++j) d.e[i][j] = TD(fc[i][j]);
}
// Product memo slot: [tag][id a][id b][id c][id d][d][a][b][c]. An operand stored with a
// known id matches by id alone (and its content is not stored); one stored with id 0 matches
// by content.
template <class TD, class TA, class TB, class TC, int N>
inline void simdgroup_multiply_accumulate(simdgroup_matrix<TD, N, N> & d, const simdgroup_matrix<TA, N, N> & a,
                                          const simdgroup_matrix<TB, N, N> & b, const simdgroup_matrix<TC, N, N> & c) {
    static const char tag = 0; // one per instantiation, program-wide
    constexpr size_t ka = sizeof(a.e), kb = sizeof(b.e), kc = sizeof(c.e), kd = sizeof(d.e);
    unsigned char * m = static_cast<unsigned char *>(emu::mma_memo(40 + ka + kb + kc + kd));
    if (!m) {
        emu_mma(d, a, b, c);
        d.emu_id = 0;
        return;
    }
    unsigned char * md = m + 40, * ma = md + kd, * mb = ma + ka, * mc = mb + kb;
    const void * t;
    std::memcpy(&t, m, sizeof(t));
    if (t == &tag) {
        uint64_t id[4];
        std::memcpy(id, m + 8, 32);
        auto same = [](uint64_t stored, uint64_t have, const unsigned char * mem, const void * val, size_t n) {
            return stored != 0 ? have == stored : emu::same_bytes(mem, val, n);
        };
        if (same(id[0], a.emu_id, ma, a.e, ka) && same(id[1], b.emu_id, mb, b.e, kb) &&
            same(id[2], c.emu_id, mc, c.e, kc)) {
            std::memcpy(d.e, md, kd);
            d.emu_id = id[3];
            return;
        }
    }
    // inputs first: d may alias one of them
    uint64_t id[4] = {a.emu_id, b.emu_id, c.emu_id, 0};
    if (!id[0]) std::memcpy(ma, a.e, ka);
    if (!id[1]) std::memcpy(mb, b.e, kb);
    if (!id[2]) std::memcpy(mc, c.e, kc);
    simdgroup_matrix<TD, N, N> r;
    emu_mma(r, a, b, c);
    r.emu_id = id[3] = emu::matrix_id();
    t = &tag;
    std::memcpy(m, &t, sizeof(t));
    std::memcpy(m + 8, id, 32);
    std::memcpy(md, r.e, kd);
    d = r;
}
template <class TD, class TA, class TB, int N>
inline void simdgroup_multiply(simdgroup_matrix<TD, N, N> & d, const simdgroup_matrix<TA, N, N> & a,
                               const simdgroup_matrix<TB, N, N> & b) {
    simdgroup_multiply_accumulate(d, a, b, make_filled_simdgroup_matrix<TD, N, N>(TD(0)));
}
} // namespace metal

namespace emu {
template <class T, int N> struct is_vec<metal::vec<T, N>> : std::true_type {};

template <class T> T arg_buffer(int i) {
    void * p = arg_buffer_ptr(i);
    if constexpr (std::is_pointer_v<T>) {
        return static_cast<T>(p);
    } else {
        return *static_cast<std::remove_reference_t<T> *>(p);
    }
}
template <class T> T arg_threadgroup(int i) { return static_cast<T>(arg_threadgroup_ptr(i)); }
template <class T> T builtin(int which) {
    unsigned v[3];
    builtin3(which, v);
    if constexpr (is_vec<T>::value) {
        T r;
        for (int i = 0; i < T::size; ++i) r[i] = typename T::elem(v[i]);
        return r;
    } else {
        return T(v[0]);
    }
}
template <class T> T & tg_static_ref(int id) { return *static_cast<T *>(tg_static(id, sizeof(T), alignof(T))); }
template <class T> constexpr size_t ref_size() {
    if constexpr (std::is_reference_v<T>) {
        return sizeof(std::remove_reference_t<T>);
    } else {
        return 0;
    }
}
} // namespace emu

using namespace metal;

// Address-space words vanish; the runtime (which names fields `kernel`) opts out.
#ifndef EMU_RUNTIME
#define kernel
#define device
#define constant const
#define thread
#define threadgroup
#endif
