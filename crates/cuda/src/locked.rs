//! The model's mapped parts page-locked in place (`cuMemHostRegister`, read-only), so the
//! streamed blocks' weights (ADR 0014) cross the link by the device's DMA straight from the
//! mapping: no host thread copies them into staging, and the copy is queued on the stream
//! like a kernel. Each part is locked once, at its first streamed weight, and unlocked when
//! the device goes (the mapping outlives every backend: crates/engine/src/runner.rs).

use std::cell::RefCell;

use cudarc::driver::sys;

const PAGE: usize = 4096;

/// Per part (its base address): whether it is locked (false: the driver refused, and the
/// weights go through staging), and whether by this device (which then unlocks it).
#[derive(Default)]
pub(crate) struct LockedParts {
    parts: RefCell<Vec<(usize, bool, bool)>>,
}

impl LockedParts {
    /// Whether `part` (a whole mapped part, page-aligned base) is page-locked for the
    /// device, locking it on first sight. The context must be current.
    pub fn lock(&self, part: &[u8]) -> bool {
        let base = part.as_ptr() as usize;
        if let Some(&(_, ok, _)) = self.parts.borrow().iter().find(|p| p.0 == base) {
            return ok;
        }
        // The mapping covers whole pages: the last partial page is mapped too.
        let len = part.len().next_multiple_of(PAGE);
        let (ok, ours) = if !base.is_multiple_of(PAGE) {
            (false, false)
        } else {
            // SAFETY: [base, base + len) is mapped readable for as long as the model lives,
            // which is longer than this device; read-only registration never writes it.
            let r = unsafe {
                sys::cuMemHostRegister_v2(
                    base as *mut std::ffi::c_void,
                    len,
                    sys::CU_MEMHOSTREGISTER_READ_ONLY,
                )
            };
            match r {
                sys::CUresult::CUDA_SUCCESS => (true, true),
                // A sibling on the same context locked it first: the DMA works as well.
                sys::CUresult::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED => (true, false),
                e => {
                    tracing::info!(
                        "cuda: the model's mapping ({:.1} MiB) could not be page-locked ({e:?}): \
                         streamed weights go through staging",
                        len as f64 / (1u64 << 20) as f64
                    );
                    (false, false)
                }
            }
        };
        self.parts.borrow_mut().push((base, ok, ours));
        ok
    }

    /// Unlocks every part this device locked (the context current).
    pub fn release(&self) {
        for (base, _, ours) in self.parts.borrow_mut().drain(..) {
            if ours {
                // SAFETY: `base` was registered by this device's `lock` and not since.
                unsafe {
                    let _ = sys::cuMemHostUnregister(base as *mut std::ffi::c_void);
                }
            }
        }
    }
}
