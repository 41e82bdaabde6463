//! The model engine: one loaded model, its backends, graph cache and the KV cache of many
//! sequences.
//!
//! ```no_run
//! use minfer_engine::{BatchEntry, Engine, EngineConfig};
//! let mut e = Engine::load("model.gguf", EngineConfig::default())?;
//! let (a, b) = (e.seq_create(), e.seq_create());
//! // One forward for two sequences: each entry's last row gets logits.
//! let out = e.forward_batch(&[
//!     BatchEntry::new(a, &[785, 6722, 315], 0),
//!     BatchEntry::new(b, &[9707, 11], 0),
//! ])?;
//! let next_a = out.logits(0).len();
//! # let _ = next_a;
//! # Ok::<(), minfer_engine::Error>(())
//! ```
//!
//! - [`Engine::load`] resolves the requested backends first (unknown, not compiled in and
//!   unavailable are distinct errors, before the model is read), then maps the GGUF (weights
//!   are read zero-copy from the mmap), checks the architecture, hyperparameters and every
//!   tensor's shape, and places the weights on the backends (once; [`Engine::placement_report`]
//!   says what kept the model off a device).
//! - [`Engine::forward_batch`] ([`crate::batch`]) runs entries of several sequences as one
//!   forward; [`Engine::decode`] is the one-sequence form on the default sequence, kept for
//!   the CLI's single-user paths.
//! - KV operations on sequences are in [`crate::kv`], session files in [`crate::session`].

use crate::backends;
pub use crate::config::{auto_cache_type, parse_cache_type, EngineConfig};
pub use crate::error::{Error, Result};
use crate::kvcache::KvCache;
use crate::kvcells::{KvCells, Placement as KvPlacement, SeqId};
use crate::model::{BatchEntry, BatchLogits, LogitsModel};
use crate::runner::ModelRunner;
use minfer_gguf::{GgmlType, GgufModel};
use minfer_graph::{dump, RowClass, WindowLayout};
use minfer_models::{check_tensors, HParams};
use std::path::Path;
use std::sync::Arc;

pub struct Engine {
    /// The model on its backends: graphs, plans, weights, the output buffer.
    pub(crate) runner: ModelRunner,
    /// The cell table of every sequence and the staging onto it.
    pub(crate) kv: KvCache,
    pub(crate) n_batch: usize,
    /// Faults a test armed, by sequence ([`crate::faults`]); empty in normal use.
    pub(crate) faults: Vec<(SeqId, crate::faults::InjectedFault)>,
}

impl Engine {
    pub fn load(path: impl AsRef<Path>, cfg: EngineConfig) -> Result<Engine> {
        let ids = backends::resolve(&cfg.backends)?;
        // The model is read first: a device backend starts compiling its kernels when it is
        // made, and a bad file should not wait for that compile (a dropped compile waits for
        // its threads: crates/cuda/src/compile.rs).
        let model = GgufModel::open(path)?;
        let hp = HParams::from_metadata(model.metadata())?;
        check_tensors(&model, &hp)?;
        let backends = backends::instantiate(&ids, cfg.threads, &cfg.settings)?;
        Engine::on_model(&ids, backends, Arc::new(model), hp, cfg, None)
    }

    /// A self-drafting engine (issue 31, `--self-draft LAYERS`): this engine's first `layers`
    /// blocks, then its final norm and output head, over the same weights, with its own
    /// graphs and its own KV cells for those blocks (ADR 0013 says why not the target's).
    /// `cfg` is the draft's (its context, threads, batch, backends). On the CPU the matrices
    /// are the same mapping read in place (the `Arc`'d model); on a device backend the draft
    /// runs on a sibling of this engine's backend ([`minfer_graph::Memory::sibling`]): the
    /// same device context, compiled kernels and resident weights, nothing uploaded or
    /// compiled again, with its own queue, buffers and KV regions; its blocks and head go
    /// where this engine's are (the layer-offload plan's prefix). Refused by name: `layers`
    /// of 0 or not below the model's block count, and a device this engine does not run on
    /// (the draft's blocks would be uploaded there a second time).
    pub fn self_draft(&self, layers: usize, cfg: EngineConfig) -> Result<Engine> {
        let n = self.hparams().block_count;
        if layers == 0 || layers >= n {
            return Err(Error::SelfDraft(format!(
                "--self-draft {layers}: the draft takes the first LAYERS blocks of the model's {n}, so LAYERS must be 1 to {}",
                n.saturating_sub(1)
            )));
        }
        let ids = backends::resolve(&cfg.backends)?;
        let mut cfg = cfg;
        let mut made: Vec<Box<dyn minfer_graph::Backend>> = Vec::with_capacity(ids.len());
        // The free memory of the device the draft shares, asked before the draft takes any.
        let mut device_free = None;
        for &id in &ids {
            if !backends::is_device(id) {
                made.extend(backends::instantiate(&[id], cfg.threads, &cfg.settings)?);
                continue;
            }
            let origin = self
                .runner
                .backends()
                .iter()
                .find(|b| b.id() == id)
                .ok_or_else(|| {
                    Error::SelfDraft(format!(
                        "--self-draft on {}: the model does not run there, so the draft's blocks would be uploaded a second time (give the model's backend)",
                        backends::name_of(id)
                    ))
                })?;
            made.push(origin.sibling().map_err(|e| {
                Error::SelfDraft(format!("--self-draft on {}: {e}", backends::name_of(id)))
            })?);
            // Less this engine's KV while no forward has allocated it yet (regions are made
            // by the first graph planned): the device's memory is promised to it.
            let pending = match self.runner.kv_region(0) {
                Some(_) => 0,
                None => {
                    let plan = self.runner.kv_plan();
                    let n_blocks = self.hparams().block_count.max(1) as u64;
                    let on_device = self
                        .runner
                        .offload()
                        .map_or(n_blocks, |o| o.on_device as u64);
                    plan.bytes / n_blocks * on_device
                }
            };
            device_free = origin.free_memory().ok().map(|f| {
                let f = (f as u64).saturating_sub(pending) as usize;
                (origin.name().to_string(), f)
            });
            // The sibling holds the concatenations this engine's fusions made: the draft's
            // graphs take the same rewrites.
            cfg.settings.fusion = self.runner.graph_cache().fusion();
        }
        let mut hp = self.hparams().clone();
        hp.block_count = layers;
        if let Some((device, free)) = device_free {
            cfg.n_ctx = self_draft_context(&hp, &cfg, self.runner.offload(), &device, free)?;
        }
        // Each block where this engine runs it, the head where its head runs.
        let plan = self.runner.offload().map(|o| {
            let whole = o.on_device == o.n_layers && o.head_on_device;
            (o.on_device.min(layers), o.head_on_device, whole)
        });
        Engine::on_model(&ids, made, self.runner.model_arc(), hp, cfg, plan)
    }

    /// The control of the self-draft's sharing gates: the draft as it would be made without
    /// siblings, on backends of its own that place (upload, wrap, convert) the draft's weights
    /// again. Not for use: it holds a second copy of every drafted weight on a device.
    #[doc(hidden)]
    pub fn self_draft_copying(&self, layers: usize, cfg: EngineConfig) -> Result<Engine> {
        let ids = backends::resolve(&cfg.backends)?;
        let made = backends::instantiate(&ids, cfg.threads, &cfg.settings)?;
        let mut hp = self.hparams().clone();
        hp.block_count = layers.clamp(1, hp.block_count);
        Engine::on_model(&ids, made, self.runner.model_arc(), hp, cfg, None)
    }

    fn on_model(
        ids: &[minfer_graph::BackendId],
        backends: Vec<Box<dyn minfer_graph::Backend>>,
        model: Arc<GgufModel>,
        hp: HParams,
        cfg: EngineConfig,
        plan: Option<(usize, bool, bool)>,
    ) -> Result<Engine> {
        let mut cfg = cfg;
        if cfg.cache_type_auto && ids.iter().any(|&id| backends::is_device(id)) {
            cfg.cache_type = auto_cache_type(&hp);
        }
        for be in &backends {
            if let Err(why) = be.check_kv_type(cfg.cache_type) {
                return Err(Error::CacheType(cfg.cache_type.name().into(), why.0));
            }
        }
        if cfg.cache_type == GgmlType::Q8_0 && !hp.head_dim.is_multiple_of(32) {
            return Err(Error::CacheType(
                "q8_0".into(),
                format!(
                    "needs a head dim that is a multiple of 32, the model has {}",
                    hp.head_dim
                ),
            ));
        }
        let n_ctx = if cfg.n_ctx == 0 {
            hp.context_length
        } else {
            cfg.n_ctx
        };
        let runner = ModelRunner::new(backends, model, hp, n_ctx, &cfg, plan)?;
        // The runner may have sized the context from memory (crate::kvsize).
        let n_ctx = runner.n_ctx();
        Ok(Engine {
            runner,
            kv: KvCache::new(n_ctx),
            n_batch: cfg.n_batch.max(1),
            faults: Vec::new(),
        })
    }

    pub fn hparams(&self) -> &HParams {
        self.runner.hp()
    }
    /// KV cells of the arena (and most positions of one sequence).
    pub fn n_ctx(&self) -> usize {
        self.runner.n_ctx()
    }
    /// How the arena was sized, with the figures (the startup line).
    pub fn kv_plan(&self) -> &crate::KvPlan {
        self.runner.kv_plan()
    }
    /// Most tokens one forward takes.
    pub fn n_batch(&self) -> usize {
        self.n_batch
    }
    /// Positions the default sequence holds (one past its last position).
    pub fn n_past(&self) -> usize {
        self.kv.cells().next_pos(self.kv.default_seq()).unwrap_or(0)
    }
    /// Defragmentations of the KV arena run so far.
    pub fn defrags(&self) -> usize {
        self.kv.defrags()
    }
    /// Where new KV cells go when a sequence cannot grow in place (the default:
    /// [`KvPlacement::SERVER`], blocks).
    pub fn kv_placement(&self) -> KvPlacement {
        self.kv.cells().placement()
    }
    /// Places later KV cells as `placement` says (held cells stay where they are).
    pub fn set_kv_placement(&mut self, placement: KvPlacement) {
        self.kv.cells_mut().set_placement(placement);
    }
    /// Graphs built so far (a decode step that reuses a cached graph does not add one).
    pub fn graph_builds(&self) -> usize {
        self.runner.graph_cache().builds()
    }
    /// Graphs cached now, and the bytes of activation buffers their plans hold.
    pub fn graph_cache_usage(&self) -> (usize, usize) {
        (
            self.runner.graph_cache().len(),
            self.runner.graph_cache().bytes(),
        )
    }
    /// Bytes allocated on every backend (KV regions and activation buffers).
    pub fn bytes_in_use(&self) -> usize {
        self.runner
            .backends()
            .iter()
            .map(|b| self.runner.alloc().in_use(b.id()))
            .sum()
    }
    /// Bytes of weights this engine's device backends placed on their devices (uploaded,
    /// wrapped or converted; [`minfer_graph::Memory::weights_bytes`]): 0 for a self-draft on
    /// a device, whose backends read its target's.
    pub fn device_weights_bytes(&self) -> usize {
        self.runner
            .backends()
            .iter()
            .filter(|b| backends::is_device(b.id()))
            .map(|b| b.weights_bytes())
            .sum()
    }
    /// The device backend's free memory as it reports it (None: no device backend).
    pub fn device_free_memory(&self) -> Option<std::result::Result<usize, String>> {
        self.runner
            .backends()
            .iter()
            .find(|b| backends::is_device(b.id()))
            .map(|b| b.free_memory().map_err(|e| e.0))
    }
    /// Bytes allocated on the CPU backend (KV regions and activation buffers).
    pub fn cpu_bytes_in_use(&self) -> usize {
        self.runner.alloc().in_use(backends::CPU_ID)
    }
    pub fn model(&self) -> &GgufModel {
        self.runner.model()
    }
    /// The KV element type.
    pub fn cache_type(&self) -> GgmlType {
        self.runner.cache_type()
    }
    /// The layer-offload plan taken at load ([`crate::offload`]): None without a device
    /// backend, or when the device holds none of the weights.
    pub fn offload(&self) -> Option<&crate::offload::Offload> {
        self.runner.offload()
    }
    /// One line per backend that holds none of the model's weights, naming the weight and
    /// the reason (empty when every backend holds them).
    pub fn placement_report(&self) -> Vec<String> {
        self.runner.placement().report()
    }
    /// Live nodes of the graph for `n_tokens` tokens per backend name, in table order (the
    /// startup line, and the gate that a device engine really runs on the device).
    pub fn nodes_per_backend(&mut self, n_tokens: usize) -> Result<Vec<(String, usize)>> {
        let p = self.runner.params(n_tokens, 1, WindowLayout::Span);
        let mut counts = self.runner.inspect(&p, |g, _, backends| {
            let mut counts: Vec<(minfer_graph::BackendId, usize)> =
                backends.iter().map(|b| (b.id(), 0)).collect();
            for n in g.nodes.iter().filter(|n| !n.dead) {
                if let Some(c) = counts.iter_mut().find(|(id, _)| Some(*id) == n.backend) {
                    c.1 += 1;
                }
            }
            counts
        })?;
        counts.sort_by_key(|(id, _)| *id);
        Ok(counts
            .into_iter()
            .map(|(id, n)| (backends::name_of(id), n))
            .collect())
    }
    /// Per live node of the graph for `n_tokens` tokens: its block (None: inputs, embedding,
    /// final norm, head), the name of its backend and whether it reads weights (the gate that
    /// a layer-offload plan is honoured node by node).
    pub fn nodes_by_layer(
        &mut self,
        n_tokens: usize,
    ) -> Result<Vec<(Option<usize>, String, bool)>> {
        self.nodes_by_layer_of(n_tokens, minfer_graph::RowClass::Generation)
    }
    /// [`Engine::nodes_by_layer`] for the graph of `n_tokens` rows of one class (a graph of
    /// prompt rows may place nodes otherwise: streamed blocks, ADR 0014).
    pub fn nodes_by_layer_of(
        &mut self,
        n_tokens: usize,
        class: minfer_graph::RowClass,
    ) -> Result<Vec<(Option<usize>, String, bool)>> {
        let mut p = self.runner.params(n_tokens, 1, WindowLayout::Span);
        p.prompt_rows = class == minfer_graph::RowClass::Prompt;
        let nodes = self.runner.inspect(&p, |g, _, _| {
            g.nodes
                .iter()
                .filter(|n| !n.dead)
                .map(|n| (n.layer, n.backend, n.op.weights().next().is_some()))
                .collect::<Vec<_>>()
        })?;
        Ok(nodes
            .into_iter()
            .map(|(l, b, w)| (l, b.map_or_else(|| "none".into(), backends::name_of), w))
            .collect())
    }
    /// How many live nodes of each op (by [`minfer_graph::Op::name`]) the graph for
    /// `n_tokens` new tokens has, sorted by name (what fusion made of it).
    pub fn ops_in_graph(&mut self, n_tokens: usize) -> Result<Vec<(&'static str, usize)>> {
        let p = self.runner.params(n_tokens, 1, WindowLayout::Span);
        let mut counts = self.runner.inspect(&p, |g, _, _| {
            let mut counts: Vec<(&'static str, usize)> = Vec::new();
            for n in g.nodes.iter().filter(|n| !n.dead) {
                match counts.iter_mut().find(|(name, _)| *name == n.op.name()) {
                    Some(c) => c.1 += 1,
                    None => counts.push((n.op.name(), 1)),
                }
            }
            counts
        })?;
        counts.sort();
        Ok(counts)
    }
    /// How many KV cells the arena has and how many are free: the one answer to "is there
    /// room", asked by schedulers before they admit work.
    pub fn kv_budget(&self) -> crate::KvBudget {
        self.kv.budget()
    }
    /// The cell table of every sequence (read-only: change it through the `seq_*` calls).
    pub fn cells(&self) -> &KvCells {
        self.kv.cells()
    }
    /// The sequence the one-sequence API works on.
    pub fn default_seq(&self) -> SeqId {
        self.kv.default_seq()
    }

    /// Appends `tokens` to the default sequence at positions `pos0..` (a `pos0` below its
    /// length first drops the tail) and returns the logits of the last `n_out` rows, `vocab`
    /// floats each, row-major.
    ///
    /// The tokens are prompt rows (docs/PRECISION.md, "Row classes"): use
    /// [`Engine::decode_generated`] for tokens the caller sampled.
    pub fn decode(&mut self, tokens: &[u32], pos0: usize, n_out: usize) -> Result<&[f32]> {
        self.decode_rows(tokens, pos0, n_out, RowClass::Prompt)
    }

    /// [`Engine::decode`] of tokens the caller generated (sampled, or drafted and being
    /// verified): generation rows.
    pub fn decode_generated(
        &mut self,
        tokens: &[u32],
        pos0: usize,
        n_out: usize,
    ) -> Result<&[f32]> {
        self.decode_rows(tokens, pos0, n_out, RowClass::Generation)
    }

    fn decode_rows(
        &mut self,
        tokens: &[u32],
        pos0: usize,
        n_out: usize,
        class: RowClass,
    ) -> Result<&[f32]> {
        let nt = tokens.len();
        if nt == 0 || n_out == 0 || n_out > nt {
            return Err(Error::BadRequest(format!(
                "{nt} tokens, n_out {n_out}: need 1 <= n_out <= tokens"
            )));
        }
        if n_out > self.n_batch {
            return Err(Error::BadRequest(format!(
                "logits for {n_out} rows, more than n_batch {}",
                self.n_batch
            )));
        }
        let seq = self.kv.default_seq();
        // Checked whole before the first chunk runs, so a refusal changes nothing.
        let n_past = self.n_past();
        if pos0 > n_past {
            return Err(Error::PositionGap { pos0, n_past });
        }
        if pos0 + nt > self.runner.n_ctx() {
            return Err(Error::ContextOverflow {
                pos0,
                n_tokens: nt,
                n_ctx: self.runner.n_ctx(),
            });
        }
        let vocab = self.runner.hp().vocab_size;
        if let Some((index, &id)) = tokens
            .iter()
            .enumerate()
            .find(|(_, &t)| t as usize >= vocab)
        {
            return Err(Error::TokenOutOfRange { id, index, vocab });
        }
        // Chunks of at most n_batch tokens (the same bits as one forward: batch invariance);
        // the last chunk holds every row that needs logits.
        let mut start = 0;
        while start < nt {
            let rest = nt - start;
            let len = if rest <= self.n_batch {
                rest
            } else {
                self.n_batch.min(rest - n_out.min(rest)).max(1)
            };
            let last = start + len == nt;
            let entry = BatchEntry {
                seq,
                tokens: &tokens[start..start + len],
                pos0: pos0 + start,
                logits: if last { n_out } else { 0 },
                class,
            };
            self.forward_batch(std::slice::from_ref(&entry))
                .map_err(|e| match e {
                    Error::Entry { source, .. } => *source,
                    e => e,
                })?;
            start += len;
        }
        Ok(self.runner.out().logits(0))
    }

    /// The graph of a request shape as Graphviz DOT, coloured by backend.
    pub fn graph_dot(&mut self, n_tokens: usize, n_out: usize) -> Result<String> {
        self.graph_dump(n_tokens, n_out, dump::to_dot)
    }

    /// The graph of a request shape as JSON.
    pub fn graph_json(&mut self, n_tokens: usize, n_out: usize) -> Result<String> {
        self.graph_dump(n_tokens, n_out, dump::to_json)
    }

    /// The decode graph (one token, one output row) as `minfer viz` draws it
    /// ([`minfer_graph::viz::to_viz`]).
    pub fn graph_viz(&mut self) -> Result<serde_json::Value> {
        let p = self.runner.params(1, 1, WindowLayout::Span);
        self.runner.inspect(&p, |g, weights, _| {
            minfer_graph::viz::to_viz(g, &backends::name_of, weights)
        })
    }

    /// Builds (or reuses) the graph of a request shape and exports it with `export`.
    fn graph_dump(
        &mut self,
        n_tokens: usize,
        n_out: usize,
        export: fn(
            &minfer_graph::Graph,
            &dyn Fn(minfer_graph::BackendId) -> String,
            dump::WeightNames,
        ) -> String,
    ) -> Result<String> {
        let p = self.runner.params(n_tokens, n_out, WindowLayout::Span);
        self.runner.inspect(&p, |g, weights, _| {
            export(g, &backends::name_of, &|w| {
                minfer_graph::WeightSource::name(weights, w).to_string()
            })
        })
    }
}

/// The context a self-draft on a device takes: `cfg`'s, or, when its KV would not fit the
/// device's free memory (less the target's KV not yet allocated) less the reserve for
/// activations ([`crate::kvsize::KV_RESERVE`]), the
/// cells that do fit (a target whose context was sized from the free memory left little:
/// `serve` on CUDA; the draft's `n_ctx` says it, and the CLI's startup line). A smaller
/// draft context only drafts less (a proposal that would not fit is not made); under 64
/// cells the self-draft is refused by name with the figures. A
/// context sized from memory (`--kv-mem`) is left to the KV plan.
fn self_draft_context(
    hp: &HParams,
    cfg: &EngineConfig,
    offload: Option<&crate::offload::Offload>,
    device: &str,
    free: usize,
) -> Result<usize> {
    const MIN_CELLS: u64 = 64;
    let n_ctx = if cfg.n_ctx == 0 {
        hp.context_length
    } else {
        cfg.n_ctx
    };
    if !matches!(cfg.kv_size, crate::KvSize::Tokens) {
        return Ok(n_ctx);
    }
    let ty = if cfg.cache_type_auto {
        auto_cache_type(hp)
    } else {
        cfg.cache_type
    };
    let row = ty
        .row_bytes((hp.head_count_kv * hp.head_dim) as u64)
        .unwrap_or(0);
    // Only the blocks on the device keep their KV there.
    let on_device = offload.map_or(hp.block_count, |o| o.on_device.min(hp.block_count));
    let per_cell = 2 * row * on_device as u64;
    if per_cell == 0 {
        return Ok(n_ctx);
    }
    let budget = (free as u64).saturating_sub(crate::kvsize::KV_RESERVE);
    let fits = (budget / per_cell).saturating_sub(1);
    if fits >= n_ctx as u64 {
        return Ok(n_ctx);
    }
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    if fits < MIN_CELLS {
        return Err(Error::SelfDraft(format!(
            "--self-draft on {device}: its KV for {on_device} blocks needs {:.1} MiB for {n_ctx} tokens, and {device} has {:.1} MiB free less the {:.1} MiB reserve for activations ({fits} tokens); give the model a smaller context (-c or --kv-mem)",
            mib(per_cell * (n_ctx as u64 + 1)),
            mib(free as u64),
            mib(crate::kvsize::KV_RESERVE)
        )));
    }
    Ok(fits as usize)
}

impl LogitsModel for Engine {
    type Error = Error;
    fn forward_batch(&mut self, entries: &[BatchEntry]) -> Result<&BatchLogits> {
        Engine::forward_batch(self, entries)
    }
    fn context_len(&self) -> usize {
        self.runner.n_ctx()
    }
    fn max_batch(&self) -> usize {
        self.n_batch
    }
    fn default_seq(&self) -> SeqId {
        self.kv.default_seq()
    }
    fn seq_truncate(&mut self, seq: SeqId, len: usize) -> Result<()> {
        Engine::seq_truncate(self, seq, len)
    }
    fn failed_entry(error: &Error) -> Option<usize> {
        match error {
            Error::Entry { entry, .. } => Some(*entry),
            _ => None,
        }
    }
}
