//! [`SharedDevice`]: the process-wide [`MetalDevice`] as an owned, `Send` device for the
//! graph executor (`minfer_metal::MetalBackend<SharedDevice>`), which the engine keeps in a
//! `Box<dyn Backend + Send>`.

use minfer_metal::{Device, Dispatch, Limits, Result};

use crate::{MetalBuffer, MetalDevice};

/// The shared device; every call forwards to [`MetalDevice::shared`]'s instance.
#[derive(Clone, Copy)]
pub struct SharedDevice(&'static MetalDevice);

// SAFETY: the device, queue and pipelines are documented thread-safe Metal objects, and the
// pending command buffer lives behind the device's own mutex (see `Shared` in lib.rs); the
// executor drives one device from one thread at a time.
unsafe impl Send for SharedDevice {}

/// A buffer of the shared device.
#[derive(Clone)]
pub struct SharedBuffer(MetalBuffer);

// SAFETY: an MTLBuffer is a thread-safe Metal object; shared-storage contents are only
// touched by the host between submits, by the thread that owns the executor.
unsafe impl Send for SharedBuffer {}

impl SharedDevice {
    /// The process-wide device (created on first use).
    pub fn get() -> Result<SharedDevice> {
        MetalDevice::shared().map(SharedDevice)
    }
}

impl Device for SharedDevice {
    type Buffer = SharedBuffer;
    type Pipeline = <MetalDevice as Device>::Pipeline;

    fn name(&self) -> String {
        self.0.name()
    }
    fn limits(&self) -> &Limits {
        self.0.limits()
    }
    fn free_memory(&self) -> std::result::Result<usize, String> {
        self.0.free_memory()
    }
    /// The process's one device again: its memory, pipelines and queue are the same, and a
    /// backend submits its pending work at the end of each split, so two backends on it (a
    /// self-draft's sibling, as two engines' backends already are) never interleave encoding.
    fn sibling(&self) -> Option<SharedDevice> {
        Some(SharedDevice(self.0))
    }
    fn new_buffer(&self, len: usize) -> Result<SharedBuffer> {
        self.0.new_buffer(len).map(SharedBuffer)
    }
    unsafe fn wrap_host(&self, ptr: *mut u8, len: usize) -> Result<SharedBuffer> {
        // SAFETY: forwarded to the caller's contract.
        unsafe { self.0.wrap_host(ptr, len) }.map(SharedBuffer)
    }
    fn buffer_len(&self, buf: &SharedBuffer) -> usize {
        self.0.buffer_len(&buf.0)
    }
    fn contents(&self, buf: &SharedBuffer) -> *mut u8 {
        self.0.contents(&buf.0)
    }
    fn pipeline(&self, name: &str) -> Result<Self::Pipeline> {
        self.0.pipeline(name)
    }
    fn dispatch(&self, pipeline: &Self::Pipeline, d: &Dispatch<'_, SharedBuffer>) -> Result<()> {
        let args: Vec<minfer_metal::Arg<'_, MetalBuffer>> = d
            .args
            .iter()
            .map(|a| match a {
                minfer_metal::Arg::Buffer(b, off) => minfer_metal::Arg::Buffer(&b.0, *off),
                minfer_metal::Arg::Bytes(v) => minfer_metal::Arg::Bytes(v),
            })
            .collect();
        self.0.dispatch(
            pipeline,
            &Dispatch {
                label: d.label,
                grid: d.grid,
                threadgroup: d.threadgroup,
                args: &args,
                threadgroup_memory: d.threadgroup_memory,
            },
        )
    }
    fn barrier(&self) -> Result<()> {
        self.0.barrier()
    }
    fn copy_rows(
        &self,
        src: &SharedBuffer,
        dst: &SharedBuffer,
        row_bytes: u64,
        src_row: u64,
        dst_row: u64,
        n_rows: u64,
    ) -> Result<()> {
        self.0
            .copy_rows(&src.0, &dst.0, row_bytes, src_row, dst_row, n_rows)
    }
    fn submit(&self) -> Result<()> {
        self.0.submit()
    }
    fn begin_span(&self, tag: u32) -> Result<()> {
        self.0.begin_span(tag)
    }
    fn end_span(&self) -> Result<()> {
        self.0.end_span()
    }
    fn take_spans(&self) -> Vec<(u32, u64)> {
        self.0.take_spans()
    }
    fn span_clock(&self) -> Option<&'static str> {
        self.0.span_clock()
    }
}
