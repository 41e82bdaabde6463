//! CUDA graph replay of whole splits, keyed by the split's identity in its plan
//! ([`SplitKey`]: the graph cache's plan id and the split's index). Each split is recorded
//! (its launches built with every host check done, none issued); the record is compared
//! with the one kept under the same key alone — no search among other plans' records — and
//! at its second equal sighting captured once as a CUDA graph, then replayed from then on,
//! replacing hundreds of launches by one. The comparison stays because one plan's launches
//! can change between steps (a prefill's grids follow its longest window and its row
//! classes): a record that differs replaces the key's record and runs eagerly. Replay issues
//! exactly the recorded launches, so its results are the eager run's bit for bit (a GPU gate
//! checks it). A plan's graphs are dropped when the plan is released
//! ([`Replayer::forget`]), so what is kept follows the graph cache, not a count of its own.
//! `MINFER_CUDA_GRAPHS=0` turns it off (every split eager).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use cudarc::driver::CudaGraph;
use minfer_graph::{PlanId, SplitKey};

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

/// A captured graph owned by one backend.
struct OwnedGraph(CudaGraph);

// SAFETY: CUDA graph objects may be used from any thread as long as calls on one graph are
// serialised (the driver's graph thread-safety rules); the graph lives inside one backend,
// which is `Send` but not `Sync` and reached through `&mut`, so calls never overlap.
unsafe impl Send for OwnedGraph {}

struct Entry {
    launches: Vec<Work>,
    graph: Option<OwnedGraph>,
}

#[derive(Default)]
pub(crate) struct Replayer {
    entries: HashMap<SplitKey, Entry>,
}

impl Replayer {
    /// Runs split `key`'s recorded launches: replayed if the key's last record is the same
    /// (captured at its second sighting), else issued eagerly and kept as the key's record.
    pub fn run(&mut self, gpu: &Gpu, key: SplitKey, launches: Vec<Work>) -> DResult<()> {
        if let Some(e) = self.entries.get_mut(&key) {
            if e.launches == launches {
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
        }
        gpu.issue_all(&launches)?;
        self.entries.insert(
            key,
            Entry {
                launches,
                graph: None,
            },
        );
        Ok(())
    }

    /// Drops the records and graphs of a released plan.
    pub fn forget(&mut self, plan: PlanId) {
        self.entries.retain(|k, _| k.plan != plan);
    }
}
