//! What the executor needs from a Metal device, and nothing more.
//!
//! Two implementations exist: the objc2-metal device (crate `minfer-metal-objc`, macOS) and the
//! MSL emulator (crate `minfer-msl-emu`, Linux, used by CI). Both run the same `kernels/*.metal`.
//! Commands are recorded in order and run at [`Device::submit`]; host views of a buffer are
//! only meaningful after the submit that produced them returned `Ok`.

use crate::error::{Error, Result};

/// Limits queried from the device at start; kernels and launch fns check against these,
/// never against constants (GPU safety rule 3).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// `maxThreadsPerThreadgroup` (the smallest of the three axes is what we use).
    pub max_threads_per_threadgroup: u32,
    /// `maxThreadgroupMemoryLength`, bytes.
    pub max_threadgroup_memory: u64,
    /// Lanes per simdgroup (`threadExecutionWidth`); the kernels require 32.
    pub simd_width: u32,
    /// Page size a zero-copy host wrap must be aligned to.
    pub page_size: usize,
}

/// One kernel argument, bound at `[[buffer(i)]]` where `i` is its position in the list.
pub enum Arg<'a, B> {
    /// A device buffer at a byte offset (weights use the offset of the tensor inside a
    /// wrapped GGUF part).
    Buffer(&'a B, u64),
    /// Small constant bytes (`setBytes`), e.g. a `#[repr(C)]` params struct.
    Bytes(&'a [u8]),
}

/// A compute dispatch: `grid` threadgroups of `threadgroup` threads each.
pub struct Dispatch<'a, B> {
    /// Label kept in the submit-failure ring.
    pub label: &'a str,
    pub grid: [u32; 3],
    pub threadgroup: [u32; 3],
    pub args: &'a [Arg<'a, B>],
    /// Byte lengths of the dynamic `[[threadgroup(i)]]` buffers, index = position.
    pub threadgroup_memory: &'a [u64],
}

/// A Metal device as the executor sees it.
pub trait Device {
    /// A shared-storage buffer: host and device see the same memory.
    type Buffer;
    /// A compute pipeline, looked up by kernel name.
    type Pipeline;

    /// Human-readable device name, used in errors.
    fn name(&self) -> String;
    /// Limits queried from the device.
    fn limits(&self) -> &Limits;
    /// Bytes the device can still give this process (layer offload's budget when no
    /// `--gpu-mem` is given); `Err(reason)` when it cannot say. Default: it cannot.
    fn free_memory(&self) -> std::result::Result<usize, String> {
        Err(format!("{} does not report its free memory", self.name()))
    }
    /// Another handle on this device for a second backend (a self-draft's, issue 31): the
    /// same memory (every buffer of either is valid on both) and the same compiled
    /// pipelines, with command state of its own. None: this device cannot make one (the
    /// backend then refuses a sibling by name). Default: None.
    fn sibling(&self) -> Option<Self>
    where
        Self: Sized,
    {
        None
    }
    /// A new zero-initialised shared buffer of `len` bytes.
    fn new_buffer(&self, len: usize) -> Result<Self::Buffer>;
    /// Wraps host memory without copying (a page-aligned mmap'd GGUF part).
    ///
    /// # Safety
    /// `ptr..ptr+len` must stay valid and unmodified by others while the buffer or any
    /// command using it lives.
    unsafe fn wrap_host(&self, ptr: *mut u8, len: usize) -> Result<Self::Buffer>;
    /// Byte length of a buffer.
    fn buffer_len(&self, buf: &Self::Buffer) -> usize;
    /// Host pointer to the buffer's first byte.
    fn contents(&self, buf: &Self::Buffer) -> *mut u8;
    /// The pipeline for kernel `name`; `Err(UnknownKernel)` when the library lacks it.
    fn pipeline(&self, name: &str) -> Result<Self::Pipeline>;
    /// Encodes one dispatch into the pending command buffer.
    fn dispatch(&self, pipeline: &Self::Pipeline, d: &Dispatch<'_, Self::Buffer>) -> Result<()>;
    /// A buffer-scope memory barrier: later dispatches see earlier writes.
    fn barrier(&self) -> Result<()>;
    /// Copies `n_rows` rows of `row_bytes` from `src` row `src_row` to `dst` row `dst_row`,
    /// row by row in the order that is safe when the ranges overlap in one buffer.
    fn copy_rows(
        &self,
        src: &Self::Buffer,
        dst: &Self::Buffer,
        row_bytes: u64,
        src_row: u64,
        dst_row: u64,
        n_rows: u64,
    ) -> Result<()>;
    /// Commits the pending commands, waits with a bound, checks the status; an error carries
    /// the labels of the most recent dispatches.
    fn submit(&self) -> Result<()>;

    /// Starts a timed span `tag` (a trace's node) in the pending commands: the work encoded
    /// from here to [`Device::end_span`] is timed when it runs. Only called while a trace is
    /// armed and [`Device::span_clock`] is some; default: ignored.
    fn begin_span(&self, _tag: u32) -> Result<()> {
        Ok(())
    }
    /// Ends the span [`Device::begin_span`] started (work encoded after it is not the span's).
    fn end_span(&self) -> Result<()> {
        Ok(())
    }
    /// The spans that held work, of the submits that completed since the last take: (tag,
    /// nanoseconds) in command order. Default: none.
    fn take_spans(&self) -> Vec<(u32, u64)> {
        Vec::new()
    }
    /// What a span's time measures, a phrase a trace carries; None (the default): the
    /// device does not time spans.
    fn span_clock(&self) -> Option<&'static str> {
        None
    }

    /// Copies `data` into `buf` at `offset` (host side; do it before the commands that read it).
    fn write_bytes(&self, buf: &Self::Buffer, offset: usize, data: &[u8]) -> Result<()> {
        check_range(self.buffer_len(buf), offset, data.len())?;
        // SAFETY: the range was checked against the buffer length; shared storage is host
        // visible and no command runs between submits.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.contents(buf).add(offset), data.len())
        };
        Ok(())
    }

    /// Copies bytes out of `buf` at `offset` into `out` (after the producing submit).
    fn read_bytes(&self, buf: &Self::Buffer, offset: usize, out: &mut [u8]) -> Result<()> {
        check_range(self.buffer_len(buf), offset, out.len())?;
        // SAFETY: as in `write_bytes`.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.contents(buf).add(offset),
                out.as_mut_ptr(),
                out.len(),
            )
        };
        Ok(())
    }

    /// A new buffer holding `data`.
    fn buffer_from(&self, data: &[u8]) -> Result<Self::Buffer> {
        let buf = self.new_buffer(data.len().max(4))?;
        self.write_bytes(&buf, 0, data)?;
        Ok(buf)
    }
}

fn check_range(size: usize, offset: usize, len: usize) -> Result<()> {
    if offset.checked_add(len).is_none_or(|end| end > size) {
        return Err(Error::OutOfRange {
            offset: offset as u64,
            len: len as u64,
            size: size as u64,
        });
    }
    Ok(())
}

/// Checks a zero-copy wrap request against the page size (shared by both devices).
pub fn check_page_aligned(ptr: *const u8, page: usize) -> Result<()> {
    if !(ptr as usize).is_multiple_of(page) {
        return Err(Error::Unaligned {
            addr: ptr as usize,
            page,
        });
    }
    Ok(())
}

/// Bytes of a `#[repr(C)]` params struct, for [`Arg::Bytes`].
pub fn as_bytes<T: crate::params::Params>(p: &T) -> &[u8] {
    // SAFETY: `Params` is only implemented for `#[repr(C)]` structs of u32/i32/f32 fields
    // with no padding, so every byte is initialised.
    unsafe { std::slice::from_raw_parts((p as *const T).cast::<u8>(), std::mem::size_of::<T>()) }
}
