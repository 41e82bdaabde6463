//! The MSL emulator: a [`minfer_metal::Device`] that runs the project's `.metal` kernels on
//! the CPU. build.rs rewrites each kernel file to C++ and compiles it against a shim
//! `<metal_stdlib>`; the runtime runs each threadgroup's threads as coroutines, so barriers and
//! simd collectives are real synchronisation points. It reports barrier divergence (a thread
//! returned while others wait, or threads at different barriers) and simdgroup divergence
//! (lanes at different collectives) with the `.metal` file and line, and runs threads between
//! sync points in a chosen [`Schedule`] with NaN-poisoned threadgroup memory, so a missing
//! barrier changes the output from one schedule to the next.
//!
//! The threadgroups of one dispatch run in parallel on a persistent pool of OS threads
//! ([`EmuDevice::with_workers`]; by default `MINFER_EMU_THREADS` or every core), each with its
//! own coroutine stacks; every threadgroup computes the same bytes whatever the worker count,
//! and of several failing threadgroups the first in the schedule's threadgroup order is
//! reported.
//!
//! Not modelled: Metal's tree-order reductions and fast math (compare against references
//! with a named tolerance), races between threadgroups beyond reordering them, atomics, and
//! `dispatchThreads` partial threadgroups.

mod ffi;

use std::collections::HashSet;
use std::collections::VecDeque;
use std::ffi::{CStr, CString};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Once, OnceLock};
use std::time::{Duration, Instant};

use minfer_metal::device::check_page_aligned;
use minfer_metal::{Arg, Device, Dispatch, Error, Limits, Result};
pub use settings::{parse_size, EmuMemory, EmuSettings};

#[cfg(test)]
#[path = "../build/rewrite.rs"]
#[allow(dead_code)]
mod rewrite;
#[cfg(test)]
mod rewrite_tests;
pub mod settings;

/// The order in which runnable threads (and threadgroups) run between sync points.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Schedule {
    Forward,
    Reverse,
    /// Seeded shuffle, reshuffled at every sync point.
    Random(u64),
}

impl Schedule {
    /// The three schedules every kernel gate runs under.
    pub const GATE_SET: [Schedule; 3] = [
        Schedule::Forward,
        Schedule::Reverse,
        Schedule::Random(0x5EED_1234),
    ];
}

/// The emulated device's limits (Apple-silicon values, so the launch checks are exercised
/// with the numbers a Mac reports).
pub const EMU_LIMITS: Limits = Limits {
    max_threads_per_threadgroup: 1024,
    max_threadgroup_memory: 32 * 1024,
    simd_width: 32,
    page_size: 4096,
};

const LABEL_RING: usize = 16;

/// Default bound on one submit (the real device's is 10 s; emulated kernels run slower).
pub const EMU_SUBMIT_TIMEOUT: Duration = Duration::from_secs(120);

struct Mem {
    ptr: *mut u8,
    len: usize,
    owned: Option<std::alloc::Layout>,
}

impl Drop for Mem {
    fn drop(&mut self) {
        if let Some(layout) = self.owned {
            // SAFETY: allocated in `EmuDevice::new_buffer` with this layout.
            unsafe { std::alloc::dealloc(self.ptr, layout) };
        }
    }
}

// SAFETY: the memory is plain bytes; commands touching it run during `submit` (on the
// submitting thread and the emulator's pool threads, which `submit` waits for), as on a real
// shared-storage buffer.
unsafe impl Send for Mem {}
// SAFETY: as above.
unsafe impl Sync for Mem {}

/// A shared-storage buffer (host memory).
#[derive(Clone)]
pub struct EmuBuffer(Arc<Mem>);

/// A pipeline: a kernel the library was checked to contain.
#[derive(Clone, Debug)]
pub struct EmuPipeline {
    name: CString,
}

enum CmdArg {
    Buf(EmuBuffer, u64),
    Bytes(Vec<u8>),
}

enum Cmd {
    Dispatch {
        pipeline: EmuPipeline,
        label: String,
        grid: [u32; 3],
        tg: [u32; 3],
        args: Vec<CmdArg>,
        tg_len: Vec<u64>,
    },
    CopyRows {
        src: EmuBuffer,
        dst: EmuBuffer,
        row_bytes: u64,
        src_row: u64,
        dst_row: u64,
        n_rows: u64,
    },
    /// The start and end of a timed span ([`Device::begin_span`]): no work of its own.
    SpanBegin(u32),
    SpanEnd,
}

/// The emulated device. Commands queue until [`Device::submit`] runs them in order.
pub struct EmuDevice {
    schedule: Schedule,
    workers: usize,
    submit_timeout: Duration,
    limits: Limits,
    /// What [`Device::free_memory`] answers.
    memory: EmuMemory,
    queue: Mutex<Vec<Cmd>>,
    labels: Mutex<VecDeque<String>>,
    /// Spans of the completed submits not yet taken: (tag, the emulator's nanoseconds).
    spans: Mutex<Vec<(u32, u64)>>,
    /// Bytes of every buffer made or wrapped so far by this device and its siblings
    /// ([`EmuDevice::bytes_made`]).
    made: Arc<AtomicUsize>,
}

/// What the emulator's span times are (a trace's `timing`, docs/TRACE.md).
const SPAN_CLOCK: &str = "the MSL emulator's host wall time running the node's dispatches \
     (a CPU emulating the kernels, not a GPU clock)";

fn init() {
    static ONCE: Once = Once::new();
    // SAFETY: registers the compiled kernels once; no other runtime call runs before it.
    ONCE.call_once(|| unsafe { ffi::emu_init() });
}

/// The worker count of a new device: `MINFER_EMU_THREADS` when set to a positive number, else
/// the machine's available parallelism.
pub fn default_workers() -> usize {
    workers(&EmuSettings::from_env())
}

/// The worker count `s` gives: its thread count, else the machine's available parallelism.
pub fn workers(s: &EmuSettings) -> usize {
    if let Some(n) = s.threads {
        return n;
    }
    std::thread::available_parallelism()
        .map(|n| n.get())
        // SAFETY: a plain query of the C++ runtime.
        .unwrap_or_else(|_| unsafe { ffi::emu_default_workers() } as usize)
}

impl EmuDevice {
    pub fn new(schedule: Schedule) -> EmuDevice {
        EmuDevice::with_settings(schedule, &EmuSettings::from_env())
    }

    /// [`EmuDevice::new`] with the knob of `s` (what the engine instantiates).
    pub fn with_settings(schedule: Schedule, s: &EmuSettings) -> EmuDevice {
        init();
        EmuDevice {
            schedule,
            workers: workers(s),
            submit_timeout: EMU_SUBMIT_TIMEOUT,
            limits: EMU_LIMITS,
            memory: s.memory,
            queue: Mutex::new(Vec::new()),
            labels: Mutex::new(VecDeque::new()),
            spans: Mutex::new(Vec::new()),
            made: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Bytes of every buffer this device and its siblings ([`Device::sibling`]) have made
    /// ([`Device::new_buffer`]) or wrapped ([`Device::wrap_host`]) so far, never lowered:
    /// the gates that a sibling backend holds no weight a second time read it.
    pub fn bytes_made(&self) -> usize {
        self.made.load(Ordering::Relaxed)
    }

    /// The same device with other limits (tests of the launch-time limit checks).
    pub fn with_limits(mut self, limits: Limits) -> EmuDevice {
        self.limits = limits;
        self
    }

    /// The same device with another submit bound.
    pub fn with_submit_timeout(mut self, bound: Duration) -> EmuDevice {
        self.submit_timeout = bound;
        self
    }

    /// The same device running each dispatch's threadgroups on `n` OS threads (the submitting
    /// thread and `n - 1` threads of the emulator's persistent pool); 1 runs them one after
    /// another on the submitting thread. 0 is taken as 1.
    pub fn with_workers(mut self, n: usize) -> EmuDevice {
        self.workers = n.max(1);
        self
    }

    fn push(&self, cmd: Cmd) -> Result<()> {
        self.queue
            .lock()
            .map_err(|_| Error::Unavailable("queue poisoned".into()))?
            .push(cmd);
        Ok(())
    }

    pub fn schedule(&self) -> Schedule {
        self.schedule
    }

    /// The OS threads a dispatch runs on (see [`EmuDevice::with_workers`]).
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// Names of every kernel compiled into the emulator library.
    pub fn kernel_names() -> Vec<String> {
        init();
        // SAFETY: plain reads of the registry after init.
        let n = unsafe { ffi::emu_kernel_count() };
        (0..n)
            .filter_map(|i| {
                // SAFETY: i < count; the name lives as long as the registry (the process).
                let p = unsafe { ffi::emu_kernel_name(i) };
                (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
            })
            .collect()
    }

    /// The registry's names as a set, built once (every launch looks its pipeline up).
    fn kernel_set() -> &'static HashSet<String> {
        static SET: OnceLock<HashSet<String>> = OnceLock::new();
        SET.get_or_init(|| EmuDevice::kernel_names().into_iter().collect())
    }

    fn run(&self, cmd: &Cmd, deadline: Instant) -> std::result::Result<(), String> {
        match cmd {
            Cmd::SpanBegin(_) | Cmd::SpanEnd => Ok(()),
            Cmd::Dispatch {
                pipeline,
                grid,
                tg,
                args,
                tg_len,
                ..
            } => {
                let c_args: Vec<ffi::EmuArg> = args
                    .iter()
                    .map(|a| match a {
                        CmdArg::Buf(b, off) => ffi::EmuArg {
                            // the offset was checked at encode time
                            ptr: b.0.ptr.wrapping_add(*off as usize),
                            len: b.0.len as u64 - off,
                        },
                        CmdArg::Bytes(v) => ffi::EmuArg {
                            ptr: v.as_ptr(),
                            len: v.len() as u64,
                        },
                    })
                    .collect();
                let mut err = vec![0u8; 1024];
                let (schedule, seed) = match self.schedule {
                    Schedule::Forward => (ffi::SCHEDULE_FORWARD, 0),
                    Schedule::Reverse => (ffi::SCHEDULE_REVERSE, 0),
                    Schedule::Random(s) => (ffi::SCHEDULE_RANDOM, s),
                };
                let d = ffi::EmuDispatch {
                    kernel: pipeline.name.as_ptr(),
                    grid: *grid,
                    tg: *tg,
                    args: c_args.as_ptr(),
                    n_args: c_args.len() as u32,
                    tg_len: tg_len.as_ptr(),
                    n_tg: tg_len.len() as u32,
                    schedule,
                    seed,
                    tg_mem_limit: self.limits.max_threadgroup_memory,
                    max_threads: self.limits.max_threads_per_threadgroup,
                    err: err.as_mut_ptr().cast(),
                    err_cap: err.len() as u64,
                    // at least 1 ns: 0 would mean unbounded
                    timeout_ns: (deadline
                        .saturating_duration_since(Instant::now())
                        .as_nanos() as u64)
                        .max(1),
                    workers: self.workers.min(u32::MAX as usize) as u32,
                };
                // SAFETY: every pointer in `d` refers to memory alive for this call (buffers
                // are held by the command, bytes by `c_args`' sources).
                let rc = unsafe { ffi::emu_dispatch(&d) };
                if rc != 0 {
                    let msg = CStr::from_bytes_until_nul(&err)
                        .map(|c| c.to_string_lossy().into_owned())
                        .unwrap_or_default();
                    return Err(msg);
                }
                Ok(())
            }
            Cmd::CopyRows {
                src,
                dst,
                row_bytes,
                src_row,
                dst_row,
                n_rows,
            } => {
                let rows: Box<dyn Iterator<Item = u64>> = if dst_row <= src_row {
                    Box::new(0..*n_rows)
                } else {
                    Box::new((0..*n_rows).rev())
                };
                for r in rows {
                    let s = (src_row + r) * row_bytes;
                    let d = (dst_row + r) * row_bytes;
                    // SAFETY: ranges checked at encode time; `copy` allows overlap.
                    unsafe {
                        std::ptr::copy(
                            src.0.ptr.add(s as usize),
                            dst.0.ptr.add(d as usize),
                            *row_bytes as usize,
                        )
                    };
                }
                Ok(())
            }
        }
    }
}

impl Device for EmuDevice {
    type Buffer = EmuBuffer;
    type Pipeline = EmuPipeline;

    fn name(&self) -> String {
        format!("msl-emu ({:?} schedule)", self.schedule)
    }

    fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Buffers are host memory and the kernels the process's one compiled library, so a
    /// second handle is the same settings over a queue of its own.
    fn sibling(&self) -> Option<EmuDevice> {
        Some(EmuDevice {
            schedule: self.schedule,
            workers: self.workers,
            submit_timeout: self.submit_timeout,
            limits: self.limits.clone(),
            memory: self.memory,
            queue: Mutex::new(Vec::new()),
            labels: Mutex::new(VecDeque::new()),
            spans: Mutex::new(Vec::new()),
            made: Arc::clone(&self.made),
        })
    }

    fn free_memory(&self) -> std::result::Result<usize, String> {
        match self.memory {
            EmuMemory::Bytes(n) => Ok(n as usize),
            EmuMemory::Fail => {
                Err("the emulated device's memory query failed (MINFER_EMU_MEM=fail)".into())
            }
            EmuMemory::Invalid => {
                Err("MINFER_EMU_MEM is neither a size (3G, 512M, bytes) nor `fail`".into())
            }
            EmuMemory::Host => host_available(),
        }
    }

    fn new_buffer(&self, len: usize) -> Result<EmuBuffer> {
        let layout = std::alloc::Layout::from_size_align(len.max(16), 256)
            .map_err(|e| Error::Unavailable(format!("buffer of {len} bytes: {e}")))?;
        // SAFETY: non-zero size layout.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(Error::Unavailable(format!("out of memory for {len} bytes")));
        }
        self.made.fetch_add(len, Ordering::Relaxed);
        Ok(EmuBuffer(Arc::new(Mem {
            ptr,
            len,
            owned: Some(layout),
        })))
    }

    unsafe fn wrap_host(&self, ptr: *mut u8, len: usize) -> Result<EmuBuffer> {
        check_page_aligned(ptr, self.limits.page_size)?;
        self.made.fetch_add(len, Ordering::Relaxed);
        Ok(EmuBuffer(Arc::new(Mem {
            ptr,
            len,
            owned: None,
        })))
    }

    fn buffer_len(&self, buf: &EmuBuffer) -> usize {
        buf.0.len
    }

    fn contents(&self, buf: &EmuBuffer) -> *mut u8 {
        buf.0.ptr
    }

    fn pipeline(&self, name: &str) -> Result<EmuPipeline> {
        let unknown = || Error::UnknownKernel {
            name: name.to_string(),
            device: self.name(),
        };
        if !EmuDevice::kernel_set().contains(name) {
            return Err(unknown());
        }
        Ok(EmuPipeline {
            name: CString::new(name).map_err(|_| unknown())?,
        })
    }

    fn dispatch(&self, pipeline: &EmuPipeline, d: &Dispatch<'_, EmuBuffer>) -> Result<()> {
        let kernel = pipeline.name.to_string_lossy().into_owned();
        let refuse = |reason: String| Error::Dispatch {
            kernel: kernel.clone(),
            reason,
        };
        if d.grid.contains(&0) || d.threadgroup.contains(&0) {
            return Err(refuse(format!(
                "empty grid {:?} or threadgroup {:?}",
                d.grid, d.threadgroup
            )));
        }
        let mut args = Vec::with_capacity(d.args.len());
        for a in d.args {
            args.push(match a {
                Arg::Buffer(b, off) => {
                    if *off as usize > b.0.len {
                        return Err(Error::OutOfRange {
                            offset: *off,
                            len: 0,
                            size: b.0.len as u64,
                        });
                    }
                    CmdArg::Buf((*b).clone(), *off)
                }
                Arg::Bytes(v) => CmdArg::Bytes(v.to_vec()),
            });
        }
        self.queue
            .lock()
            .map_err(|_| refuse("queue poisoned".into()))?
            .push(Cmd::Dispatch {
                pipeline: pipeline.clone(),
                label: d.label.to_string(),
                grid: d.grid,
                tg: d.threadgroup,
                args,
                tg_len: d.threadgroup_memory.to_vec(),
            });
        Ok(())
    }

    fn barrier(&self) -> Result<()> {
        // Commands run one after another at submit, so every write is visible to the next
        // dispatch; a missing barrier is not detectable here (see the crate docs).
        Ok(())
    }

    fn copy_rows(
        &self,
        src: &EmuBuffer,
        dst: &EmuBuffer,
        row_bytes: u64,
        src_row: u64,
        dst_row: u64,
        n_rows: u64,
    ) -> Result<()> {
        for (buf, row) in [(src, src_row), (dst, dst_row)] {
            let end = (row + n_rows) * row_bytes;
            if end > buf.0.len as u64 {
                return Err(Error::OutOfRange {
                    offset: row * row_bytes,
                    len: n_rows * row_bytes,
                    size: buf.0.len as u64,
                });
            }
        }
        self.queue
            .lock()
            .map_err(|_| Error::Unavailable("queue poisoned".into()))?
            .push(Cmd::CopyRows {
                src: src.clone(),
                dst: dst.clone(),
                row_bytes,
                src_row,
                dst_row,
                n_rows,
            });
        Ok(())
    }

    fn submit(&self) -> Result<()> {
        let cmds = std::mem::take(
            &mut *self
                .queue
                .lock()
                .map_err(|_| Error::Unavailable("queue poisoned".into()))?,
        );
        let mut labels = self
            .labels
            .lock()
            .map_err(|_| Error::Unavailable("label ring poisoned".into()))?;
        let deadline = Instant::now() + self.submit_timeout;
        // The open span: its tag, when it started running, whether work ran inside it.
        let mut open: Option<(u32, Instant, bool)> = None;
        let mut spans = Vec::new();
        for cmd in &cmds {
            let label = match cmd {
                Cmd::Dispatch {
                    pipeline, label, ..
                } => format!("{} [{}]", label, pipeline.name.to_string_lossy()),
                Cmd::CopyRows { .. } => "copy_rows".to_string(),
                Cmd::SpanBegin(tag) => {
                    open = Some((*tag, Instant::now(), false));
                    continue;
                }
                Cmd::SpanEnd => {
                    if let Some((tag, t0, true)) = open.take() {
                        spans.push((tag, t0.elapsed().as_nanos() as u64));
                    }
                    continue;
                }
            };
            if let Some(o) = &mut open {
                o.2 = true;
            }
            if labels.len() == LABEL_RING {
                labels.pop_front();
            }
            labels.push_back(label);
            if let Err(reason) = self.run(cmd, deadline) {
                return Err(Error::Submit {
                    reason,
                    labels: labels.iter().cloned().collect(),
                });
            }
        }
        self.spans
            .lock()
            .map_err(|_| Error::Unavailable("span list poisoned".into()))?
            .extend(spans);
        Ok(())
    }

    fn begin_span(&self, tag: u32) -> Result<()> {
        self.push(Cmd::SpanBegin(tag))
    }

    fn end_span(&self) -> Result<()> {
        self.push(Cmd::SpanEnd)
    }

    fn take_spans(&self) -> Vec<(u32, u64)> {
        // A panic while the list was held leaves complete entries: take them all the same.
        std::mem::take(&mut *self.spans.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn span_clock(&self) -> Option<&'static str> {
        Some(SPAN_CLOCK)
    }
}

/// The host's available memory (the emulator's buffers are host memory).
fn host_available() -> std::result::Result<usize, String> {
    let info = std::fs::read_to_string("/proc/meminfo")
        .map_err(|e| format!("cannot read /proc/meminfo: {e}"))?;
    info.lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<usize>().ok())
        .map(|kib| kib << 10)
        .ok_or_else(|| "/proc/meminfo has no MemAvailable line".into())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_shims_half_conversions_match_the_compilers_bit_for_bit() {
        super::init();
        // SAFETY: a self-contained check in the C++ runtime.
        assert_eq!(unsafe { super::ffi::emu_selftest_half() }, 0);
    }
}
