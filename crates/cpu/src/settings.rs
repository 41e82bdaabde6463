//! The CPU backend's knobs (docs/SETTINGS.md), read once into [`CpuSettings`], which the
//! engine's settings hold and hand to [`crate::CpuBackend::with_settings`] by value. A value
//! a knob does not name is refused by name ([`Refused`]); the CLI checks them at start.

use std::path::PathBuf;

use minfer_graph::Refused;

use crate::plant::{self, Plant};
use crate::simd::{self, Isa};
use crate::Numerics;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CpuSettings {
    /// Which float arithmetic the kernels follow (`--numerics`: a flag, not a variable).
    pub numerics: Numerics,
    /// The instruction set the kernels are capped to (`MINFER_CPU_ISA`; None: the best this
    /// machine has). The kernel tables are process-wide (free functions resolve their kernel
    /// through [`simd::detected`], which takes the same value from [`isa_from_env`]), so this
    /// field records the cap rather than choosing it per backend.
    pub isa: Option<Isa>,
    /// Where every node's output of the step being run is written (`MINFER_DUMP_DIR`).
    pub dump_dir: Option<PathBuf>,
    /// The test-only planted kernel bug (`MINFER_TEST_PLANT_CPU`).
    pub plant: Option<Plant>,
    /// `MINFER_CPU_PACK=0`: matrices stay in their file's plain rows (no packed layout at
    /// load; a measurement and bisection switch, the results are the same bits).
    pub plain_rows: bool,
}

impl CpuSettings {
    /// The knobs as this process's environment sets them (`numerics` at its default).
    pub fn from_env() -> Result<CpuSettings, Refused> {
        Ok(CpuSettings {
            numerics: Numerics::default(),
            isa: isa_from_env()?,
            dump_dir: std::env::var_os("MINFER_DUMP_DIR").map(Into::into),
            plant: plant::parse(&std::env::var("MINFER_TEST_PLANT_CPU").unwrap_or_default())?,
            plain_rows: !pack_from_env()?,
        })
    }
}

/// `MINFER_CPU_PACK`: `1` (the default, also when unset or empty) packs matrices (each when a
/// matmul first reads it) where the instruction set has a kernel for the packed layout; `0` keeps plain rows.
pub fn pack_from_env() -> Result<bool, Refused> {
    match std::env::var("MINFER_CPU_PACK")
        .unwrap_or_default()
        .as_str()
    {
        "" | "1" => Ok(true),
        "0" => Ok(false),
        other => Err(Refused::new("MINFER_CPU_PACK", other, "want 0 or 1")),
    }
}

/// `MINFER_CPU_ISA`: an instruction set to run instead of the best one (`scalar`, `avx2`,
/// `avx512vnni`, `neon`, `neon-dotprod`), e.g. to measure the AVX2 kernels on an AVX-512
/// machine. None when unset or empty; refused by name when it is no instruction set or one
/// this machine lacks.
pub fn isa_from_env() -> Result<Option<Isa>, Refused> {
    let v = std::env::var("MINFER_CPU_ISA").unwrap_or_default();
    if v.is_empty() {
        return Ok(None);
    }
    let names = || Isa::ALL.map(Isa::name).join(", ");
    let refuse = |why: String| Refused::new("MINFER_CPU_ISA", v.as_str(), why);
    let isa = Isa::ALL
        .into_iter()
        .find(|i| i.name() == v)
        .ok_or_else(|| refuse(format!("not an instruction set (want one of {})", names())))?;
    if !isa.is_available() {
        let here: Vec<&str> = simd::available().into_iter().map(Isa::name).collect();
        return Err(refuse(format!(
            "this machine cannot run it (it has {})",
            here.join(", ")
        )));
    }
    Ok(Some(isa))
}
