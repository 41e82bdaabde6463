//! The real Metal device behind [`minfer_metal::Device`], on objc2-metal.
//!
//! Process-wide state ([`MetalDevice::shared`]): one device, one command queue and every
//! pipeline, built at start from the embedded `.metal` sources. Commands go into one pending
//! command buffer; [`Device::submit`] commits it with a completion handler, waits with a bound
//! ([`SUBMIT_TIMEOUT`]), requires `Completed`, and otherwise returns an error carrying the
//! dispatch-label ring. `MINFER_OP_PROFILE=1` prints host encode time per kernel and the GPU
//! wait per submit. While a trace is armed each span (`Device::begin_span`, one per node) is
//! encoders of its own whose start and end sample the GPU's timestamp counter (`timing.rs`).
//!
//! On Linux this crate only type-checks (scripts/metal-check); it runs on macOS
//! (scripts/mac-gate).

mod profile;
mod shared;
mod timing;

pub use shared::{SharedBuffer, SharedDevice};

use std::collections::{HashMap, VecDeque};
use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use block2::RcBlock;
use minfer_metal::device::check_page_aligned;
use minfer_metal::{source, Arg, Device, Dispatch, Error, Limits, Result};
use objc2::rc::Retained;
use objc2::runtime::ProtocolObject;
use objc2_foundation::{NSString, NSURL};
use objc2_metal::{
    MTLBarrierScope, MTLBlitCommandEncoder, MTLBlitPassDescriptor, MTLBuffer, MTLCommandBuffer,
    MTLCommandBufferStatus, MTLCommandEncoder, MTLCommandQueue, MTLComputeCommandEncoder,
    MTLComputePassDescriptor, MTLComputePipelineState, MTLCreateSystemDefaultDevice, MTLDevice,
    MTLLibrary, MTLResourceOptions, MTLSize,
};

use profile::Profile;
use timing::{CbSpans, Open, SpanClock};

/// Bound on one submit's wait (GPU safety rule 1: never wait forever).
pub const SUBMIT_TIMEOUT: Duration = Duration::from_secs(10);
const LABEL_RING: usize = 16;

type MtlBuffer = Retained<ProtocolObject<dyn MTLBuffer>>;
type Pipeline = Retained<ProtocolObject<dyn MTLComputePipelineState>>;

/// A shared-storage `MTLBuffer`.
#[derive(Clone)]
pub struct MetalBuffer(MtlBuffer);

enum Encoder {
    None,
    Compute(Retained<ProtocolObject<dyn MTLComputeCommandEncoder>>),
}

struct Pending {
    cb: Retained<ProtocolObject<dyn MTLCommandBuffer>>,
    enc: Encoder,
    /// Buffers used by this command buffer, kept alive until it completes.
    keep: Vec<MtlBuffer>,
    /// Its encoders that carry timestamp samples (a trace's node times).
    spans: CbSpans,
}

/// The Metal device.
pub struct MetalDevice {
    device: Retained<ProtocolObject<dyn MTLDevice>>,
    queue: Retained<ProtocolObject<dyn MTLCommandQueue>>,
    pipelines: HashMap<String, Pipeline>,
    limits: Limits,
    /// Where the kernel library came from (a metallib path or the embedded source).
    library_origin: String,
    pending: Mutex<Option<Pending>>,
    labels: Mutex<VecDeque<String>>,
    profile: Option<Mutex<Profile>>,
    /// The span clock, or why this device has none (then `span_clock` is None).
    clock: std::result::Result<SpanClock, String>,
    /// The span begun and not yet ended: new encoders carry its samples.
    open_span: Mutex<Option<Open>>,
    span_seq: AtomicU64,
}

struct Shared(MetalDevice);
// SAFETY: MTLDevice, MTLCommandQueue and MTLComputePipelineState are documented thread-safe;
// the pending command buffer and its encoder are only touched under the `pending` mutex.
unsafe impl Send for Shared {}
// SAFETY: as above.
unsafe impl Sync for Shared {}

static SHARED: OnceLock<std::result::Result<Shared, String>> = OnceLock::new();

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        16384
    }
}

fn unavailable(what: &str) -> Error {
    Error::Unavailable(what.to_string())
}

impl MetalDevice {
    /// The process-wide device, created (and every pipeline built) on first use.
    pub fn shared() -> Result<&'static MetalDevice> {
        match SHARED.get_or_init(|| MetalDevice::new().map(Shared).map_err(|e| e.to_string())) {
            Ok(s) => Ok(&s.0),
            Err(msg) => Err(Error::Unavailable(msg.clone())),
        }
    }

    fn new() -> Result<MetalDevice> {
        if std::env::var_os("MINFER_DISABLE_MPS").is_some() {
            return Err(unavailable("MINFER_DISABLE_MPS is set"));
        }
        let device =
            MTLCreateSystemDefaultDevice().ok_or_else(|| unavailable("no Metal device"))?;
        let queue = device
            .newCommandQueue()
            .ok_or_else(|| unavailable("newCommandQueue returned nil"))?;
        // The metallib build.rs made with xcrun, when it made one and it is still there;
        // otherwise the embedded sources, compiled now.
        let metallib = option_env!("MINFER_METALLIB").filter(|p| std::path::Path::new(p).is_file());
        let (library, origin) = match metallib {
            Some(path) => (
                device.newLibraryWithURL_error(&NSURL::fileURLWithPath(&NSString::from_str(path))),
                format!("metallib {path}"),
            ),
            None => (
                device.newLibraryWithSource_options_error(
                    &NSString::from_str(&source::library_source()),
                    None,
                ),
                "embedded source".to_string(),
            ),
        };
        let library = library.map_err(|e| {
            Error::Unavailable(format!(
                "kernel library from {origin}: {}",
                e.localizedDescription()
            ))
        })?;
        let mut pipelines = HashMap::new();
        let mut simd_width = u32::MAX;
        for name in source::kernel_names() {
            let f = library
                .newFunctionWithName(&NSString::from_str(&name))
                .ok_or_else(|| Error::UnknownKernel {
                    name: name.clone(),
                    device: "Metal library".into(),
                })?;
            let p = device
                .newComputePipelineStateWithFunction_error(&f)
                .map_err(|e| {
                    Error::Unavailable(format!("pipeline {name}: {}", e.localizedDescription()))
                })?;
            simd_width = simd_width.min(p.threadExecutionWidth() as u32);
            pipelines.insert(name, p);
        }
        let max_threads = device.maxThreadsPerThreadgroup();
        let limits = Limits {
            max_threads_per_threadgroup: max_threads.width.min(1024) as u32,
            max_threadgroup_memory: device.maxThreadgroupMemoryLength() as u64,
            simd_width,
            page_size: page_size(),
        };
        let profile = std::env::var("MINFER_OP_PROFILE")
            .is_ok_and(|v| v == "1")
            .then(|| Mutex::new(Profile::default()));
        let clock = SpanClock::new(&device);
        Ok(MetalDevice {
            device,
            queue,
            pipelines,
            limits,
            library_origin: origin,
            pending: Mutex::new(None),
            labels: Mutex::new(VecDeque::new()),
            profile,
            clock,
            open_span: Mutex::new(None),
            span_seq: AtomicU64::new(0),
        })
    }

    /// Why a trace's `metal` nodes carry no times on this device (no timestamp counters at
    /// stage boundaries); None when they do.
    pub fn span_clock_unavailable(&self) -> Option<&str> {
        self.clock.as_ref().err().map(String::as_str)
    }

    /// The span new encoders belong to, when one is open and the device times spans.
    fn open_span(&self) -> Result<Option<(&SpanClock, Open)>> {
        let Ok(clock) = &self.clock else {
            return Ok(None);
        };
        let open = *self
            .open_span
            .lock()
            .map_err(|_| unavailable("open span lock poisoned"))?;
        Ok(open.map(|o| (clock, o)))
    }

    /// Ends the open encoder and sets the open span (a span's work is whole encoders).
    fn set_span(&self, open: Option<Open>) -> Result<()> {
        let mut guard = self.lock_pending()?;
        if let Some(p) = guard.as_mut() {
            end_encoder(p);
        }
        *self
            .open_span
            .lock()
            .map_err(|_| unavailable("open span lock poisoned"))? = open;
        Ok(())
    }

    fn lock_pending(&self) -> Result<std::sync::MutexGuard<'_, Option<Pending>>> {
        self.pending
            .lock()
            .map_err(|_| unavailable("pending command buffer lock poisoned"))
    }

    fn pending<'a>(&self, guard: &'a mut Option<Pending>) -> Result<&'a mut Pending> {
        if guard.is_none() {
            let cb = self
                .queue
                .commandBuffer()
                .ok_or_else(|| unavailable("commandBuffer returned nil"))?;
            *guard = Some(Pending {
                cb,
                enc: Encoder::None,
                keep: Vec::new(),
                spans: CbSpans::default(),
            });
        }
        guard
            .as_mut()
            .ok_or_else(|| unavailable("no command buffer"))
    }

    fn push_label(&self, label: String) {
        if let Ok(mut l) = self.labels.lock() {
            if l.len() == LABEL_RING {
                l.pop_front();
            }
            l.push_back(label);
        }
    }

    fn recent_labels(&self) -> Vec<String> {
        self.labels
            .lock()
            .map(|l| l.iter().cloned().collect())
            .unwrap_or_default()
    }
}

fn end_encoder(p: &mut Pending) {
    if let Encoder::Compute(enc) = std::mem::replace(&mut p.enc, Encoder::None) {
        enc.endEncoding();
    }
}

impl Drop for MetalDevice {
    fn drop(&mut self) {
        // never leave an unterminated encoder behind
        let _ = self.submit();
        if let Some(p) = &self.profile {
            if let Ok(p) = p.lock() {
                p.print();
            }
        }
    }
}

impl Device for MetalDevice {
    type Buffer = MetalBuffer;
    type Pipeline = Pipeline;

    fn name(&self) -> String {
        format!("Metal ({}, {})", self.device.name(), self.library_origin)
    }

    fn limits(&self) -> &Limits {
        &self.limits
    }

    /// What Metal recommends this process keep resident on the device, less what it already
    /// holds (unified memory: the figure layer offload fits its blocks into).
    fn free_memory(&self) -> std::result::Result<usize, String> {
        let max = self.device.recommendedMaxWorkingSetSize();
        let used = self.device.currentAllocatedSize() as u64;
        if max == 0 {
            return Err("recommendedMaxWorkingSetSize is 0".into());
        }
        Ok(max.saturating_sub(used) as usize)
    }

    fn new_buffer(&self, len: usize) -> Result<MetalBuffer> {
        self.device
            .newBufferWithLength_options(len.max(16), MTLResourceOptions::StorageModeShared)
            .map(MetalBuffer)
            .ok_or_else(|| Error::Unavailable(format!("newBufferWithLength({len}) returned nil")))
    }

    unsafe fn wrap_host(&self, ptr: *mut u8, len: usize) -> Result<MetalBuffer> {
        check_page_aligned(ptr, self.limits.page_size)?;
        let ptr =
            NonNull::new(ptr.cast::<c_void>()).ok_or_else(|| unavailable("null host pointer"))?;
        // Apple requires the wrapped length to be whole pages; the mapping behind a page-aligned
        // mmap base covers the rounded-up length.
        let len = len.div_ceil(self.limits.page_size) * self.limits.page_size;
        // SAFETY: the caller guarantees ptr..ptr+len stays mapped while the buffer lives; no
        // deallocator, the mapping's owner unmaps it.
        unsafe {
            self.device
                .newBufferWithBytesNoCopy_length_options_deallocator(
                    ptr,
                    len,
                    MTLResourceOptions::StorageModeShared,
                    None,
                )
        }
        .map(MetalBuffer)
        .ok_or_else(|| Error::Unavailable(format!("newBufferWithBytesNoCopy({len}) returned nil")))
    }

    fn buffer_len(&self, buf: &MetalBuffer) -> usize {
        buf.0.length()
    }

    fn contents(&self, buf: &MetalBuffer) -> *mut u8 {
        buf.0.contents().as_ptr().cast()
    }

    fn pipeline(&self, name: &str) -> Result<Pipeline> {
        self.pipelines
            .get(name)
            .cloned()
            .ok_or_else(|| Error::UnknownKernel {
                name: name.to_string(),
                device: self.name(),
            })
    }

    fn dispatch(&self, pipeline: &Pipeline, d: &Dispatch<'_, MetalBuffer>) -> Result<()> {
        let started = Instant::now();
        let threads: u64 = d.threadgroup.iter().map(|&v| v as u64).product();
        let max = pipeline.maxTotalThreadsPerThreadgroup() as u64;
        if threads > max {
            return Err(Error::Limit {
                what: "threads per threadgroup for this pipeline",
                requested: threads,
                limit: max,
            });
        }
        let mem = pipeline.staticThreadgroupMemoryLength() as u64
            + d.threadgroup_memory.iter().sum::<u64>();
        if mem > self.limits.max_threadgroup_memory {
            return Err(Error::Limit {
                what: "threadgroup memory bytes (static + dynamic)",
                requested: mem,
                limit: self.limits.max_threadgroup_memory,
            });
        }
        let mut guard = self.lock_pending()?;
        let p = self.pending(&mut guard)?;
        if matches!(p.enc, Encoder::None) {
            let enc = match self.open_span()? {
                // A span's encoder samples the timestamp counter at its start and end.
                Some((clock, open)) => {
                    let (buf, start, end) = p.spans.slot(clock, &self.device, open)?;
                    let desc = MTLComputePassDescriptor::computePassDescriptor();
                    // SAFETY: attachment 0 always exists; both indices lie in the buffer.
                    unsafe {
                        let att = desc.sampleBufferAttachments().objectAtIndexedSubscript(0);
                        att.setSampleBuffer(Some(&buf));
                        att.setStartOfEncoderSampleIndex(start);
                        att.setEndOfEncoderSampleIndex(end);
                    }
                    p.cb.computeCommandEncoderWithDescriptor(&desc)
                }
                None => p.cb.computeCommandEncoder(),
            }
            .ok_or_else(|| unavailable("computeCommandEncoder returned nil"))?;
            p.enc = Encoder::Compute(enc);
        }
        let Encoder::Compute(enc) = &p.enc else {
            return Err(unavailable("no compute encoder"));
        };
        enc.setComputePipelineState(pipeline);
        for (i, a) in d.args.iter().enumerate() {
            match a {
                Arg::Buffer(b, off) => {
                    // SAFETY: the buffer is kept alive in `keep` until the command buffer
                    // completes; the launch fns checked offsets against its length.
                    unsafe { enc.setBuffer_offset_atIndex(Some(&b.0), *off as usize, i) };
                    p.keep.push(b.0.clone());
                }
                Arg::Bytes(bytes) => {
                    let ptr = NonNull::new(bytes.as_ptr() as *mut c_void)
                        .ok_or_else(|| unavailable("null bytes argument"))?;
                    // SAFETY: Metal copies the bytes during the call.
                    unsafe { enc.setBytes_length_atIndex(ptr, bytes.len(), i) };
                }
            }
        }
        for (i, &len) in d.threadgroup_memory.iter().enumerate() {
            // SAFETY: the total was checked against the device limit above.
            unsafe { enc.setThreadgroupMemoryLength_atIndex(len as usize, i) };
        }
        let size = |v: [u32; 3]| MTLSize {
            width: v[0] as usize,
            height: v[1] as usize,
            depth: v[2] as usize,
        };
        enc.dispatchThreadgroups_threadsPerThreadgroup(size(d.grid), size(d.threadgroup));
        drop(guard);
        self.push_label(d.label.to_string());
        if let Some(prof) = &self.profile {
            if let Ok(mut prof) = prof.lock() {
                prof.encode(d.label, started.elapsed());
            }
        }
        Ok(())
    }

    fn barrier(&self) -> Result<()> {
        let guard = self.lock_pending()?;
        if let Some(Pending {
            enc: Encoder::Compute(enc),
            ..
        }) = guard.as_ref()
        {
            enc.memoryBarrierWithScope(MTLBarrierScope::Buffers);
        }
        Ok(())
    }

    fn copy_rows(
        &self,
        src: &MetalBuffer,
        dst: &MetalBuffer,
        row_bytes: u64,
        src_row: u64,
        dst_row: u64,
        n_rows: u64,
    ) -> Result<()> {
        for (b, row) in [(src, src_row), (dst, dst_row)] {
            let end = (row + n_rows) * row_bytes;
            if end > b.0.length() as u64 {
                return Err(Error::OutOfRange {
                    offset: row * row_bytes,
                    len: n_rows * row_bytes,
                    size: b.0.length() as u64,
                });
            }
        }
        let mut guard = self.lock_pending()?;
        let p = self.pending(&mut guard)?;
        end_encoder(p);
        let blit = match self.open_span()? {
            // A blit inside a span (a cell-op's row move) is part of the node's time.
            Some((clock, open)) => {
                let (buf, start, end) = p.spans.slot(clock, &self.device, open)?;
                let desc = MTLBlitPassDescriptor::blitPassDescriptor();
                // SAFETY: attachment 0 always exists; both indices lie in the buffer.
                unsafe {
                    let att = desc.sampleBufferAttachments().objectAtIndexedSubscript(0);
                    att.setSampleBuffer(Some(&buf));
                    att.setStartOfEncoderSampleIndex(start);
                    att.setEndOfEncoderSampleIndex(end);
                }
                p.cb.blitCommandEncoderWithDescriptor(&desc)
            }
            None => p.cb.blitCommandEncoder(),
        }
        .ok_or_else(|| unavailable("blitCommandEncoder returned nil"))?;
        // An overlapping same-buffer bulk copy is undefined: copy row by row, ascending when
        // the rows move down, descending when they move up.
        let rows: Box<dyn Iterator<Item = u64>> = if dst_row <= src_row {
            Box::new(0..n_rows)
        } else {
            Box::new((0..n_rows).rev())
        };
        for r in rows {
            // SAFETY: ranges checked above; both buffers are kept alive below.
            unsafe {
                blit.copyFromBuffer_sourceOffset_toBuffer_destinationOffset_size(
                    &src.0,
                    ((src_row + r) * row_bytes) as usize,
                    &dst.0,
                    ((dst_row + r) * row_bytes) as usize,
                    row_bytes as usize,
                )
            };
        }
        blit.endEncoding();
        p.keep.push(src.0.clone());
        p.keep.push(dst.0.clone());
        drop(guard);
        self.push_label("copy_rows".into());
        Ok(())
    }

    fn submit(&self) -> Result<()> {
        let Some(mut p) = self.lock_pending()?.take() else {
            return Ok(());
        };
        end_encoder(&mut p);
        let done = Arc::new((Mutex::new(false), Condvar::new()));
        let signal = Arc::clone(&done);
        let handler = RcBlock::new(move |_cb: NonNull<ProtocolObject<dyn MTLCommandBuffer>>| {
            let (lock, cv) = &*signal;
            if let Ok(mut d) = lock.lock() {
                *d = true;
            }
            cv.notify_all();
        });
        // SAFETY: the block is retained by the command buffer for as long as it needs it.
        unsafe { p.cb.addCompletedHandler(RcBlock::as_ptr(&handler)) };
        let started = Instant::now();
        p.cb.commit();
        let (lock, cv) = &*done;
        let guard = lock
            .lock()
            .map_err(|_| unavailable("completion lock poisoned"))?;
        let (guard, timeout) = cv
            .wait_timeout_while(guard, SUBMIT_TIMEOUT, |d| !*d)
            .map_err(|_| unavailable("completion lock poisoned"))?;
        let completed = *guard;
        drop(guard);
        if let Some(prof) = &self.profile {
            if let Ok(mut prof) = prof.lock() {
                prof.submit(started.elapsed());
            }
        }
        if !completed || timeout.timed_out() {
            // The GPU may still write its samples: those sample buffers are not reused.
            return Err(Error::Submit {
                reason: format!("no completion within {SUBMIT_TIMEOUT:?}"),
                labels: self.recent_labels(),
            });
        }
        let status = p.cb.status();
        let spans = std::mem::take(&mut p.spans);
        if status != MTLCommandBufferStatus::Completed {
            if let Ok(clock) = &self.clock {
                spans.recycle(clock);
            }
            let detail =
                p.cb.error()
                    .map(|e| e.localizedDescription().to_string())
                    .unwrap_or_default();
            return Err(Error::Submit {
                reason: format!("command buffer status {} {detail}", status.0),
                labels: self.recent_labels(),
            });
        }
        match &self.clock {
            Ok(clock) => spans.resolve(clock, &self.device),
            Err(_) => Ok(()),
        }
    }

    fn begin_span(&self, tag: u32) -> Result<()> {
        let seq = self.span_seq.fetch_add(1, Ordering::Relaxed);
        self.set_span(Some(Open { tag, seq }))
    }

    fn end_span(&self) -> Result<()> {
        self.set_span(None)
    }

    fn take_spans(&self) -> Vec<(u32, u64)> {
        match &self.clock {
            Ok(clock) => clock.take(),
            Err(_) => Vec::new(),
        }
    }

    fn span_clock(&self) -> Option<&'static str> {
        self.clock.as_ref().ok().map(|_| timing::SPAN_CLOCK)
    }
}
