//! The model's weights as the graph sees them: every tensor of the GGUF under an interned
//! [`WeightId`] (its index in the model's tensor table), resolved to zero-copy mmap bytes in
//! O(1). Names are looked up only when a graph is built.

use minfer_gguf::GgufModel;
use minfer_graph::{WeightId, WeightRef, WeightSource};
use std::collections::HashMap;

/// Name → id, built once at load.
pub(crate) fn intern(model: &GgufModel) -> HashMap<String, WeightId> {
    model
        .tensors()
        .iter()
        .enumerate()
        .map(|(i, t)| (t.info.name.clone(), WeightId(i as u32)))
        .collect()
}

/// A view of the mapped model and its interned names.
pub(crate) struct ModelWeights<'a> {
    pub model: &'a GgufModel,
    pub ids: &'a HashMap<String, WeightId>,
}

impl WeightSource for ModelWeights<'_> {
    fn weight(&self, id: WeightId) -> Option<WeightRef<'_>> {
        let t = self.model.tensors().get(id.index())?;
        let bytes = self.model.parts()[t.part].tensor_bytes(&t.info);
        let ne0 = *t.info.dims.first()? as usize;
        Some(WeightRef {
            ty: t.info.ty,
            ne0,
            ne1: (t.info.n_elements() as usize) / ne0.max(1),
            bytes,
        })
    }

    fn name(&self, id: WeightId) -> &str {
        self.model
            .tensors()
            .get(id.index())
            .map_or("<unknown weight>", |t| t.info.name.as_str())
    }

    fn id(&self, name: &str) -> Option<WeightId> {
        self.ids.get(name).copied()
    }

    fn len(&self) -> usize {
        self.model.tensors().len()
    }

    fn part(&self, id: WeightId) -> Option<(usize, &[u8])> {
        let t = self.model.tensors().get(id.index())?;
        Some((t.part, self.model.parts()[t.part].mapping()))
    }
}
