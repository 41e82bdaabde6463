//! CUDA graph replay of whole splits. Each split is first recorded (its launches built with
//! every host check done, none issued); a record equal to one seen before — the same
//! kernels, grids and arguments, as a decode step's are when positions, cells and windows
//! live in device inputs — is captured once as a CUDA graph and replayed from then on,
//! replacing hundreds of launches by one. Replay issues exactly the recorded launches, so its
//! results are the eager run's bit for bit (a GPU gate checks it).
//! `MINFER_CUDA_GRAPHS=0` turns it off (every split eager).

use std::sync::atomic::{AtomicU64, Ordering};

use cudarc::driver::CudaGraph;

use crate::device::{DResult, Gpu, Work};

/// Graph launches made by every CUDA backend of the process (tests check the replay path ran).
static REPLAYS: AtomicU64 = AtomicU64::new(0);

/// Splits replayed as CUDA graphs so far, process-wide.
pub fn graph_replays() -> u64 {
    REPLAYS.load(Ordering::Relaxed)
}

/// CUDA graphs captured by every CUDA backend of the process (a server's profile reads how
/// often a step's shape was new).
static CAPTURES: AtomicU64 = AtomicU64::new(0);

/// Splits captured as CUDA graphs so far, process-wide.
pub fn graph_captures() -> u64 {
    CAPTURES.load(Ordering::Relaxed)
}

/// Records kept; a server's ladder of batch shapes plus prefill chunks fits.
const KEEP: usize = 16;

/// A captured graph owned by one backend.
struct OwnedGraph(CudaGraph);

// SAFETY: CUDA graph objects may be used from any thread as long as calls on one graph are
// serialised (the driver's graph thread-safety rules); the graph lives inside one backend,
// which is `Send` but not `Sync` and reached through `&mut`, so calls never overlap.
unsafe impl Send for OwnedGraph {}

struct Entry {
    launches: Vec<Work>,
    graph: Option<OwnedGraph>,
    last_use: u64,
}

#[derive(Default)]
pub(crate) struct Replayer {
    entries: Vec<Entry>,
    clock: u64,
}

impl Replayer {
    /// Runs a recorded split: replayed if seen before (captured at its second sighting),
    /// else issued eagerly and remembered.
    pub fn run(&mut self, gpu: &Gpu, launches: Vec<Work>) -> DResult<()> {
        self.clock += 1;
        if let Some(e) = self.entries.iter_mut().find(|e| e.launches == launches) {
            e.last_use = self.clock;
            if e.graph.is_none() {
                e.graph = Some(OwnedGraph(gpu.capture(&e.launches)?));
                CAPTURES.fetch_add(1, Ordering::Relaxed);
            }
            let g = e.graph.as_ref().expect("captured above");
            g.0.launch()
                .map_err(|err| format!("cuGraphLaunch: {err:?}"))?;
            REPLAYS.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        gpu.issue_all(&launches)?;
        if self.entries.len() >= KEEP {
            let oldest = (0..self.entries.len())
                .min_by_key(|&i| self.entries[i].last_use)
                .expect("entries is full");
            self.entries.swap_remove(oldest);
        }
        self.entries.push(Entry {
            launches,
            graph: None,
            last_use: self.clock,
        });
        Ok(())
    }
}
