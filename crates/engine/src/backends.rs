//! The backend table of this build: fixed ids (cpu 0, metal 1, cuda 2, metal-emu 3; written
//! into session files and graph dumps), whether each is compiled in, whether this machine can
//! run it, and whether it takes part unless named (the emulator does not).

use minfer_cpu::CpuBackend;
use minfer_graph::{Backend, BackendEntry, BackendId};

pub use minfer_cpu::CPU_ID;
pub use minfer_cuda::CUDA_ID;
/// What the emulator answers as its free memory (`MINFER_EMU_MEM`; `Settings::emu.memory`).
#[cfg(feature = "metal-emu")]
pub use minfer_msl_emu::EmuMemory;
pub const METAL_ID: BackendId = BackendId(1);
/// The Metal executor on the MSL emulator: the same code as `metal`, run on the CPU, for
/// proof and debugging on machines without a Mac (slow).
pub const METAL_EMU_ID: BackendId = BackendId(3);

/// The CPU backend's own knobs and facts, as callers above the engine need them (so the CLI
/// names no backend crate).
pub mod cpu {
    pub use minfer_cpu::Numerics;

    /// The instruction set the CPU kernels run (the best this machine has, or the one
    /// `MINFER_CPU_ISA` caps them to).
    pub fn kernels() -> &'static str {
        minfer_cpu::simd::detected().name()
    }

    /// Physical cores, as the CPU backend counts them (what a thread count of 0 means).
    pub fn physical_cores() -> usize {
        minfer_cpu::threads::physical_cores()
    }
}

/// CUDA graphs captured and replayed so far by every CUDA backend of the process (None in a
/// build without CUDA): a server's profile reads them to tell a step whose shape was new from
/// one replayed.
pub fn cuda_graph_counts() -> Option<(u64, u64)> {
    #[cfg(feature = "cuda")]
    {
        Some((minfer_cuda::graph_captures(), minfer_cuda::graph_replays()))
    }
    #[cfg(not(feature = "cuda"))]
    {
        None
    }
}

pub use crate::settings::CpuSettings;
use crate::Settings;

/// What a backend's constructor is given: its id and name, the CPU threads (0: the physical
/// cores) and the engine's settings, of which it takes its part.
type Make = fn(BackendId, &'static str, usize, &Settings) -> minfer_graph::Result<Box<dyn Backend>>;

/// One backend of this build: its entry (id, name, whether compiled in and available, whether
/// it takes part unless named) and its constructor. A backend crate exports its own entry
/// (`minfer_cpu::entry`, `minfer_cuda::entry` and `minfer_cuda::instantiate`); the two Metal
/// entries are made here, where the executor (`minfer-metal`), the device (`minfer-metal-objc`,
/// macOS) and the emulator (`minfer-msl-emu`) meet — no one of those crates knows the others.
/// The table order is the backends' priority: a node goes to the first participating backend
/// that takes it (Metal, then CUDA, then the CPU; the emulator is Metal's executor and ranks
/// with it).
struct Registered {
    entry: BackendEntry,
    make: Make,
}

fn registry() -> Vec<Registered> {
    vec![
        metal_backend(),
        metal_emu_backend(),
        cuda_backend(),
        cpu_backend(),
    ]
}

/// The constructor of a backend this build leaves out (`resolve` refuses it first, naming
/// the cargo feature).
fn not_compiled(
    _: BackendId,
    name: &'static str,
    _: usize,
    _: &Settings,
) -> minfer_graph::Result<Box<dyn Backend>> {
    Err(minfer_graph::Error::NotCompiled {
        name: name.into(),
        why: "no backend implementation in this build".into(),
    })
}

fn cpu_backend() -> Registered {
    Registered {
        entry: minfer_cpu::entry(),
        make: |_, _, threads, s| Ok(Box::new(CpuBackend::with_settings(threads, &s.cpu))),
    }
}

fn metal_backend() -> Registered {
    #[cfg(all(feature = "metal", target_os = "macos"))]
    let make: Make = |id, name, _, s| {
        s.metal
            .check()
            .map_err(|why| minfer_graph::Error::Unavailable {
                name: name.into(),
                why,
            })?;
        let dev = minfer_metal_objc::SharedDevice::get().map_err(|e| {
            minfer_graph::Error::Unavailable {
                name: name.into(),
                why: e.to_string(),
            }
        })?;
        Ok(Box::new(minfer_metal::MetalBackend::with_settings(
            dev, id, name, &s.metal,
        )))
    };
    #[cfg(not(all(feature = "metal", target_os = "macos")))]
    let make: Make = not_compiled;
    Registered {
        entry: BackendEntry {
            id: METAL_ID,
            name: "metal",
            compiled: if cfg!(all(feature = "metal", target_os = "macos")) {
                Ok(())
            } else if cfg!(target_os = "macos") {
                Err("this build has no Metal backend (cargo feature `metal`)".into())
            } else {
                Err(
                    "Metal needs macOS (on Linux, `metal-emu` runs the same executor on the \
                     MSL emulator)"
                        .into(),
                )
            },
            available: metal_available(),
            by_default: true,
        },
        make,
    }
}

/// The entry and the constructor are the CUDA crate's own (its shell says "not compiled"
/// in a build without the feature).
fn cuda_backend() -> Registered {
    #[cfg(feature = "cuda")]
    let make: Make = |id, name, _, s| minfer_cuda::instantiate(id, name, &s.cuda);
    #[cfg(not(feature = "cuda"))]
    let make: Make = not_compiled;
    Registered {
        entry: minfer_cuda::entry(),
        make,
    }
}

fn metal_emu_backend() -> Registered {
    #[cfg(feature = "metal-emu")]
    let make: Make = |id, name, _, s| {
        // A refused `MINFER_METAL_TIER_CONTROL` fails here, where the backend is made.
        s.metal
            .check()
            .map_err(|why| minfer_graph::Error::Unavailable {
                name: name.into(),
                why,
            })?;
        Ok(Box::new(minfer_metal::MetalBackend::with_settings(
            // One forward is one submit; emulated, a big model's takes minutes.
            minfer_msl_emu::EmuDevice::with_settings(minfer_msl_emu::Schedule::Forward, &s.emu)
                .with_submit_timeout(std::time::Duration::from_secs(900)),
            id,
            name,
            &s.metal,
        )))
    };
    #[cfg(not(feature = "metal-emu"))]
    let make: Make = not_compiled;
    Registered {
        entry: BackendEntry {
            id: METAL_EMU_ID,
            name: "metal-emu",
            compiled: if cfg!(feature = "metal-emu") {
                Ok(())
            } else {
                Err("this build has no Metal emulator (cargo feature `metal-emu`)".into())
            },
            available: Ok(()),
            by_default: false,
        },
        make,
    }
}

/// How many CUDA devices this build and machine offer, or why none (for the refusal of
/// `--tensor-parallel`, issue 36).
pub fn cuda_device_count() -> Result<usize, String> {
    minfer_cuda::device_count().map_err(|e| e.to_string())
}

/// Every backend's entry, in table order.
pub fn table() -> Vec<BackendEntry> {
    registry().into_iter().map(|r| r.entry).collect()
}

/// The name of a backend id, for dumps and messages.
pub fn name_of(id: BackendId) -> String {
    table()
        .into_iter()
        .find(|e| e.id == id)
        .map(|e| e.name.to_string())
        .unwrap_or_else(|| format!("backend{}", id.0))
}

/// Resolves `--backend` names (see [`minfer_graph::resolve_backends`]); the CPU always takes part.
pub fn resolve(names: &[String]) -> minfer_graph::Result<Vec<BackendId>> {
    minfer_graph::resolve_backends(names, &table(), CPU_ID)
}

/// Instantiates resolved backends, each with its part of `settings` (`threads`: CPU threads,
/// 0 the physical cores).
pub fn instantiate(
    ids: &[BackendId],
    threads: usize,
    settings: &Settings,
) -> minfer_graph::Result<Vec<Box<dyn Backend>>> {
    let reg = registry();
    ids.iter()
        .map(|&id| match reg.iter().find(|r| r.entry.id == id) {
            Some(r) => (r.make)(id, r.entry.name, threads, settings),
            None => Err(minfer_graph::Error::NotCompiled {
                name: name_of(id),
                why: "no backend implementation in this build".into(),
            }),
        })
        .collect()
}

/// Whether this machine has a Metal device (macOS builds with the `metal` feature).
fn metal_available() -> Result<(), String> {
    #[cfg(all(feature = "metal", target_os = "macos"))]
    {
        if crate::settings::disable_mps() {
            return Err("MINFER_DISABLE_MPS is set".into());
        }
        minfer_metal_objc::SharedDevice::get()
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
    #[cfg(not(all(feature = "metal", target_os = "macos")))]
    {
        Err("not compiled".into())
    }
}

/// Whether a backend is a device (not the CPU): the engine picks the KV element type for
/// device engines by model size (see `EngineConfig::cache_type_auto`).
pub fn is_device(id: BackendId) -> bool {
    id != CPU_ID
}
