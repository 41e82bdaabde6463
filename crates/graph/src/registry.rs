//! Resolving `--backend NAME` lists. The table of backends (names, fixed ids, whether they
//! are compiled in and available) is supplied by the caller, so this crate names no device.

use crate::backend::BackendId;
use crate::error::{Error, Result};

/// One row of the backend table.
#[derive(Clone, Debug)]
pub struct BackendEntry {
    pub id: BackendId,
    pub name: &'static str,
    /// `Err(why)` when this build does not include it.
    pub compiled: std::result::Result<(), String>,
    /// `Err(why)` when it is compiled in but this machine cannot run it.
    pub available: std::result::Result<(), String>,
    /// Whether an empty request includes it (false for a backend only named on purpose,
    /// such as an emulator).
    pub by_default: bool,
}

/// Resolves requested names (case-insensitive, trimmed; comma lists allowed) to backend ids,
/// in table order, which is the backends' priority order: assignment gives a node to the
/// first of them that takes it ([`crate::assign_backends`]). An empty request means every
/// compiled and available backend that takes part by default. Three distinct refusals: an
/// unknown name, a backend not compiled in, and one compiled in but unavailable. `always`
/// (the CPU) always takes part.
pub fn resolve_backends(
    requested: &[String],
    table: &[BackendEntry],
    always: BackendId,
) -> Result<Vec<BackendId>> {
    let mut chosen: Vec<BackendId> = Vec::new();
    if requested.is_empty() {
        chosen.extend(
            table
                .iter()
                .filter(|e| e.by_default && e.compiled.is_ok() && e.available.is_ok())
                .map(|e| e.id),
        );
    }
    for name in requested.iter().flat_map(|r| r.split(',')) {
        let name = name.trim();
        let e = table
            .iter()
            .find(|e| e.name.eq_ignore_ascii_case(name))
            .ok_or_else(|| Error::UnknownBackend {
                name: name.into(),
                known: table.iter().map(|e| e.name).collect::<Vec<_>>().join(", "),
            })?;
        if let Err(why) = &e.compiled {
            return Err(Error::NotCompiled {
                name: e.name.into(),
                why: why.clone(),
            });
        }
        if let Err(why) = &e.available {
            return Err(Error::Unavailable {
                name: e.name.into(),
                why: why.clone(),
            });
        }
        chosen.push(e.id);
    }
    chosen.push(always);
    // Table order is priority order (the first backend that takes a node runs it).
    chosen.sort_by_key(|id| table.iter().position(|e| e.id == *id).unwrap_or(usize::MAX));
    chosen.dedup();
    Ok(chosen)
}
