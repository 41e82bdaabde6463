//! The backend conformance matrix (issue 28, step 7; ADR 0012): one test target for every
//! backend this build has. Each case is written once, as a function of a [`Row`] (the backend
//! under test) and that row's class (the weight types it covers, its named tolerances, what
//! must be bit for bit); [`for_each_backend!`] instantiates it once per row, so a test's name
//! is `<module>::<case>::<row>` (`models::three_runs_are_bit_identical::cuda`). The
//! reference every row is held to is the f64 forward of `minfer_models::reference` and the
//! CPU backend's scalar path.
//!
//! Rows:
//! - `cpu`: always (only where a CPU class is named: batch invariance and determinism);
//! - `metal_emu`: the Metal executor on the MSL emulator (feature `metal-emu`, the default);
//!   `MINFER_GATE_METAL_BACKEND=metal` runs the same rows on a Mac's GPU (scripts/mac-gate);
//! - `cuda`: feature `cuda`; prints SKIP and passes where no CUDA device exists, so CI stays
//!   green; scripts/gpu-gate runs its rows on the H200, one test per process (some set the
//!   backend's `MINFER_CUDA_*` switches before loading an engine).
//!
//! Modules: `models` (whole synthetic models: reference, greedy, KV classes, chunking,
//! batches, determinism), `kv` (KV region operations on the device), `fusion` (fused decode
//! nodes against the unfused chain), `real` (the cached demo models), `cuda_paths` (the CUDA
//! backend's own arithmetic paths and prompt rows), `metal_rows` (the Metal executor's row
//! classes: each class on its own tiers, bit for bit across chunkings and company), `ops`
//! (single operations against the CPU backend's), `times` (a trace's per-node times on the
//! Metal row).

// A row compiled out (no `cuda` feature, or no `metal-emu`) leaves its classes unused.
#![cfg_attr(
    not(all(feature = "metal-emu", feature = "cuda")),
    allow(dead_code, unused_imports, unused_macros)
)]

use minfer_engine::{Engine, EngineConfig};
use minfer_gguf::GgmlType;
use std::path::Path;

/// One backend of the matrix.
pub struct Row {
    /// The row's name in messages (the test's last path segment is the same, as an ident).
    pub name: &'static str,
    /// The backend its engines load (`--backend`).
    pub backend: fn() -> String,
    /// CPU threads of its engines, and of the CPU engines it is compared with (as each
    /// backend's own test file had them).
    pub threads: usize,
    /// Whether it can run here; prints SKIP when not.
    pub present: fn() -> bool,
}

impl Row {
    /// Runs `case` on this row, or passes with SKIP where the row cannot run.
    pub fn run(&self, case: impl FnOnce(&Row)) {
        if (self.present)() {
            case(self)
        }
    }

    /// The backend name its engines load.
    pub fn backend(&self) -> String {
        (self.backend)()
    }

    /// An engine of this row (160-token context).
    pub fn engine(&self, path: &Path, cache: GgmlType, n_batch: usize) -> Engine {
        load(path, &self.backend(), self.threads, cache, n_batch)
    }

    /// The CPU engine this row is compared with.
    pub fn cpu_engine(&self, path: &Path, cache: GgmlType) -> Engine {
        load(path, "cpu", self.threads, cache, 512)
    }
}

fn load(path: &Path, backend: &str, threads: usize, cache: GgmlType, n_batch: usize) -> Engine {
    Engine::load(
        path,
        EngineConfig {
            n_ctx: 160,
            threads,
            cache_type: cache,
            backends: vec![backend.into()],
            n_batch,
            ..EngineConfig::default()
        },
    )
    .unwrap()
}

pub const CPU: Row = Row {
    name: "cpu",
    backend: || "cpu".into(),
    threads: 1,
    present: || true,
};

/// The Metal backend the rows run on: the emulator here, the GPU on a Mac.
pub const METAL_EMU: Row = Row {
    name: "metal-emu",
    backend: || std::env::var("MINFER_GATE_METAL_BACKEND").unwrap_or_else(|_| "metal-emu".into()),
    threads: 1,
    present: || true,
};

#[cfg(feature = "cuda")]
pub const CUDA: Row = Row {
    name: "cuda",
    backend: || "cuda".into(),
    threads: 2,
    present: || match minfer_cuda::available() {
        Ok(()) => true,
        Err(why) => {
            println!("SKIP: no CUDA device ({why})");
            false
        }
    },
};

/// Instantiates cases for the rows named: `name: function { row => class, ... }` gives a
/// module `name` with one `#[test] fn <row>()` per row calling `function(&ROW, &class)`;
/// a row whose feature is off is compiled out.
macro_rules! for_each_backend {
    ($($(#[$doc:meta])* $case:ident: $run:ident { $($row:ident => $class:expr),+ $(,)? })+) => {$(
        $(#[$doc])*
        mod $case {
            #[allow(unused_imports)]
            use super::*;
            $( for_each_backend!(@row $row, $run, $class); )+
        }
    )+};
    (@row cpu, $run:ident, $class:expr) => {
        #[test]
        fn cpu() {
            $crate::CPU.run(|r| $run(r, &$class))
        }
    };
    (@row metal_emu, $run:ident, $class:expr) => {
        #[cfg(feature = "metal-emu")]
        #[test]
        fn metal_emu() {
            $crate::METAL_EMU.run(|r| $run(r, &$class))
        }
    };
    (@row cuda, $run:ident, $class:expr) => {
        #[cfg(feature = "cuda")]
        #[test]
        fn cuda() {
            $crate::CUDA.run(|r| $run(r, &$class))
        }
    };
}

#[cfg(feature = "cuda")]
mod cuda_paths;
mod fusion;
mod kv;
mod metal_rows;
mod models;
#[cfg(feature = "cuda")]
mod ops;
mod real;
mod times;
