//! The C ABI of cpp/emu_runtime.h.

use std::os::raw::{c_char, c_int, c_uint};

pub const SCHEDULE_FORWARD: c_uint = 0;
pub const SCHEDULE_REVERSE: c_uint = 1;
pub const SCHEDULE_RANDOM: c_uint = 2;

#[repr(C)]
pub struct EmuArg {
    pub ptr: *const u8,
    pub len: u64,
}

#[repr(C)]
pub struct EmuDispatch {
    pub kernel: *const c_char,
    pub grid: [c_uint; 3],
    pub tg: [c_uint; 3],
    pub args: *const EmuArg,
    pub n_args: c_uint,
    pub tg_len: *const u64,
    pub n_tg: c_uint,
    pub schedule: c_uint,
    pub seed: u64,
    pub tg_mem_limit: u64,
    pub max_threads: c_uint,
    pub err: *mut c_char,
    pub err_cap: u64,
    pub timeout_ns: u64,
    pub workers: c_uint,
}

extern "C" {
    pub fn emu_init();
    pub fn emu_kernel_count() -> c_uint;
    pub fn emu_kernel_name(i: c_uint) -> *const c_char;
    pub fn emu_dispatch(d: *const EmuDispatch) -> c_int;
    pub fn emu_default_workers() -> c_uint;
    #[cfg(test)]
    pub fn emu_selftest_half() -> c_uint;
}
