//! The device layer: one context on GPU 0, one non-blocking stream per engine, the kernels
//! compiled with NVRTC for the device's compute capability as one module per `.cu` file, in
//! parallel threads that run while the caller uploads the weights and are joined when the
//! first kernel is needed (crate::compile: each module's PTX cached on disk by its own hash),
//! raw device allocations owned until drop, every launch's error checked and synchronisation
//! bounded by a deadline.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{
    result, sys, CudaContext, CudaFunction, CudaGraph, CudaStream, LaunchConfig, PushKernelArg,
};

use crate::compile::{self, CompileReport};
use crate::lt::{GemmCall, GemmType, Lt};

/// Kernel launches asked for so far, per kernel name ([`launches`]).
static LAUNCHES: std::sync::Mutex<Option<HashMap<&'static str, u64>>> = std::sync::Mutex::new(None);

/// Launches of `kernel` the executor asked for so far (issued, or recorded into a graph that
/// is then replayed without counting), process-wide: what the gates read to show which
/// kernels a path really ran.
pub fn launches(kernel: &str) -> u64 {
    LAUNCHES
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .and_then(|m| m.get(kernel).copied())
        .unwrap_or(0)
}

pub use crate::compile::{KERNELS, SOURCES};

pub type DResult<T> = std::result::Result<T, String>;

pub(crate) fn drv(what: &str, e: impl std::fmt::Debug) -> String {
    format!("{what}: {e:?}")
}

/// Runs `f`, turning a panic of cudarc's dynamic loader (no libcuda / libnvrtc) into an error.
pub(crate) fn guarded<T>(what: &str, f: impl FnOnce() -> DResult<T>) -> DResult<T> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    std::panic::set_hook(hook);
    match r {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panic".into());
            Err(format!("{what}: {msg}"))
        }
    }
}

/// Whether the driver loads and a device exists.
pub fn available() -> DResult<()> {
    guarded("CUDA driver", || {
        let n = CudaContext::device_count().map_err(|e| drv("cuDeviceGetCount", e))?;
        if n < 1 {
            return Err("no CUDA device".into());
        }
        Ok(())
    })
}

/// How many CUDA devices the driver sees (`--tensor-parallel`'s refusal names it).
pub fn device_count() -> DResult<usize> {
    guarded("CUDA driver", || {
        CudaContext::device_count()
            .map(|n| n.max(0) as usize)
            .map_err(|e| drv("cuDeviceGetCount", e))
    })
}

/// The whole program: every source concatenated in order (no defines).
pub fn program() -> String {
    let sources = compile::sources(None).unwrap_or_default();
    compile::whole("", &sources)
}

/// Compiles every `.cu` file on its own (after the headers) for `arch`, as the device
/// compiles its modules, and the whole program, reporting every NVRTC error at once: the
/// self-test run before anything else on a new device.
pub fn selftest(arch: &str) -> Vec<(String, DResult<()>)> {
    let sources = compile::sources(None).unwrap_or_default();
    let mut out = Vec::new();
    for m in compile::modules("", &sources) {
        let r = guarded("NVRTC", || {
            compile::compile(&m.src, arch)
                .map(|_| ())
                .map_err(|e| compile::compile_log(&e))
        });
        out.push((m.file, r));
    }
    let whole = guarded("NVRTC", || {
        compile::compile(&program(), arch)
            .map(|_| ())
            .map_err(|e| compile::compile_log(&e))
    });
    out.push(("(whole program)".into(), whole));
    out
}

/// The kernels, or how far they are: compiling in other threads until the first kernel is
/// needed ([`Gpu::kernels`]), then looked up once.
enum Kernels {
    Pending(compile::Pending),
    Ready(HashMap<&'static str, CudaFunction>),
    Failed(String),
}

/// One GPU as the executor uses it.
pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    /// The kernels, compiling until first needed.
    kernels: RefCell<Kernels>,
    /// What the compile did, once joined.
    compiled: RefCell<Option<CompileReport>>,
    /// While a split is being recorded: its launches, not yet issued (see [`Gpu::begin_record`]).
    record: RefCell<Option<Record>>,
    pub name: String,
    pub arch: String,
    pub total_mem: usize,
    /// Modules of the program, and how many of them the disk cache held at start.
    pub modules: usize,
    pub cached_modules: usize,
    /// Kernels launched as programmatic dependents of the one before them.
    pub pdl: bool,
    /// Streaming multiprocessors of the device.
    pub sm_count: u32,
    /// [`Gpu::resident_blocks`] per (kernel, threads, shared bytes).
    resident: RefCell<HashMap<(&'static str, u32, u32), u32>>,
    /// Every allocation made (pointer, bytes), freed at drop.
    allocs: Vec<(u64, usize)>,
    /// The device memory this `Gpu`, its siblings and their shared weights hold, and the
    /// budget every allocation is checked against before it is made ([`Gpu::set_budget`]).
    charge: Arc<DeviceCharge>,
    /// Page-locked staging for large reads (grown to a power of two, kept).
    staging: RefCell<Option<Pinned>>,
    /// Page-locked blocks for large uploads ([`Gpu::upload_staged`]): two halves filled in
    /// turn, each with the event of the copy that last read it.
    up_staging: RefCell<Option<(Pinned, [cudarc::driver::CudaEvent; 2])>>,
    /// The half of `up_staging` the next piece goes to.
    up_turn: Cell<usize>,
    /// The spans of the model's mapping page-locked for streamed weights
    /// ([`Gpu::lock_host`], [`Gpu::upload_mapped`]).
    locked: crate::locked::LockedSpans,
    /// cuBLASLt, opened by the first prompt-row GEMM plan.
    lt: Option<Lt>,
    /// How cuBLASLt pins its algorithms (`MINFER_CUDA_GEMM_*`), for when it opens.
    gemm: crate::settings::GemmPin,
    /// How long a synchronisation waits before it reports a hung device.
    sync_timeout: Duration,
    /// Kernels and GEMMs issued on the stream so far ([`Gpu::issued`]).
    issued: Cell<u64>,
}

impl Gpu {
    /// GPU 0 with the settings this process's environment sets (the crate's kernel tests).
    pub fn new() -> DResult<Gpu> {
        let s = crate::CudaSettings::from_env().map_err(|e| e.to_string())?;
        Self::with(&s)
    }

    /// GPU 0 with `s` (the kernel directory, cache, launch mode and walks it names).
    pub fn with(s: &crate::CudaSettings) -> DResult<Gpu> {
        guarded("CUDA", || Self::open(s))
    }

    fn open(s: &crate::CudaSettings) -> DResult<Gpu> {
        let ctx = CudaContext::new(0).map_err(|e| drv("cuCtx (device 0)", e))?;
        // One stream, ordered by construction: no per-buffer events.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(|e| drv("cuStreamCreate", e))?;
        let name = ctx.name().map_err(|e| drv("cuDeviceGetName", e))?;
        let (ma, mi) = ctx
            .compute_capability()
            .map_err(|e| drv("compute capability", e))?;
        let arch = format!("sm_{ma}{mi}");
        // Programmatic dependent launch (sm_90 on): the next kernel may start once this one's
        // main loop is done (`late`, the default), at its entry (`early`), or never before it
        // ends (`MINFER_CUDA_PDL=0`: plain launches).
        let early = s.pdl == crate::settings::Pdl::Early;
        let pdl = ma >= 9 && s.pdl != crate::settings::Pdl::Off;
        let total_mem = ctx.total_mem().map_err(|e| drv("cuDeviceTotalMem", e))?;
        if let Some(dir) = &s.kernel_dir {
            tracing::info!(
                "cuda: kernel sources from {} (MINFER_CUDA_KERNEL_DIR), not the built-in ones",
                dir.display()
            );
        }
        let sources = compile::sources(s.kernel_dir.as_deref())?;
        // The settings' defines go before every module (and so into every cache key).
        let prelude = compile::prelude(&s.mv1.defines(), early);
        let sm_count = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .map_err(|e| drv("multiprocessor count", e))?
            .max(1) as u32;
        // Modules the cache does not hold compile in their own threads from here on, while
        // the caller goes on (the weights upload); the first kernel needed joins them.
        let pending = compile::start_images(
            compile::modules(&prelude, &sources),
            &arch,
            s.cache_dir.as_deref(),
            s.image,
        )?;
        let (modules, cached_modules) =
            (pending.modules(), pending.modules() - pending.compiling());
        Ok(Gpu {
            ctx,
            stream,
            kernels: RefCell::new(Kernels::Pending(pending)),
            compiled: RefCell::new(None),
            record: RefCell::new(None),
            name,
            arch,
            total_mem,
            modules,
            cached_modules,
            pdl,
            sm_count,
            resident: RefCell::new(HashMap::new()),
            allocs: Vec::new(),
            charge: Arc::new(DeviceCharge::default()),
            staging: RefCell::new(None),
            up_staging: RefCell::new(None),
            up_turn: Cell::new(0),
            locked: Default::default(),
            lt: None,
            gemm: s.gemm,
            sync_timeout: s.sync_timeout,
            issued: Cell::new(0),
        })
    }

    /// Joins the compile if it is still under way, loads every module into the context and
    /// looks each kernel of [`KERNELS`] up in the one module that defines it; the report of
    /// the compile the first time (None after). A compile failure is an error naming the
    /// file and NVRTC's log, every time it is asked.
    pub fn kernels(&self) -> DResult<Option<CompileReport>> {
        if let Kernels::Ready(_) = &*self.kernels.borrow() {
            return Ok(None);
        }
        let state = std::mem::replace(
            &mut *self.kernels.borrow_mut(),
            Kernels::Failed("the kernels are being loaded".into()),
        );
        let pending = match state {
            Kernels::Pending(p) => p,
            Kernels::Failed(e) => {
                *self.kernels.borrow_mut() = Kernels::Failed(e.clone());
                return Err(e);
            }
            Kernels::Ready(_) => unreachable!("returned above"),
        };
        let r = pending.join().and_then(|(mods, report)| {
            self.bind()?;
            Ok((compile::load(&self.ctx, mods)?, report))
        });
        match r {
            Ok((funcs, report)) => {
                // Wherever the join happens (the end of the weight upload, or the first
                // kernel of a backend that holds no weights), the start-up report says it.
                tracing::info!(
                    "cuda: kernels {}; waited {:.2} s for the compile",
                    report.describe(),
                    report.waited.as_secs_f64()
                );
                *self.kernels.borrow_mut() = Kernels::Ready(funcs);
                *self.compiled.borrow_mut() = Some(report.clone());
                Ok(Some(report))
            }
            Err(e) => {
                *self.kernels.borrow_mut() = Kernels::Failed(e.clone());
                Err(e)
            }
        }
    }

    /// What the compile did, once the kernels are loaded.
    pub fn compile_report(&self) -> Option<CompileReport> {
        self.compiled.borrow().clone()
    }

    /// The static name of kernel `name` (the kernels loaded first).
    fn kernel_key(&self, name: &str) -> DResult<&'static str> {
        self.kernels()?;
        match &*self.kernels.borrow() {
            Kernels::Ready(funcs) => funcs
                .get_key_value(name)
                .map(|(&k, _)| k)
                .ok_or_else(|| format!("no kernel {name}")),
            _ => Err("the kernels are not loaded".into()),
        }
    }

    /// How many blocks of `kernel` (`threads` each, `shared` dynamic bytes) the whole GPU
    /// holds at once: its multiprocessors times the driver's occupancy (cached per shape).
    pub fn resident_blocks(&self, kernel: &str, threads: u32, shared: u32) -> DResult<u32> {
        self.kernels()?;
        let k = self.kernels.borrow();
        let Kernels::Ready(funcs) = &*k else {
            return Err("the kernels are not loaded".into());
        };
        let (&key, f) = funcs
            .get_key_value(kernel)
            .ok_or_else(|| format!("no kernel {kernel}"))?;
        if let Some(&n) = self.resident.borrow().get(&(key, threads, shared)) {
            return Ok(n);
        }
        let per_sm = f
            .occupancy_max_active_blocks_per_multiprocessor(threads, shared as usize, None)
            .map_err(|e| drv(&format!("occupancy of {kernel}"), e))?
            .max(1);
        let n = per_sm * self.sm_count;
        self.resident.borrow_mut().insert((key, threads, shared), n);
        Ok(n)
    }

    /// The GEMM plan of `n` outputs over rows of `k` in `ty` (cuBLASLt opened on first use;
    /// a missing library is an error naming it).
    pub fn gemm_plan(&mut self, n: u64, k: u64, ty: GemmType) -> DResult<usize> {
        if self.lt.is_none() {
            let ws = self.alloc(crate::lt::WORKSPACE)?;
            let g = self.gemm;
            self.lt = Some(guarded("cuBLASLt", || Lt::new(ws, g))?);
        }
        let lt = self.lt.as_mut().expect("opened above");
        guarded("cuBLASLt", || lt.plan(n, k, ty))
    }

    /// The pinned algorithm of a plan, for the startup line and the gates.
    pub fn gemm_describe(&self, plan: usize) -> String {
        self.lt
            .as_ref()
            .map_or_else(|| "no cuBLASLt".into(), |l| l.describe(plan))
    }

    /// Issues a GEMM, or records it while a split is being recorded.
    pub fn gemm(&self, c: GemmCall) -> DResult<()> {
        if self.lt.is_none() {
            return Err("a GEMM without cuBLASLt".into());
        }
        let w = Work::Gemm(c);
        if let Some(r) = self.record.borrow_mut().as_mut() {
            r.launches.push(w);
            return Ok(());
        }
        self.issue(&w)
    }

    pub fn bind(&self) -> DResult<()> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| drv("cuCtxSetCurrent", e))
    }

    pub fn free_mem(&self) -> usize {
        self.ctx.mem_get_info().map(|(f, _)| f).unwrap_or(0)
    }

    /// Free device memory, or the driver's error (layer offload refuses to plan on a failed
    /// query rather than read it as zero).
    pub fn try_free_mem(&self) -> DResult<usize> {
        self.bind()?;
        self.ctx
            .mem_get_info()
            .map(|(f, _)| f)
            .map_err(|e| drv("cuMemGetInfo", e))
    }

    /// A zeroed allocation of `bytes`; out of memory is an error naming the request and the
    /// free memory.
    pub fn alloc(&mut self, bytes: usize) -> DResult<u64> {
        let (ptr, bytes) = self.alloc_raw(bytes)?;
        self.allocs.push((ptr, bytes));
        Ok(ptr)
    }

    /// A zeroed allocation the caller owns (not freed with this `Gpu`): the weights, which
    /// a [`SharedAllocs`] frees when the last backend reading them is dropped. Checked
    /// against the budget first ([`Gpu::set_budget`]): past it, a refusal naming the MiB.
    pub(crate) fn alloc_raw(&self, bytes: usize) -> DResult<(u64, usize)> {
        self.bind()?;
        let bytes = bytes.max(16);
        self.charge.take(bytes)?;
        let ptr = unsafe { result::malloc_sync(bytes) }.map_err(|e| {
            self.charge.give(bytes);
            format!(
                "out of device memory: {bytes} bytes asked, {} bytes free ({e:?})",
                self.free_mem()
            )
        })?;
        if let Err(e) = self.memset0(ptr, bytes) {
            unsafe {
                let _ = result::free_sync(ptr);
            }
            self.charge.give(bytes);
            return Err(e);
        }
        Ok((ptr, bytes))
    }

    /// The most device memory this `Gpu`, its siblings and the weights they share may hold
    /// (layer offload's budget, issue 32), allocations already made included: each later
    /// allocation that would pass it is refused before it is made. None: no budget.
    pub fn set_budget(&self, bytes: Option<usize>) {
        self.charge
            .limit
            .store(bytes.unwrap_or(usize::MAX), Ordering::Relaxed);
    }

    /// Bytes of device memory allocated through this `Gpu` and its siblings, held now.
    pub fn allocated(&self) -> usize {
        self.charge.used.load(Ordering::Relaxed)
    }

    /// Another `Gpu` on this one's context, for a sibling backend (issue 31's self-draft):
    /// the kernels this one compiled (joined first if the compile is still running), the same
    /// loaded modules (each function a handle on them: nothing compiled or loaded again),
    /// and a stream, allocations, staging and cuBLASLt handle of its own.
    pub fn sibling(&self) -> DResult<Gpu> {
        self.kernels()?;
        let funcs = match &*self.kernels.borrow() {
            Kernels::Ready(funcs) => funcs.clone(),
            _ => return Err("the kernels are not loaded".into()),
        };
        self.bind()?;
        let stream = self
            .ctx
            .new_stream()
            .map_err(|e| drv("cuStreamCreate", e))?;
        Ok(Gpu {
            ctx: Arc::clone(&self.ctx),
            stream,
            kernels: RefCell::new(Kernels::Ready(funcs)),
            compiled: RefCell::new(self.compiled.borrow().clone()),
            record: RefCell::new(None),
            name: self.name.clone(),
            arch: self.arch.clone(),
            total_mem: self.total_mem,
            modules: self.modules,
            cached_modules: self.cached_modules,
            pdl: self.pdl,
            sm_count: self.sm_count,
            resident: RefCell::new(self.resident.borrow().clone()),
            allocs: Vec::new(),
            charge: Arc::clone(&self.charge),
            staging: RefCell::new(None),
            up_staging: RefCell::new(None),
            up_turn: Cell::new(0),
            locked: self.locked.shared(),
            lt: None,
            gemm: self.gemm,
            sync_timeout: self.sync_timeout,
            issued: Cell::new(0),
        })
    }

    /// Whether `other` runs on the same context (a sibling's check of what it is handed).
    pub(crate) fn same_context(&self, other: &Arc<CudaContext>) -> bool {
        Arc::ptr_eq(&self.ctx, other)
    }

    pub fn memset0(&self, ptr: u64, bytes: usize) -> DResult<()> {
        self.flush_record()?;
        unsafe { result::memset_d8_async(ptr, 0, bytes, self.stream.cu_stream()) }
            .map_err(|e| drv("cuMemsetD8Async", e))
    }

    pub fn upload(&self, ptr: u64, data: &[u8]) -> DResult<()> {
        if data.is_empty() {
            return Ok(());
        }
        self.flush_record()?;
        self.bind()?;
        // From pageable host memory the driver has staged `data` when this returns (CUDA's
        // documented behaviour for pageable host-to-device copies), so the slice may go away
        // without waiting for the stream.
        unsafe { result::memcpy_htod_async(ptr, data, self.stream.cu_stream()) }
            .map_err(|e| drv("cuMemcpyHtoDAsync", e))
    }

    pub fn download(&self, ptr: u64, out: &mut [u8]) -> DResult<()> {
        if out.is_empty() {
            return Ok(());
        }
        self.flush_record()?;
        self.bind()?;
        if out.len() < PINNED_FROM {
            unsafe { result::memcpy_dtoh_async(out, ptr, self.stream.cu_stream()) }
                .map_err(|e| drv("cuMemcpyDtoHAsync", e))?;
            return self.sync();
        }
        // Large reads (logits) through page-locked staging: the copy runs at the link's
        // speed instead of through the driver's bounce buffers.
        let mut staging = self.staging.borrow_mut();
        if staging.as_ref().is_none_or(|s| s.len < out.len()) {
            if let Some(old) = staging.take() {
                unsafe {
                    let _ = result::free_host(old.ptr as *mut std::ffi::c_void);
                }
            }
            let len = out.len().next_power_of_two();
            let p = unsafe { result::malloc_host(len, 0) }
                .map_err(|e| drv(&format!("cuMemHostAlloc of {len} bytes"), e))?;
            *staging = Some(Pinned {
                ptr: p as *mut u8,
                len,
            });
        }
        let st = staging.as_ref().expect("staging allocated above");
        // SAFETY: the staging block holds at least out.len() bytes and only this call uses
        // it (the RefCell borrow), until the stream has finished the copy below.
        let dst = unsafe { std::slice::from_raw_parts_mut(st.ptr, out.len()) };
        unsafe { result::memcpy_dtoh_async(dst, ptr, self.stream.cu_stream()) }
            .map_err(|e| drv("cuMemcpyDtoHAsync", e))?;
        self.sync()?;
        parallel_copy(out, dst);
        Ok(())
    }

    /// A large host-to-device copy (streamed weights outside the locked span) through two
    /// page-locked blocks: each piece of `data` is copied into one block by several host
    /// threads while the device reads the other, so the link runs at its pinned speed
    /// instead of through the driver's bounce buffers. Returns once the device has read
    /// every piece. Small copies take [`Gpu::upload`].
    pub fn upload_staged(&self, ptr: u64, data: &[u8]) -> DResult<()> {
        self.stage_up(ptr, data, true)
    }

    /// As [`Gpu::upload_staged`], but returns once `data` is in the page-locked blocks,
    /// the copies queued on the stream (a boundary crossing's rows, issue 32: the device
    /// reads them in stream order, and a later use of a block waits for its copy first).
    pub fn upload_pinned(&self, ptr: u64, data: &[u8]) -> DResult<()> {
        self.stage_up(ptr, data, false)
    }

    fn stage_up(&self, ptr: u64, data: &[u8], wait: bool) -> DResult<()> {
        if data.len() < STAGED_UPLOAD_FROM {
            return self.upload(ptr, data);
        }
        self.flush_record()?;
        self.bind()?;
        let mut ring = self.up_staging.borrow_mut();
        if ring.is_none() {
            let len = 2 * UPLOAD_PIECE;
            let p = unsafe { result::malloc_host(len, 0) }
                .map_err(|e| drv(&format!("cuMemHostAlloc of {len} bytes"), e))?;
            let ev = || {
                self.ctx
                    .new_event(None)
                    .map_err(|e| drv("cuEventCreate", e))
            };
            *ring = Some((
                Pinned {
                    ptr: p as *mut u8,
                    len,
                },
                [ev()?, ev()?],
            ));
        }
        let (block, events) = ring.as_ref().expect("allocated above");
        for (i, piece) in data.chunks(UPLOAD_PIECE).enumerate() {
            // The halves alternate across calls too: a copy left queued by the last call
            // (`wait` off) read the half the turn says is not next.
            let half = self.up_turn.get();
            self.up_turn.set(1 - half);
            // The copy that last read this half is done (an event never recorded returns
            // at once).
            events[half]
                .synchronize()
                .map_err(|e| drv("cuEventSynchronize", e))?;
            // SAFETY: half `half` of the block holds UPLOAD_PIECE bytes; no copy reads it now
            // (waited above), and only this call touches it (the RefCell borrow).
            let dst = unsafe {
                std::slice::from_raw_parts_mut(block.ptr.add(half * UPLOAD_PIECE), piece.len())
            };
            parallel_copy(dst, piece);
            unsafe {
                result::memcpy_htod_async(
                    ptr + (i * UPLOAD_PIECE) as u64,
                    &*dst,
                    self.stream.cu_stream(),
                )
            }
            .map_err(|e| drv("cuMemcpyHtoDAsync", e))?;
            events[half]
                .record(&self.stream)
                .map_err(|e| drv("cuEventRecord", e))?;
        }
        if wait {
            for e in events {
                e.synchronize().map_err(|e| drv("cuEventSynchronize", e))?;
            }
        }
        Ok(())
    }

    /// Page-locks the span of the model's mapping `span` lies in ([`crate::locked`]);
    /// whether the driver took it.
    pub fn lock_host(&self, span: &[u8]) -> DResult<bool> {
        self.bind()?;
        Ok(self.locked.lock(span))
    }

    /// A streamed weight's bytes `data` from the model's mapping (ADR 0014): where they lie
    /// in a span [`Gpu::lock_host`] locked, the copy is queued on the stream and the host
    /// goes on at once; else through the staging blocks.
    pub fn upload_mapped(&self, ptr: u64, data: &[u8]) -> DResult<()> {
        self.flush_record()?;
        self.bind()?;
        if self.locked.covers(data) {
            // SAFETY: `data` lies in a locked span of the mapping, which outlives the
            // device's use of it.
            return unsafe { result::memcpy_htod_async(ptr, data, self.stream.cu_stream()) }
                .map_err(|e| drv("cuMemcpyHtoDAsync", e));
        }
        self.upload_staged(ptr, data)
    }

    pub fn copy_d2d(&self, dst: u64, src: u64, bytes: usize) -> DResult<()> {
        self.flush_record()?;
        unsafe { result::memcpy_dtod_async(dst, src, bytes, self.stream.cu_stream()) }
            .map_err(|e| drv("cuMemcpyDtoDAsync", e))
    }

    /// Waits for the stream, bounded: a device that does not finish in time is an error.
    pub fn sync(&self) -> DResult<()> {
        self.bind()?;
        let start = Instant::now();
        let limit = self.sync_timeout;
        loop {
            let r = unsafe { sys::cuStreamQuery(self.stream.cu_stream()) };
            match r {
                sys::CUresult::CUDA_SUCCESS => return Ok(()),
                sys::CUresult::CUDA_ERROR_NOT_READY => {
                    let waited = start.elapsed();
                    if waited > limit {
                        return Err(format!(
                            "the device did not finish its work within {limit:?}"
                        ));
                    }
                    // Spin for the first 2 ms (a sleep costs tens of microseconds, more than
                    // a decode step's kernels), then poll gently.
                    if waited < Duration::from_millis(2) {
                        std::hint::spin_loop();
                    } else {
                        std::thread::sleep(Duration::from_micros(50));
                    }
                }
                e => return Err(format!("device work failed: {e:?}")),
            }
        }
    }

    /// Launches kernel `name` with `args` (each a plain value: pointers as u64), or records
    /// the launch while a split is being recorded.
    pub fn launch(
        &self,
        name: &str,
        grid: (u32, u32, u32),
        block: u32,
        args: &[Arg],
    ) -> DResult<()> {
        self.launch_shared(name, grid, block, 0, args)
    }

    /// [`Gpu::launch`] with `shared` bytes of dynamic shared memory per block.
    pub fn launch_shared(
        &self,
        name: &str,
        grid: (u32, u32, u32),
        block: u32,
        shared: u32,
        args: &[Arg],
    ) -> DResult<()> {
        if shared > MAX_SHARED {
            return Err(format!(
                "{name}: {shared} bytes of shared memory per block, the limit used is {MAX_SHARED}"
            ));
        }
        let key = self.kernel_key(name)?;
        if grid.0 == 0 || grid.1 == 0 || grid.2 == 0 {
            return Ok(());
        }
        *LAUNCHES
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert_with(HashMap::new)
            .entry(key)
            .or_insert(0) += 1;
        let l = Work::Kernel(Launch {
            kernel: key,
            grid,
            block,
            shared,
            args: args.to_vec(),
        });
        if let Some(r) = self.record.borrow_mut().as_mut() {
            r.launches.push(l);
            return Ok(());
        }
        self.issue(&l)
    }

    /// Kernels and GEMMs issued on the stream so far (recorded ones count when issued or
    /// captured; a replayed graph's do not): whether a node put work on the stream.
    pub fn issued(&self) -> u64 {
        self.issued.get()
    }

    fn issue(&self, w: &Work) -> DResult<()> {
        self.issued.set(self.issued.get() + 1);
        let l = match w {
            Work::Kernel(l) => l,
            Work::Gemm(c) => {
                let lt = self.lt.as_ref().ok_or("a GEMM without cuBLASLt")?;
                self.bind()?;
                return lt.issue(c, self.stream.cu_stream() as _);
            }
        };
        let k = self.kernels.borrow();
        let f = match &*k {
            Kernels::Ready(funcs) => funcs
                .get(l.kernel)
                .ok_or_else(|| format!("no kernel {}", l.kernel))?,
            _ => return Err(format!("{}: the kernels are not loaded", l.kernel)),
        };
        if self.pdl {
            return self.issue_programmatic(l, f);
        }
        let mut b = self.stream.launch_builder(f);
        for a in &l.args {
            match a {
                Arg::I32(v) => b.arg(v),
                Arg::U64(v) => b.arg(v),
                Arg::F32(v) => b.arg(v),
            };
        }
        let cfg = LaunchConfig {
            grid_dim: l.grid,
            block_dim: (l.block, 1, 1),
            shared_mem_bytes: l.shared,
        };
        unsafe { b.launch(cfg) }.map_err(|e| drv(&format!("launch {}", l.kernel), e))?;
        Ok(())
    }

    /// A launch that may begin while the kernel before it on the stream finishes
    /// (programmatic dependent launch, compute capability 9.0 on): every kernel first
    /// executes `griddepcontrol.wait` (`mf_pdl_wait`, kernels/common.cuh) before it touches
    /// memory another kernel writes, so only its prologue (weight prefetches) overlaps.
    fn issue_programmatic(&self, l: &Launch, f: &CudaFunction) -> DResult<()> {
        self.bind()?;
        // Each argument in an 8-byte slot (an i32 or f32 in its low bytes: little-endian), on
        // the stack: no allocation per launch.
        let n = l.args.len();
        if n > MAX_ARGS {
            return Err(format!(
                "{}: {n} arguments, the launcher holds {MAX_ARGS}",
                l.kernel
            ));
        }
        let mut slots = [0u64; MAX_ARGS];
        for (s, a) in slots.iter_mut().zip(&l.args) {
            *s = match a {
                Arg::I32(v) => *v as u32 as u64,
                Arg::U64(v) => *v,
                Arg::F32(v) => v.to_bits() as u64,
            };
        }
        let mut params = [std::ptr::null_mut::<std::ffi::c_void>(); MAX_ARGS];
        for (p, s) in params.iter_mut().zip(slots.iter_mut()) {
            *p = s as *mut u64 as *mut std::ffi::c_void;
        }
        // SAFETY: an all-zero attribute value is valid plain data; one field is then set.
        let mut value: sys::CUlaunchAttributeValue = unsafe { std::mem::zeroed() };
        value.programmaticStreamSerializationAllowed = 1;
        let mut attr = sys::CUlaunchAttribute {
            id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
            pad: [0; 4],
            value,
        };
        let cfg = sys::CUlaunchConfig {
            gridDimX: l.grid.0,
            gridDimY: l.grid.1,
            gridDimZ: l.grid.2,
            blockDimX: l.block,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: l.shared,
            hStream: self.stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: 1,
        };
        // SAFETY: the parameter slots outlive the call (the driver copies them), their count
        // and sizes are the kernel's signature as the recorded launch gives it, the same list
        // the plain launch path pushes.
        unsafe {
            sys::cuLaunchKernelEx(
                &cfg,
                f.cu_function(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
        .map_err(|e| drv(&format!("launch {}", l.kernel), e))
    }

    /// Starts recording launches instead of issuing them (the split's launches can then be
    /// compared with an earlier split's and replayed as a CUDA graph). Any other stream
    /// operation meanwhile issues what was recorded first, keeping stream order, and marks
    /// the record partial.
    pub fn begin_record(&self) {
        *self.record.borrow_mut() = Some(Record::default());
    }

    /// Stops recording: the launches not yet issued, and whether they are the whole split.
    pub fn end_record(&self) -> (Vec<Work>, bool) {
        let r = self.record.borrow_mut().take().unwrap_or_default();
        (r.launches, !r.partial)
    }

    fn flush_record(&self) -> DResult<()> {
        let pending = match self.record.borrow_mut().as_mut() {
            Some(r) if !r.launches.is_empty() => {
                r.partial = true;
                std::mem::take(&mut r.launches)
            }
            Some(r) => {
                r.partial = true;
                return Ok(());
            }
            None => return Ok(()),
        };
        for l in &pending {
            self.issue(l)?;
        }
        Ok(())
    }

    /// Issues `launches` eagerly, in order.
    pub fn issue_all(&self, launches: &[Work]) -> DResult<()> {
        for l in launches {
            self.issue(l)?;
        }
        Ok(())
    }

    /// Captures `launches` into a CUDA graph on the stream (nothing runs until it is
    /// launched).
    pub fn capture(&self, launches: &[Work]) -> DResult<CudaGraph> {
        self.bind()?;
        self.stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(|e| drv("cuStreamBeginCapture", e))?;
        let issued = self.issue_all(launches);
        let graph = self
            .stream
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .map_err(|e| drv("cuStreamEndCapture", e));
        issued?;
        graph?.ok_or_else(|| "stream capture gave no graph".to_string())
    }
}

/// One kernel launch as recorded: equal records launch the same work.
#[derive(Clone, Debug, PartialEq)]
pub struct Launch {
    pub kernel: &'static str,
    pub grid: (u32, u32, u32),
    pub block: u32,
    /// Dynamic shared memory per block, bytes.
    pub shared: u32,
    pub args: Vec<Arg>,
}

/// One piece of stream work as recorded: a kernel of ours or a cuBLASLt GEMM.
#[derive(Clone, Debug, PartialEq)]
pub enum Work {
    Kernel(Launch),
    Gemm(GemmCall),
}

/// Most arguments a programmatic launch passes (the widest kernel, the rope-fused Q/K/V
/// `mf_qkv1r_*`, takes 29).
const MAX_ARGS: usize = 32;

/// Reads of at least this many bytes go through the page-locked staging block.
const PINNED_FROM: usize = 64 * 1024;

/// [`Gpu::upload_staged`]'s pieces, and the smallest copy it stages (below, the driver's
/// pageable path is as fast).
const UPLOAD_PIECE: usize = 16 << 20;
const STAGED_UPLOAD_FROM: usize = 1 << 20;

/// `dst` = `src` (same length), copied by up to 8 host threads: one thread's memcpy from
/// pageable memory runs well under the host's memory bandwidth.
fn parallel_copy(dst: &mut [u8], src: &[u8]) {
    const MIN_PER_THREAD: usize = 1 << 20;
    let threads = (src.len() / MIN_PER_THREAD).clamp(1, 8);
    if threads == 1 {
        dst.copy_from_slice(src);
        return;
    }
    let per = src.len().div_ceil(threads);
    std::thread::scope(|s| {
        for (d, c) in dst.chunks_mut(per).zip(src.chunks(per)) {
            s.spawn(move || d.copy_from_slice(c));
        }
    });
}

/// A page-locked host block (cuMemHostAlloc), freed at drop.
struct Pinned {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the block is plain host memory owned by one Gpu; it moves with the Gpu between
// threads and is only touched through `&self` methods that hold its RefCell borrow.
unsafe impl Send for Pinned {}

/// Dynamic shared memory a launch may ask for without opting in per kernel (CUDA's default
/// per-block limit).
pub const MAX_SHARED: u32 = 48 * 1024;

#[derive(Default)]
struct Record {
    launches: Vec<Work>,
    /// Some launches were issued before the record ended (an upload or read came between).
    partial: bool,
}

/// A kernel argument.
#[derive(Clone, Copy, Debug)]
pub enum Arg {
    I32(i32),
    U64(u64),
    F32(f32),
}

/// Equal when the bits are: a recorded launch replays only the very same arguments.
impl PartialEq for Arg {
    fn eq(&self, other: &Arg) -> bool {
        match (self, other) {
            (Arg::I32(a), Arg::I32(b)) => a == b,
            (Arg::U64(a), Arg::U64(b)) => a == b,
            (Arg::F32(a), Arg::F32(b)) => a.to_bits() == b.to_bits(),
            _ => false,
        }
    }
}

/// Device allocations freed together when the last owner lets go: the weights one backend
/// uploaded, read by it and by its siblings (`CudaBackend::sibling`) through one `Arc`.
pub(crate) struct SharedAllocs {
    ctx: Arc<CudaContext>,
    charge: Arc<DeviceCharge>,
    /// (pointer, bytes).
    ptrs: Vec<(u64, usize)>,
}

impl SharedAllocs {
    pub(crate) fn new(gpu: &Gpu) -> SharedAllocs {
        SharedAllocs {
            ctx: Arc::clone(&gpu.ctx),
            charge: Arc::clone(&gpu.charge),
            ptrs: Vec::new(),
        }
    }

    /// Takes `ptr` of `bytes` (from [`Gpu::alloc_raw`]) to free with the rest.
    pub(crate) fn own(&mut self, ptr: u64, bytes: usize) {
        self.ptrs.push((ptr, bytes));
    }

    pub(crate) fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
}

impl Drop for SharedAllocs {
    fn drop(&mut self) {
        // Every owner's `Gpu` synchronised its stream when it was dropped, before its
        // backend let go of this (field order), so no kernel reads these any more.
        if self.ptrs.is_empty() || self.ctx.bind_to_thread().is_err() {
            return;
        }
        for &(p, bytes) in &self.ptrs {
            unsafe {
                let _ = result::free_sync(p);
            }
            self.charge.give(bytes);
        }
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        let _ = self.sync();
        self.locked.release();
        if let Some(st) = self.staging.get_mut().take() {
            unsafe {
                let _ = result::free_host(st.ptr as *mut std::ffi::c_void);
            }
        }
        if let Some((st, _)) = self.up_staging.get_mut().take() {
            unsafe {
                let _ = result::free_host(st.ptr as *mut std::ffi::c_void);
            }
        }
        for &(p, bytes) in &self.allocs {
            unsafe {
                let _ = result::free_sync(p);
            }
            self.charge.give(bytes);
        }
    }
}

/// What a [`Gpu`] and its siblings hold on the device, and their budget (`usize::MAX`:
/// none). Atomic only to be shared through an `Arc`: one engine thread allocates.
pub(crate) struct DeviceCharge {
    used: AtomicUsize,
    limit: AtomicUsize,
}

impl Default for DeviceCharge {
    fn default() -> Self {
        DeviceCharge {
            used: AtomicUsize::new(0),
            limit: AtomicUsize::new(usize::MAX),
        }
    }
}

impl DeviceCharge {
    /// Charges `bytes`, or refuses them with the figures when the budget would be passed.
    fn take(&self, bytes: usize) -> DResult<()> {
        let (used, limit) = (
            self.used.load(Ordering::Relaxed),
            self.limit.load(Ordering::Relaxed),
        );
        if used.saturating_add(bytes) > limit {
            let mib = |b: usize| b as f64 / (1 << 20) as f64;
            return Err(format!(
                "device memory budget exceeded: {:.2} MiB asked + {:.2} MiB allocated > budget {:.2} MiB",
                mib(bytes),
                mib(used),
                mib(limit)
            ));
        }
        self.used.fetch_add(bytes, Ordering::Relaxed);
        Ok(())
    }

    fn give(&self, bytes: usize) {
        self.used.fetch_sub(bytes, Ordering::Relaxed);
    }
}
