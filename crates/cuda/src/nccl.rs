//! The NCCL communicator (issue 36, ADR 0015): [`minfer_graph::Communicator`] over cudarc's
//! NCCL bindings, one communicator per GPU of one process (`ncclCommInitAll`), a thread and
//! a stream per GPU. Built and linted without a GPU; not yet run (several GPUs needed).
//!
//! - libnccl is loaded at run time like the driver (cudarc's `dynamic-loading`): a build
//!   needs no NCCL, and a machine without `libnccl.so.2` gets a typed error here, never
//!   cudarc's panic on a missing library.
//! - `NCCL_NVLS_ENABLE=0` is set before the first communicator: NVLink multicast (NVLS)
//!   stays off because, on the shared multi-GPU hosts minfer is tested on, a program using
//!   it can put the host's GPUs out of service for a day or more (the device machines'
//!   notes require it off, for PyTorch and NVSHMEM too). A different value already in the
//!   environment is refused, not overridden.
//! - Every wait is bounded: a collective is enqueued, then its completion event is polled up
//!   to the group's timeout; past it (or on an asynchronous NCCL error) the communicator is
//!   aborted (`ncclCommAbort`, which unblocks the other ranks' kernels with an error) and the
//!   call fails. A rank that calls [`Communicator::abort`] aborts its communicator likewise.
//!
//! The host-slice methods stage through a device buffer: they are the contract's proof, not
//! the decode path. The CUDA ranks' forward reduces device buffers with
//! [`NcclCommunicator::all_reduce_sum_device`], on the rank's own stream.

use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use cudarc::nccl::{Comm, ReduceOp};
use minfer_graph::{CommError, CommResult, Communicator};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The environment variable and the only value minfer runs NCCL with.
pub const NVLS_VAR: &str = "NCCL_NVLS_ENABLE";

fn transport(what: &str, e: impl std::fmt::Debug) -> CommError {
    CommError::Transport(format!("{what}: {e:?}"))
}

/// One rank's NCCL communicator on its GPU's stream.
pub struct NcclCommunicator {
    /// None once aborted (dropping cudarc's `Comm` is its `ncclCommAbort`).
    comm: Mutex<Option<SendComm>>,
    stream: Arc<CudaStream>,
    rank: usize,
    size: usize,
    timeout: Duration,
    aborted: AtomicBool,
}

/// cudarc's `Comm` holds NCCL's raw handle and so is not `Send`. NCCL allows a communicator
/// to be used from any thread as long as calls on it do not overlap; the `Mutex` above
/// serializes them, and each rank's thread owns its communicator.
struct SendComm(Comm);
// SAFETY: see above — access is serialized by the owning Mutex, and NCCL communicators are
// not tied to the thread that created them.
unsafe impl Send for SendComm {}

/// Sets `NCCL_NVLS_ENABLE=0`, or refuses another value already set.
fn nvls_off() -> CommResult<()> {
    match std::env::var(NVLS_VAR) {
        Ok(v) if v.trim() == "0" => Ok(()),
        Ok(v) => Err(CommError::Transport(format!(
            "{NVLS_VAR}={v}: minfer runs NCCL with NVLink multicast off ({NVLS_VAR}=0); unset it"
        ))),
        Err(_) => {
            // Edition 2021: `set_var` is safe; this runs before any NCCL thread exists.
            std::env::set_var(NVLS_VAR, "0");
            Ok(())
        }
    }
}

/// Communicators for the GPUs `ordinals` (rank i on `ordinals[i]`), each on a new stream,
/// every collective bounded by `timeout`.
pub fn init_group(ordinals: &[usize], timeout: Duration) -> CommResult<Vec<NcclCommunicator>> {
    if ordinals.is_empty() {
        return Err(CommError::Transport("no GPUs given".into()));
    }
    nvls_off()?;
    // SAFETY: only loads the library by name (libloading), no NCCL call.
    if !unsafe { cudarc::nccl::sys::is_culib_present() } {
        return Err(CommError::Transport(
            "libnccl (libnccl.so.2) is not on the library path: tensor parallelism needs NCCL"
                .into(),
        ));
    }
    let mut streams = Vec::with_capacity(ordinals.len());
    for &o in ordinals {
        let ctx = CudaContext::new(o).map_err(|e| transport(&format!("CUDA device {o}"), e))?;
        streams.push(
            ctx.new_stream()
                .map_err(|e| transport(&format!("a stream on device {o}"), e))?,
        );
    }
    let comms = Comm::from_devices(streams.clone()).map_err(|e| transport("ncclCommInitAll", e))?;
    Ok(comms
        .into_iter()
        .zip(streams)
        .map(|(c, stream)| NcclCommunicator {
            rank: c.rank(),
            size: c.world_size(),
            comm: Mutex::new(Some(SendComm(c))),
            stream,
            timeout,
            aborted: AtomicBool::new(false),
        })
        .collect())
}

impl NcclCommunicator {
    /// Runs `f` on the communicator, or fails if it was aborted.
    fn with_comm<T>(&self, f: impl FnOnce(&Comm) -> CommResult<T>) -> CommResult<T> {
        let g = self.comm.lock().unwrap_or_else(|e| e.into_inner());
        match g.as_ref() {
            Some(c) if !self.aborted.load(Ordering::Acquire) => f(&c.0),
            _ => Err(CommError::Aborted {
                rank: self.rank,
                size: self.size,
                reason: "this rank's communicator was aborted".into(),
            }),
        }
    }

    /// Polls the stream's work up to the timeout; past it the communicator is aborted.
    fn wait(&self, op: &'static str) -> CommResult<()> {
        let ev = self
            .stream
            .record_event(None)
            .map_err(|e| transport("cuEventRecord", e))?;
        let start = Instant::now();
        loop {
            match ev.try_is_complete() {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => {
                    self.abort(&format!("{op}: {e:?}"));
                    return Err(transport(op, e));
                }
            }
            if start.elapsed() >= self.timeout {
                self.abort(&format!("{op} timed out"));
                return Err(CommError::Timeout {
                    rank: self.rank,
                    size: self.size,
                    op,
                    waited_ms: start.elapsed().as_millis(),
                    // NCCL does not say which peer is late.
                    missing: Vec::new(),
                });
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    /// The in-place sum of a device buffer on the rank's stream, bounded like the others.
    pub fn all_reduce_sum_device(&self, buf: &mut CudaSlice<f32>) -> CommResult<()> {
        self.with_comm(|c| {
            c.all_reduce_in_place(buf, &ReduceOp::Sum)
                .map_err(|e| transport("ncclAllReduce", e))
        })?;
        self.wait("all_reduce_sum")
    }

    /// The rank's stream (the forward's kernels go on it, before and after the collectives).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

impl Communicator for NcclCommunicator {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn all_reduce_sum(&self, buf: &mut [f32]) -> CommResult<()> {
        let mut d = self
            .stream
            .clone_htod(buf)
            .map_err(|e| transport("host to device", e))?;
        self.all_reduce_sum_device(&mut d)?;
        self.stream
            .memcpy_dtoh(&d, buf)
            .map_err(|e| transport("device to host", e))?;
        self.wait("all_reduce_sum (copy back)")
    }

    fn all_gather(&self, send: &[f32], recv: &mut [f32]) -> CommResult<()> {
        if recv.len() != send.len() * self.size() {
            return Err(CommError::BadBuffer {
                rank: self.rank(),
                what: format!(
                    "all_gather receive buffer of {} elements, want {} x {}",
                    recv.len(),
                    self.size(),
                    send.len()
                ),
            });
        }
        let s = self
            .stream
            .clone_htod(send)
            .map_err(|e| transport("host to device", e))?;
        let mut r = self
            .stream
            .alloc_zeros::<f32>(recv.len())
            .map_err(|e| transport("cuMemAlloc", e))?;
        self.with_comm(|c| {
            c.all_gather(&s, &mut r)
                .map_err(|e| transport("ncclAllGather", e))
        })?;
        self.wait("all_gather")?;
        self.stream
            .memcpy_dtoh(&r, recv)
            .map_err(|e| transport("device to host", e))?;
        self.wait("all_gather (copy back)")
    }

    fn abort(&self, reason: &str) {
        // Once: ncclCommAbort makes the other ranks' pending collectives fail rather than
        // wait for this one; cudarc's `Comm` does it when dropped, so abort is taking it out.
        if self.aborted.swap(true, Ordering::AcqRel) {
            return;
        }
        tracing::warn!(reason, "aborting the NCCL communicator");
        let taken = self.comm.lock().unwrap_or_else(|e| e.into_inner()).take();
        drop(taken);
    }
}
