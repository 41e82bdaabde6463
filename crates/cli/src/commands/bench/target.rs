//! Loading the model under test, once per thread count (the CPU backend's thread pool is
//! fixed at load; repetitions reuse the loaded model).

use super::report::{model_facts, ModelFacts};
use super::{Args, Target};
use anyhow::Context;
use minfer_engine::{
    backends, parse_cache_type, BatchEntry, Engine, EngineConfig, RowClass, SeqId,
};
use std::path::Path;

pub struct Loaded {
    pub target: Box<dyn Target>,
    pub facts: ModelFacts,
    /// Backend names as the rows show them (llama-bench style: `CPU`).
    pub backend: String,
    pub threads: usize,
    /// The KV cache type the engine chose (`auto` resolved), as the rows show it.
    pub type_kv: String,
}

/// `0` means the number of physical cores, as the CPU backend counts them.
pub fn resolve_threads(t: usize) -> usize {
    if t > 0 {
        t
    } else {
        minfer_engine::backends::cpu::physical_cores()
    }
}

struct EngineTarget(Engine);

impl Target for EngineTarget {
    fn kv_clear(&mut self) {
        self.0.kv_clear();
    }
    fn decode(
        &mut self,
        tokens: &[u32],
        pos0: usize,
        n_out: usize,
        class: RowClass,
    ) -> anyhow::Result<()> {
        match class {
            RowClass::Prompt => self.0.decode(tokens, pos0, n_out)?,
            RowClass::Generation => self.0.decode_generated(tokens, pos0, n_out)?,
        };
        Ok(())
    }
    fn n_batch(&self) -> usize {
        self.0.n_batch()
    }
    fn seq_create(&mut self) -> SeqId {
        self.0.seq_create()
    }
    fn seq_clear(&mut self, seq: SeqId) -> anyhow::Result<()> {
        self.0.seq_clear(seq)?;
        Ok(())
    }
    fn seq_remove(&mut self, seq: SeqId, range: std::ops::Range<usize>) -> anyhow::Result<()> {
        self.0.seq_remove(seq, range)?;
        Ok(())
    }
    fn seq_copy_prefix(&mut self, dst: SeqId, src: SeqId, n: usize) -> anyhow::Result<()> {
        self.0.seq_copy_prefix(dst, src, n)?;
        Ok(())
    }
    fn forward_batch(&mut self, entries: &[BatchEntry]) -> anyhow::Result<()> {
        self.0.forward_batch(entries)?;
        Ok(())
    }
    fn set_kv_placement(&mut self, placement: minfer_engine::KvPlacement) {
        self.0.set_kv_placement(placement);
    }
    fn defrags(&self) -> usize {
        self.0.defrags()
    }
    fn trace_begin(&mut self) -> anyhow::Result<()> {
        self.0.trace_begin()?;
        Ok(())
    }
    fn trace_end(&mut self, path: &Path) -> anyhow::Result<usize> {
        let t = self.0.trace_end()?.context("the trace was not recorded")?;
        let tok = minfer_tokenizer::Tokenizer::from_metadata(self.0.model().metadata())
            .context("cannot build the tokenizer (the trace's token text)")?;
        t.write(path, &minfer_generate::chat::Pieces(&tok))
            .with_context(|| format!("cannot write {}", path.display()))?;
        Ok(t.phases.len())
    }
}

pub fn load(path: &Path, args: &Args, threads: usize, n_ctx: usize) -> anyhow::Result<Loaded> {
    let ids = backends::resolve(&args.backends)?;
    let numerics =
        minfer_engine::backends::cpu::Numerics::parse(&args.numerics).ok_or_else(|| {
            anyhow::anyhow!(
                "--numerics {}: expected one of {}",
                args.numerics,
                minfer_engine::backends::cpu::Numerics::NAMES.join(", ")
            )
        })?;
    // Named by backend id (the CPU first), as before the ids came in priority order.
    let mut by_id = ids.clone();
    by_id.sort_unstable();
    let mut backend = by_id
        .iter()
        .map(|&id| backends::name_of(id).to_ascii_uppercase())
        .collect::<Vec<_>>()
        .join(",");
    if numerics != minfer_engine::backends::cpu::Numerics::Native {
        backend = format!("{backend} ({})", numerics.name());
    }
    let threads = resolve_threads(threads);
    let asked = args.cache_type.as_deref().unwrap_or("f16");
    let cache_type_auto = asked.trim().eq_ignore_ascii_case("auto");
    let cache_type = if cache_type_auto {
        minfer_gguf::GgmlType::F32
    } else {
        parse_cache_type(asked)?
    };
    let (cache_type, cache_type_auto) =
        crate::commands::args::auto_for_numerics(cache_type, cache_type_auto, numerics);
    let mut cfg = EngineConfig {
        n_ctx,
        threads,
        cache_type,
        cache_type_auto,
        backends: args.backends.clone(),
        n_batch: args.n_batch,
        ..EngineConfig::default()
    }
    .with_numerics(numerics);
    args.offload.apply(&mut cfg);
    let engine =
        Engine::load(path, cfg).with_context(|| format!("cannot load {}", path.display()))?;
    // What kept the model off a device (a backend that holds none of its weights).
    for line in engine.placement_report() {
        eprintln!("note: {line}");
    }
    args.offload.report(&engine);
    let facts = model_facts(engine.model(), path);
    let type_kv = engine.cache_type().name().to_ascii_lowercase();
    Ok(Loaded {
        type_kv,
        target: Box::new(EngineTarget(engine)),
        facts,
        backend,
        threads,
    })
}
