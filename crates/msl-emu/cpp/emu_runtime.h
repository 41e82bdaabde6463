// The C ABI between the Rust EmuDevice and the C++ runtime.
#pragma once
#include "metal_shim.h"

#define EMU_MAX_TG_BUFFERS 8
#define EMU_SCHEDULE_FORWARD 0
#define EMU_SCHEDULE_REVERSE 1
#define EMU_SCHEDULE_RANDOM 2

extern "C" {
struct EmuArg {
    const void * ptr; // buffer base + offset, or the bytes of a setBytes argument
    uint64_t len;
};
struct EmuDispatch {
    const char * kernel;
    unsigned grid[3];
    unsigned tg[3];
    const EmuArg * args;
    unsigned n_args;
    const uint64_t * tg_len;
    unsigned n_tg;
    unsigned schedule;
    uint64_t seed;
    uint64_t tg_mem_limit;
    unsigned max_threads;
    char * err;
    uint64_t err_cap;
    uint64_t timeout_ns; // wall-clock budget for this dispatch (0 = unbounded)
    unsigned workers;    // OS threads that run its threadgroups (the caller and the pool); 1 = sequential
};
}
