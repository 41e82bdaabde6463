//! The spans of the model's mapping that hold the streamed blocks' weights (ADR 0014),
//! page-locked in place (`cuMemHostRegister`, read-only), so those weights cross the link by
//! the device's DMA straight from the mapping: no host thread copies them into staging, and
//! the copy is queued on the stream like a kernel. Locked once, when the engine names the
//! weights the device will stream (`Memory::prepare_streamed`), only the span they lie in
//! (not the blocks the device holds, nor the embedding), and unlocked when the device goes
//! (the mapping outlives every backend: crates/engine/src/runner.rs).

use std::cell::RefCell;

use cudarc::driver::sys;

const PAGE: usize = 4096;

/// Locked spans: (first byte, length, whether this device locked it and so unlocks it).
#[derive(Default)]
pub(crate) struct LockedSpans {
    spans: RefCell<Vec<(usize, usize, bool)>>,
}

impl LockedSpans {
    /// Page-locks the whole pages holding `span` (which lies in a mapping of whole pages).
    /// Whether it is locked now (false: the driver refused; the copies then go through
    /// staging). The context must be current.
    pub fn lock(&self, span: &[u8]) -> bool {
        if span.is_empty() {
            return false;
        }
        let start = span.as_ptr() as usize / PAGE * PAGE;
        let len = (span.as_ptr() as usize + span.len()).next_multiple_of(PAGE) - start;
        if self.covers_range(start, len) {
            return true;
        }
        // SAFETY: [start, start + len) is whole mapped pages (the mapping covers the pages
        // of its last byte) readable for as long as the model lives, which is longer than
        // this device; read-only registration never writes them.
        let r = unsafe {
            sys::cuMemHostRegister_v2(
                start as *mut std::ffi::c_void,
                len,
                sys::CU_MEMHOSTREGISTER_READ_ONLY,
            )
        };
        let (ok, ours) = match r {
            sys::CUresult::CUDA_SUCCESS => (true, true),
            // Another backend on the same context (a self-draft's sibling) locked it first.
            sys::CUresult::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED => (true, false),
            e => {
                tracing::info!(
                    "cuda: {:.1} MiB of the model's mapping could not be page-locked ({e:?}): \
                     streamed weights go through staging",
                    len as f64 / (1u64 << 20) as f64
                );
                (false, false)
            }
        };
        if ok {
            self.spans.borrow_mut().push((start, len, ours));
        }
        ok
    }

    /// Whether `data` lies in one locked span.
    pub fn covers(&self, data: &[u8]) -> bool {
        self.covers_range(data.as_ptr() as usize, data.len())
    }

    fn covers_range(&self, at: usize, len: usize) -> bool {
        self.spans
            .borrow()
            .iter()
            .any(|&(s, l, _)| s <= at && at + len <= s + l)
    }

    /// The same spans for a backend on the same context (a sibling), which never unlocks
    /// them.
    pub fn shared(&self) -> LockedSpans {
        let spans = self
            .spans
            .borrow()
            .iter()
            .map(|&(s, l, _)| (s, l, false))
            .collect();
        LockedSpans {
            spans: RefCell::new(spans),
        }
    }

    /// Unlocks every span this device locked (the context current).
    pub fn release(&self) {
        for (start, _, ours) in self.spans.borrow_mut().drain(..) {
            if ours {
                // SAFETY: `start` was registered by this device's `lock` and not since.
                unsafe {
                    let _ = sys::cuMemHostUnregister(start as *mut std::ffi::c_void);
                }
            }
        }
    }
}
