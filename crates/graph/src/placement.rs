//! Weight placement, decided once at load: every backend is asked, per weight the model's
//! graph reads, whether it can hold it. Two forms:
//! - whole-model ([`place_weights`]): a backend that cannot hold one weight holds none (a
//!   model is never split by accident), and the first weight it refused is kept so the
//!   engine can say what kept the model off that device;
//! - per block ([`place_by_layer`], layer offload): a [`LayerPlan`] names the backend of each
//!   block and of the nodes outside the blocks (embedding, final norm, output head); each
//!   backend receives exactly the weights of the blocks placed on it.
//!
//! Graph assignment then only considers backends that hold a node's weights (and, under a
//! layer plan, starts from the backend of the node's block); nothing is decided mid-run.

use crate::backend::{Backend, BackendId, WeightId, WeightSource};
use crate::error::{Error, Result};

/// Which backend runs each block, and which the nodes outside the blocks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerPlan {
    /// Per block (layer index), its backend. One entry more than the model's blocks places
    /// the output position (the final norm and output head, which the model builder tags
    /// with the layer one past its last block) apart from `edges`; without it they follow
    /// `edges`.
    pub blocks: Vec<BackendId>,
    /// The backend of nodes of no block: inputs and the embedding, and the final norm and
    /// output head unless `blocks` names their position.
    pub edges: BackendId,
}

impl LayerPlan {
    /// The backend a node of `layer` starts from (a layer past the plan is an edge node).
    pub fn home(&self, layer: Option<usize>) -> BackendId {
        layer
            .and_then(|l| self.blocks.get(l).copied())
            .unwrap_or(self.edges)
    }
}

/// Which backend holds which weights.
#[derive(Clone, Debug, Default)]
pub struct Placement {
    /// Per participating backend, whether it holds the model's weights (whole-model form).
    holds: Vec<(BackendId, bool)>,
    /// Per backend, the weights it holds by id (per-block form; `holds` is then unused).
    held: Vec<(BackendId, Vec<bool>)>,
    /// The layer plan of the per-block form.
    layers: Option<LayerPlan>,
    /// Per backend that holds nothing: the backend's name, the weight and why.
    pub refusals: Vec<(String, String, String)>,
}

impl Placement {
    /// Every listed backend holds every weight (tests, graphs without weights).
    pub fn everywhere(backends: &[Box<dyn Backend>]) -> Placement {
        Placement {
            holds: backends.iter().map(|b| (b.id(), true)).collect(),
            ..Placement::default()
        }
    }

    /// The same placement with `plan` steering assignment (each node starting from its
    /// block's backend): a planner's dry run over a whole-model placement.
    pub fn with_layers(mut self, plan: LayerPlan) -> Placement {
        self.layers = Some(plan);
        self
    }

    /// Whether `backend` holds any weights (a backend that took no part holds none).
    pub fn holds(&self, backend: BackendId) -> bool {
        if !self.held.is_empty() {
            return self
                .held
                .iter()
                .any(|(b, w)| *b == backend && w.iter().any(|&h| h));
        }
        self.holds.iter().any(|&(b, h)| b == backend && h)
    }

    /// Whether `backend` holds weight `id`.
    pub fn holds_weight(&self, backend: BackendId, id: WeightId) -> bool {
        if !self.held.is_empty() {
            return self
                .held
                .iter()
                .any(|(b, w)| *b == backend && w.get(id.index()).copied().unwrap_or(false));
        }
        self.holds(backend)
    }

    /// The layer plan, when the weights were placed per block.
    pub fn layers(&self) -> Option<&LayerPlan> {
        self.layers.as_ref()
    }

    /// One line per backend that holds nothing, naming the weight and the reason.
    pub fn report(&self) -> Vec<String> {
        self.refusals
            .iter()
            .map(|(be, w, why)| format!("{be}: cannot hold {w}: {why}; the model runs elsewhere"))
            .collect()
    }
}

/// The first weight of `used` that `be` refuses, with the reason.
pub fn first_refusal(
    be: &dyn Backend,
    weights: &dyn WeightSource,
    used: &[WeightId],
) -> Option<(WeightId, String)> {
    used.iter().find_map(|&id| {
        let w = weights.weight(id)?;
        be.can_hold(&w).err().map(|why| (id, why.0))
    })
}

fn check_present(weights: &dyn WeightSource, used: &[WeightId]) -> Result<()> {
    match used.iter().find(|&&id| weights.weight(id).is_none()) {
        Some(&id) => Err(Error::Graph(format!(
            "weight {} (id {}) is not in the model",
            weights.name(id),
            id.0
        ))),
        None => Ok(()),
    }
}

/// Places the weights `used` (every weight the model's graphs read) and hands each backend
/// the ones it holds. `Err` when no backend can hold some weight, naming it.
pub fn place_weights(
    backends: &mut [Box<dyn Backend>],
    weights: &dyn WeightSource,
    used: &[WeightId],
) -> Result<Placement> {
    check_present(weights, used)?;
    let mut placement = Placement::default();
    for be in backends.iter_mut() {
        match first_refusal(be.as_ref(), weights, used) {
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

/// Places each weight of `used` (with the block that reads it; `None`: outside the blocks)
/// on the backend `plan` names for that block, and hands every backend exactly its weights.
/// A weight read by nodes of two blocks on two backends is held by both; `everything` (the
/// CPU) holds every weight, so a node its block's device refuses still has a backend that
/// can run it (as in the whole-model form). A backend that
/// refuses a weight placed on it is an error naming the weight (the engine asks
/// [`first_refusal`] before it plans, so a device that cannot hold the model is kept out
/// of the plan instead).
pub fn place_by_layer(
    backends: &mut [Box<dyn Backend>],
    weights: &dyn WeightSource,
    used: &[(WeightId, Option<usize>)],
    plan: &LayerPlan,
    everything: BackendId,
) -> Result<Placement> {
    let ids: Vec<WeightId> = used.iter().map(|&(id, _)| id).collect();
    check_present(weights, &ids)?;
    let mut placement = Placement {
        layers: Some(plan.clone()),
        ..Placement::default()
    };
    for be in backends.iter_mut() {
        let mut mine: Vec<WeightId> = used
            .iter()
            .filter(|&&(_, l)| be.id() == everything || plan.home(l) == be.id())
            .map(|&(id, _)| id)
            .collect();
        mine.sort_unstable();
        mine.dedup();
        if let Some((id, why)) = first_refusal(be.as_ref(), weights, &mine) {
            return Err(Error::Graph(format!(
                "{} cannot hold {} of its blocks: {why}",
                be.name(),
                weights.name(id)
            )));
        }
        let mut held = vec![false; weights.len()];
        for id in &mine {
            held[id.index()] = true;
        }
        if !mine.is_empty() {
            be.prepare_weights(weights, &mine)?;
        }
        placement.held.push((be.id(), held));
    }
    Ok(placement)
}
