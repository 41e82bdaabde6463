//! The engine loop's profile (issue 29): what the server's forwards look like, so that a
//! slow server can be told apart from a slow forward. Forwards, their rows by class, the
//! time inside the engine's forwards and the time of the loop turns that ran them (the
//! difference is the host's: admission, sampling, events, metrics), graph builds, and CUDA
//! graph captures and replays. `scripts/loop-profile` turns two scrapes into rates.

use super::{family, sample};
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

#[derive(Default)]
pub struct LoopProfile {
    forwards: AtomicU64,
    generation_rows: AtomicU64,
    prompt_rows: AtomicU64,
    forward_ns: AtomicU64,
    turn_ns: AtomicU64,
    graph_builds: AtomicU64,
    cuda_captures: AtomicU64,
    cuda_replays: AtomicU64,
}

/// One loop turn that ran a forward.
pub struct Turn {
    pub generation_rows: usize,
    pub prompt_rows: usize,
    /// Inside the engine's `forward_batch` (reruns after a failure included).
    pub forward: Duration,
    /// The whole turn, from taking new jobs to publishing the metrics.
    pub turn: Duration,
}

impl LoopProfile {
    pub fn turn(&self, t: &Turn) {
        self.forwards.fetch_add(1, Relaxed);
        self.generation_rows
            .fetch_add(t.generation_rows as u64, Relaxed);
        self.prompt_rows.fetch_add(t.prompt_rows as u64, Relaxed);
        self.forward_ns
            .fetch_add(t.forward.as_nanos() as u64, Relaxed);
        self.turn_ns.fetch_add(t.turn.as_nanos() as u64, Relaxed);
    }

    /// The engine's and the CUDA backends' own running counts, mirrored (monotone).
    pub fn set_engine_counts(&self, graph_builds: usize, cuda: Option<(u64, u64)>) {
        self.graph_builds.fetch_max(graph_builds as u64, Relaxed);
        if let Some((captures, replays)) = cuda {
            self.cuda_captures.fetch_max(captures, Relaxed);
            self.cuda_replays.fetch_max(replays, Relaxed);
        }
    }

    pub fn forwards(&self) -> u64 {
        self.forwards.load(Relaxed)
    }

    /// Rows by class: (generation, prompt).
    pub fn rows(&self) -> (u64, u64) {
        (
            self.generation_rows.load(Relaxed),
            self.prompt_rows.load(Relaxed),
        )
    }

    /// Seconds inside forwards and in the turns that ran them.
    pub fn seconds(&self) -> (f64, f64) {
        let s = |c: &AtomicU64| c.load(Relaxed) as f64 * 1e-9;
        (s(&self.forward_ns), s(&self.turn_ns))
    }

    pub fn render(&self, out: &mut String) {
        let counter = |out: &mut String, name: &str, help: &str, v: u64| {
            family(out, name, "counter", help);
            sample(out, name, None, v);
        };
        counter(
            out,
            "minfer_loop_forwards_total",
            "Forwards the engine loop ran.",
            self.forwards(),
        );
        let name = "minfer_loop_rows_total";
        family(
            out,
            name,
            "counter",
            "Rows the engine loop's forwards held, by row class.",
        );
        let (g, p) = self.rows();
        sample(out, name, Some(("class", "generation")), g);
        sample(out, name, Some(("class", "prompt")), p);
        let (fwd, turn) = self.seconds();
        let name = "minfer_loop_forward_seconds_total";
        family(
            out,
            name,
            "counter",
            "Seconds inside the engine's forwards.",
        );
        sample(out, name, None, fwd);
        let name = "minfer_loop_turn_seconds_total";
        family(
            out,
            name,
            "counter",
            "Seconds of the loop turns that ran a forward (the rest is host time between forwards).",
        );
        sample(out, name, None, turn);
        counter(
            out,
            "minfer_graph_builds_total",
            "Compute graphs the engine built (a forward of a new shape).",
            self.graph_builds.load(Relaxed),
        );
        counter(
            out,
            "minfer_cuda_graph_captures_total",
            "CUDA graphs captured (0 without CUDA).",
            self.cuda_captures.load(Relaxed),
        );
        counter(
            out,
            "minfer_cuda_graph_replays_total",
            "Splits replayed as CUDA graphs (0 without CUDA).",
            self.cuda_replays.load(Relaxed),
        );
    }
}
