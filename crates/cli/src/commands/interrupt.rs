//! Ctrl-C for `run` and `chat`: while a reply is generated, SIGINT sets [`CANCEL`] and the
//! generation loop stops between forwards, keeping what it generated (`run` then prints its
//! timings and exits 130; `chat` goes on). At any other moment it exits 130 at once.

use std::sync::atomic::{AtomicBool, Ordering};

/// Set by the SIGINT handler while a reply is generated (and by a command that must stop
/// its reply, e.g. when its output pipe closed).
pub static CANCEL: AtomicBool = AtomicBool::new(false);
/// Whether a reply is being generated (Ctrl-C then stops it instead of exiting).
static GENERATING: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    if GENERATING.load(Ordering::SeqCst) {
        CANCEL.store(true, Ordering::SeqCst);
    } else {
        // SAFETY: write(2) and _exit(2) are async-signal-safe.
        unsafe {
            libc::write(2, b"\n".as_ptr().cast(), 1);
            libc::_exit(130);
        }
    }
}

/// Installs the SIGINT handler.
pub fn install() -> anyhow::Result<()> {
    // SAFETY: the handler only touches atomics and async-signal-safe calls; the sigaction
    // struct is zeroed and then filled before use.
    let rc = unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigint as extern "C" fn(libc::c_int) as libc::sighandler_t;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGINT, &sa, std::ptr::null_mut())
    };
    if rc != 0 {
        anyhow::bail!(
            "cannot install the Ctrl-C handler: {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

/// While alive, Ctrl-C stops the reply instead of exiting; [`CANCEL`] starts cleared.
pub struct Generating(());

impl Generating {
    pub fn start() -> Generating {
        CANCEL.store(false, Ordering::SeqCst);
        GENERATING.store(true, Ordering::SeqCst);
        Generating(())
    }
}

impl Drop for Generating {
    fn drop(&mut self) {
        GENERATING.store(false, Ordering::SeqCst);
    }
}
