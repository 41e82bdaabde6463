//! Weight placement, decided once at load: every backend is asked, per weight the model's
//! graph reads, whether it can hold it. A backend that cannot hold one holds none (all or
//! nothing per model, until layer offload exists), and the first weight it refused is kept
//! so the engine can say what kept the model off that device. Graph assignment then only
//! considers backends that hold a node's weights; nothing is decided mid-run.

use crate::backend::{Backend, BackendId, WeightId, WeightSource};
use crate::error::{Error, Result};

/// Which backend holds which weights.
#[derive(Clone, Debug, Default)]
pub struct Placement {
    /// Per participating backend, whether it holds the model's weights.
    holds: Vec<(BackendId, bool)>,
    /// Per backend that holds nothing: the backend's name, the weight and why.
    pub refusals: Vec<(String, String, String)>,
}

impl Placement {
    /// Every listed backend holds every weight (tests, graphs without weights).
    pub fn everywhere(backends: &[Box<dyn Backend>]) -> Placement {
        Placement {
            holds: backends.iter().map(|b| (b.id(), true)).collect(),
            refusals: Vec::new(),
        }
    }

    /// Whether `backend` holds the weights (a backend that took no part holds none).
    pub fn holds(&self, backend: BackendId) -> bool {
        self.holds.iter().any(|&(b, h)| b == backend && h)
    }

    /// One line per backend that holds nothing, naming the weight and the reason.
    pub fn report(&self) -> Vec<String> {
        self.refusals
            .iter()
            .map(|(be, w, why)| format!("{be}: cannot hold {w}: {why}; the model runs elsewhere"))
            .collect()
    }
}

/// Places the weights `used` (every weight the model's graphs read) and hands each backend
/// the ones it holds. `Err` when no backend can hold some weight, naming it.
pub fn place_weights(
    backends: &mut [Box<dyn Backend>],
    weights: &dyn WeightSource,
    used: &[WeightId],
) -> Result<Placement> {
    let mut placement = Placement::default();
    for be in backends.iter_mut() {
        let refused = used.iter().find_map(|&id| {
            let w = weights.weight(id)?;
            be.can_hold(&w).err().map(|why| (id, why.0))
        });
        let missing = used.iter().find(|&&id| weights.weight(id).is_none());
        if let Some(&id) = missing {
            return Err(Error::Graph(format!(
                "weight {} (id {}) is not in the model",
                weights.name(id),
                id.0
            )));
        }
        match refused {
            Some((id, why)) => {
                placement
                    .refusals
                    .push((be.name().to_string(), weights.name(id).to_string(), why));
                placement.holds.push((be.id(), false));
            }
            None => {
                be.prepare_weights(weights, used)?;
                placement.holds.push((be.id(), true));
            }
        }
    }
    if !placement.holds.iter().any(|&(_, h)| h) {
        return Err(Error::Graph(format!(
            "no backend can hold the model's weights: {}",
            placement.report().join("; ")
        )));
    }
    Ok(placement)
}
