//! [`HugeBytes`]: an owned byte buffer the kernels stream, in 2 MiB pages where the kernel
//! gives them (`madvise(MADV_HUGEPAGE)` on Linux, which honours it under THP's default
//! `madvise` mode).
//!
//! Why: a decode step streams every weight once; on the Zen 4 development machine a packed
//! Q4_K group stream in 4 KiB pages ran at 9-10 GB/s, in 2 MiB pages at 21-25 GB/s (the
//! hardware prefetchers follow it; docs/PERFORMANCE.md).

use std::alloc::{self, Layout};
use std::ptr::NonNull;

/// A huge page (the alignment of buffers of at least this size).
const HUGE: usize = 2 << 20;

/// A zero-initialised byte buffer owned by this value: on Linux an anonymous mapping whose
/// start is 2 MiB-aligned and advised into huge pages (zero pages from the kernel, touched
/// only when written: no zeroing pass of ours, which cost a packed model's load a pass over
/// its bytes), elsewhere a 64-byte aligned heap allocation.
pub struct HugeBytes {
    ptr: NonNull<u8>,
    len: usize,
    backing: Backing,
}

enum Backing {
    #[cfg(target_os = "linux")]
    Mapped {
        base: *mut u8,
        size: usize,
    },
    Heap(Layout),
}

// SAFETY: HugeBytes owns its memory exclusively, like a Vec<u8>.
unsafe impl Send for HugeBytes {}
// SAFETY: shared access only reads, like &[u8].
unsafe impl Sync for HugeBytes {}

impl HugeBytes {
    /// `len` zero bytes.
    pub fn zeroed(len: usize) -> HugeBytes {
        #[cfg(target_os = "linux")]
        if len >= HUGE {
            if let Some(b) = Self::mapped(len) {
                return b;
            }
        }
        let layout = Layout::from_size_align(len.max(1), 64).expect("a valid buffer layout");
        // SAFETY: `layout` has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            alloc::handle_alloc_error(layout)
        };
        HugeBytes {
            ptr,
            len,
            backing: Backing::Heap(layout),
        }
    }

    /// An anonymous mapping of `len` bytes (rounded up to whole 4 KiB pages) starting at a
    /// 2 MiB boundary, advised into huge pages; None if the kernel refuses the mapping.
    #[cfg(target_os = "linux")]
    fn mapped(len: usize) -> Option<HugeBytes> {
        let size = len.next_multiple_of(4096);
        let span = size + HUGE;
        // SAFETY: a fresh private anonymous mapping; nothing else refers to it.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                span,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return None;
        }
        let raw = raw.cast::<u8>();
        let head = (raw as usize).next_multiple_of(HUGE) - raw as usize;
        // SAFETY: both trimmed ranges lie inside the mapping just made, page-aligned; the
        // madvise range is what stays mapped.
        unsafe {
            if head > 0 {
                libc::munmap(raw.cast(), head);
            }
            let tail = span - head - size;
            if tail > 0 {
                libc::munmap(raw.add(head + size).cast(), tail);
            }
            // Before the first touch, so the pages fault in huge. A hint: where it fails the
            // buffer is still correct, in small pages.
            libc::madvise(raw.add(head).cast(), size, libc::MADV_HUGEPAGE);
        }
        // SAFETY: head < span, inside the mapping.
        let base = unsafe { raw.add(head) };
        Some(HugeBytes {
            ptr: NonNull::new(base)?,
            len,
            backing: Backing::Mapped { base, size },
        })
    }
}

/// Whether buffers of [`HugeBytes`] get 2 MiB pages here: Linux with transparent huge pages
/// enabled (`always` or `madvise`). Elsewhere the packed layouts, whose kernels stream in
/// huge pages, are not made.
pub fn huge_pages_available() -> bool {
    #[cfg(target_os = "linux")]
    {
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .is_ok_and(|s| !s.contains("[never]"))
    }
    #[cfg(not(target_os = "linux"))]
    false
}

/// Drops this process's resident pages of `bytes` (the whole pages inside it), which must lie
/// in a read-only file mapping: the next read faults them back in from the file, so nothing
/// changes but the resident set. (`MADV_DONTNEED` on anonymous memory would zero it: callers
/// pass only bytes their weight source reports as mapped from a file.)
pub fn release_mapped(bytes: &[u8]) {
    #[cfg(target_os = "linux")]
    {
        const PAGE: usize = 4096;
        let start = (bytes.as_ptr() as usize).next_multiple_of(PAGE);
        let end = (bytes.as_ptr() as usize + bytes.len()) / PAGE * PAGE;
        if end > start {
            // SAFETY: a hint on whole pages of a file mapping the caller names; see above.
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = bytes;
}

impl Drop for HugeBytes {
    fn drop(&mut self) {
        match self.backing {
            #[cfg(target_os = "linux")]
            // SAFETY: the mapping made in `mapped`, unmapped once.
            Backing::Mapped { base, size } => unsafe {
                libc::munmap(base.cast(), size);
            },
            // SAFETY: allocated in `zeroed` with this layout.
            Backing::Heap(layout) => unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) },
        }
    }
}

impl std::ops::Deref for HugeBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `len` initialised bytes at `ptr`, owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for HugeBytes {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` makes this the only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl std::fmt::Debug for HugeBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HugeBytes({} bytes)", self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::HugeBytes;

    #[test]
    fn buffers_are_zeroed_writable_and_aligned() {
        for len in [1usize, 100, 3 << 20] {
            let mut b = HugeBytes::zeroed(len);
            assert_eq!(b.len(), len);
            assert!(b.iter().all(|&v| v == 0));
            b[len - 1] = 7;
            assert_eq!(b[len - 1], 7);
            let align = if len >= 2 << 20 { 2 << 20 } else { 64 };
            assert_eq!(b.as_ptr() as usize % align, 0);
        }
    }
}
