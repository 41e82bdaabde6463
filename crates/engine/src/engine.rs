//! The model engine: one loaded model, its backends, graph cache and the KV of one
//! sequence.
//!
//! ```no_run
//! use minfer_engine::{Engine, EngineConfig};
//! let mut e = Engine::load("model.gguf", EngineConfig::default())?;
//! let prompt = [785u32, 6722, 315];
//! // Prefill: tokens at positions 0.., logits of the last row only.
//! let logits = e.decode(&prompt, 0, 1)?;
//! let next = logits
//!     .iter()
//!     .enumerate()
//!     .max_by(|a, b| a.1.total_cmp(b.1))
//!     .map(|(i, _)| i as u32)
//!     .unwrap();
//! // Decode: one token at the next position; the graph is reused, never rebuilt.
//! let logits = e.decode(&[next], prompt.len(), 1)?;
//! # Ok::<(), minfer_engine::Error>(())
//! ```
//!
//! - [`Engine::load`] resolves the requested backends first (unknown, not compiled in and
//!   unavailable are distinct errors, before the model is read), then maps the GGUF (weights
//!   are read zero-copy from the mmap), checks the architecture, hyperparameters and every
//!   tensor's shape.
//! - [`Engine::decode`] appends `tokens` at positions `pos0..` (a `pos0` below the current
//!   length first drops the tail, like [`Engine::kv_truncate`]) and returns the logits of the
//!   last `n_out` rows, `vocab` floats each, row-major. Going past `n_ctx` is
//!   [`Error::ContextOverflow`].
//! - [`Engine::kv_clear`] / [`Engine::kv_truncate`] forget cells; the regions stay allocated.

use crate::backends;
use minfer_gguf::{GgmlType, GgufModel};
use minfer_graph::{
    dump, sched, Allocator, Backend, GraphCache, GraphParams, InputKind, Node, Op, WeightRef,
    WeightSource,
};
use minfer_models::{build_graph, check_tensors, output_weight_name, HParams};
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Gguf(#[from] minfer_gguf::Error),
    #[error(transparent)]
    Model(#[from] minfer_models::Error),
    #[error(transparent)]
    Graph(#[from] minfer_graph::Error),
    #[error("context overflow: {n_tokens} tokens at position {pos0} exceed n_ctx {n_ctx}")]
    ContextOverflow {
        pos0: usize,
        n_tokens: usize,
        n_ctx: usize,
    },
    #[error("decode at position {pos0}, but the sequence holds only {n_past} tokens (positions must be contiguous)")]
    PositionGap { pos0: usize, n_past: usize },
    #[error("token id {id} at index {index} is outside the vocabulary of {vocab}")]
    TokenOutOfRange { id: u32, index: usize, vocab: usize },
    #[error("bad decode request: {0}")]
    BadRequest(String),
    #[error("cache type {0}: {1}")]
    CacheType(String, String),
    #[error(transparent)]
    Kv(#[from] crate::kv::KvError),
    #[error(transparent)]
    Session(#[from] crate::session::SessionError),
}

pub type Result<T> = std::result::Result<T, Error>;

/// KV cache element types, as `--cache-type` spells them.
pub fn parse_cache_type(s: &str) -> Result<GgmlType> {
    match s.trim().to_ascii_lowercase().as_str() {
        "f32" => Ok(GgmlType::F32),
        "f16" => Ok(GgmlType::F16),
        "q8_0" => Ok(GgmlType::Q8_0),
        other => Err(Error::CacheType(
            other.into(),
            "expected f32, f16 or q8_0".into(),
        )),
    }
}

#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Context length (KV cells); 0 means the model's `context_length`.
    pub n_ctx: usize,
    /// CPU threads; 0 means the number of physical cores.
    pub threads: usize,
    pub cache_type: GgmlType,
    /// `--backend` names; empty means every available backend.
    pub backends: Vec<String>,
    /// Bytes each backend may allocate for KV regions and activations (None: unbounded).
    pub memory_budget: Option<usize>,
    /// The CPU kernels' float arithmetic (`--numerics`).
    pub numerics: minfer_cpu::Numerics,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            n_ctx: 4096,
            threads: 0,
            cache_type: GgmlType::F32,
            backends: Vec::new(),
            memory_budget: None,
            numerics: minfer_cpu::Numerics::Native,
        }
    }
}

/// Weights straight from the mapped GGUF.
struct Weights<'a>(&'a GgufModel);

impl WeightSource for Weights<'_> {
    fn weight(&self, name: &str) -> Option<WeightRef<'_>> {
        let (info, bytes) = self.0.tensor_data(name).ok()?;
        let ne0 = *info.dims.first()? as usize;
        Some(WeightRef {
            ty: info.ty,
            ne0,
            ne1: (info.n_elements() as usize) / ne0.max(1),
            bytes,
        })
    }
}

pub struct Engine {
    model: GgufModel,
    hp: HParams,
    output_weight: &'static str,
    backends: Vec<Box<dyn Backend>>,
    cache: GraphCache,
    alloc: Allocator,
    n_ctx: usize,
    cache_type: GgmlType,
    n_past: usize,
    logits: Vec<f32>,
}

impl Engine {
    pub fn load(path: impl AsRef<Path>, cfg: EngineConfig) -> Result<Engine> {
        let ids = backends::resolve(&cfg.backends)?;
        if cfg.numerics != minfer_cpu::Numerics::Native && cfg.cache_type != GgmlType::F16 {
            return Err(Error::CacheType(
                cfg.cache_type.name().into(),
                format!("--numerics {} needs an f16 KV cache", cfg.numerics.name()),
            ));
        }
        let backends = backends::instantiate(&ids, cfg.threads, cfg.numerics)?;
        let model = GgufModel::open(path)?;
        let hp = HParams::from_metadata(model.metadata())?;
        check_tensors(&model, &hp)?;
        if !minfer_cpu::KV_TYPES.contains(&cfg.cache_type) {
            return Err(Error::CacheType(
                cfg.cache_type.name().into(),
                "expected f32, f16 or q8_0".into(),
            ));
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
        let output_weight = output_weight_name(&model);
        let mut alloc = Allocator::new();
        if let Some(b) = cfg.memory_budget {
            for be in &backends {
                alloc.set_budget(be.id(), b);
            }
        }
        Ok(Engine {
            model,
            hp,
            output_weight,
            backends,
            cache: GraphCache::new(4),
            alloc,
            n_ctx,
            cache_type: cfg.cache_type,
            n_past: 0,
            logits: Vec::new(),
        })
    }

    pub fn hparams(&self) -> &HParams {
        &self.hp
    }
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }
    /// Tokens currently in the KV of the sequence.
    pub fn n_past(&self) -> usize {
        self.n_past
    }
    /// Graphs built so far (a decode step that reuses the cached graph does not add one).
    pub fn graph_builds(&self) -> usize {
        self.cache.builds()
    }
    /// Bytes allocated on the CPU backend (KV regions and activation buffers).
    pub fn cpu_bytes_in_use(&self) -> usize {
        self.alloc.in_use(minfer_cpu::CPU_ID)
    }
    pub fn model(&self) -> &GgufModel {
        &self.model
    }

    pub fn kv_clear(&mut self) {
        self.n_past = 0;
    }

    /// Keeps the first `n` tokens.
    pub fn kv_truncate(&mut self, n: usize) {
        self.n_past = self.n_past.min(n);
    }

    fn params(&self, n_tokens: usize, n_out: usize) -> GraphParams {
        GraphParams {
            n_tokens,
            n_out,
            n_ctx: self.n_ctx,
            cache_type: self.cache_type,
        }
    }

    /// Appends `tokens` at positions `pos0..` and returns the logits of the last `n_out` rows.
    pub fn decode(&mut self, tokens: &[u32], pos0: usize, n_out: usize) -> Result<&[f32]> {
        let nt = tokens.len();
        if nt == 0 || n_out == 0 || n_out > nt {
            return Err(Error::BadRequest(format!(
                "{nt} tokens, n_out {n_out}: need 1 <= n_out <= tokens"
            )));
        }
        if pos0 > self.n_past {
            return Err(Error::PositionGap {
                pos0,
                n_past: self.n_past,
            });
        }
        if pos0 + nt > self.n_ctx {
            return Err(Error::ContextOverflow {
                pos0,
                n_tokens: nt,
                n_ctx: self.n_ctx,
            });
        }
        let vocab = self.hp.vocab_size;
        if let Some((index, &id)) = tokens
            .iter()
            .enumerate()
            .find(|(_, &t)| t as usize >= vocab)
        {
            return Err(Error::TokenOutOfRange { id, index, vocab });
        }
        let params = self.params(nt, n_out);
        let (graph, plan) = prepare(
            &mut self.cache,
            &self.hp,
            self.output_weight,
            &mut self.backends,
            &self.model,
            &mut self.alloc,
            &params,
        )?;
        let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        let pos: Vec<i32> = (pos0..pos0 + nt).map(|p| p as i32).collect();
        // One sequence: cell = position, and each query sees cells [0, its position].
        let span: Vec<i32> = pos.iter().flat_map(|&p| [0, p + 1]).collect();
        let be = &mut self.backends;
        sched::fill_input(graph, plan, be, InputKind::TokenIds, &ids)?;
        sched::fill_input(graph, plan, be, InputKind::Positions, &pos)?;
        sched::fill_input(graph, plan, be, InputKind::KvCells, &pos)?;
        sched::fill_input(graph, plan, be, InputKind::AttnSpan, &span)?;
        if n_out < nt {
            let tail: Vec<i32> = ((nt - n_out)..nt).map(|i| i as i32).collect();
            sched::fill_input(graph, plan, be, InputKind::TailIds, &tail)?;
        }
        sched::execute(graph, plan, be, &Weights(&self.model))?;
        sched::read_output(graph, plan, be, &mut self.logits)?;
        self.n_past = pos0 + nt;
        Ok(&self.logits)
    }

    /// The graph of a request shape as Graphviz DOT, coloured by backend.
    pub fn graph_dot(&mut self, n_tokens: usize, n_out: usize) -> Result<String> {
        let (g, _) = self.graph_for(n_tokens, n_out)?;
        Ok(dump::to_dot(g, &backends::name_of))
    }

    /// The graph of a request shape as JSON.
    pub fn graph_json(&mut self, n_tokens: usize, n_out: usize) -> Result<String> {
        let (g, _) = self.graph_for(n_tokens, n_out)?;
        Ok(dump::to_json(g, &backends::name_of))
    }

    fn graph_for(
        &mut self,
        n_tokens: usize,
        n_out: usize,
    ) -> Result<(&minfer_graph::Graph, &minfer_graph::Plan)> {
        let params = self.params(n_tokens, n_out);
        prepare(
            &mut self.cache,
            &self.hp,
            self.output_weight,
            &mut self.backends,
            &self.model,
            &mut self.alloc,
            &params,
        )
    }
}

/// Builds (or reuses) the graph for a request shape.
fn prepare<'c>(
    cache: &'c mut GraphCache,
    hp: &HParams,
    output_weight: &str,
    backends: &mut [Box<dyn Backend>],
    model: &GgufModel,
    alloc: &mut Allocator,
    params: &GraphParams,
) -> Result<(&'c minfer_graph::Graph, &'c minfer_graph::Plan)> {
    let build = |p: &GraphParams| {
        build_graph(hp, output_weight, p).map_err(|e| minfer_graph::Error::Graph(e.to_string()))
    };
    let n_ctx = params.n_ctx;
    let kv_bytes = |n: &Node| -> minfer_graph::Result<usize> {
        let ty = match &n.op {
            Op::KvStore { cache_type, .. } | Op::Attention { cache_type, .. } => *cache_type,
            _ => return Ok(0),
        };
        let n_embd_kv = (hp.head_count_kv * hp.head_dim) as u64;
        let row = ty
            .row_bytes(n_embd_kv)
            .ok_or_else(|| minfer_graph::Error::Kv {
                layer: n.layer.unwrap_or(0),
                problem: format!("a row of {n_embd_kv} is not whole {ty} blocks"),
            })?;
        Ok(row as usize * n_ctx)
    };
    Ok(cache.get_or_build(params, &build, &kv_bytes, backends, &Weights(model), alloc)?)
}

impl crate::generate::LogitsModel for Engine {
    type Error = Error;
    fn forward(&mut self, tokens: &[u32], pos0: usize) -> Result<&[f32]> {
        self.decode(tokens, pos0, 1)
    }
    fn context_len(&self) -> usize {
        self.n_ctx
    }
}

/// What the KV operations ([`crate::kv`]) and session files ([`crate::session`]) reach into.
pub(crate) struct KvAccess<'a> {
    pub backends: &'a mut [Box<dyn Backend>],
    pub alloc: &'a Allocator,
    pub hp: &'a HParams,
    pub cache_type: GgmlType,
    pub n_ctx: usize,
    pub n_past: &'a mut usize,
}

impl Engine {
    /// The KV element type.
    pub fn cache_type(&self) -> GgmlType {
        self.cache_type
    }

    pub(crate) fn kv_region(&self, layer: usize) -> Option<minfer_graph::KvRegion> {
        self.alloc.kv_region(layer)
    }

    pub(crate) fn kv_access(&mut self) -> KvAccess<'_> {
        KvAccess {
            backends: &mut self.backends,
            alloc: &self.alloc,
            hp: &self.hp,
            cache_type: self.cache_type,
            n_ctx: self.n_ctx,
            n_past: &mut self.n_past,
        }
    }

    /// Creates the per-layer KV regions if no graph has run yet (planning the decode graph
    /// allocates them).
    pub(crate) fn ensure_kv_regions(&mut self) -> Result<()> {
        self.graph_for(1, 1).map(|_| ())
    }
}
