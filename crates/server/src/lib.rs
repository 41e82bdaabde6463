//! `minfer serve`: an OpenAI-compatible HTTP server over one engine, with continuous
//! batching and prefix caching.
//!
//! - [`AppState::start`] moves a loaded [`Engine`] onto the engine-loop thread
//!   ([`engine_loop`], over `minfer_generate::sched`) and keeps what handlers need (tokenizer, template, limits, metrics).
//! - [`app`] builds the router (tests call it without a socket); [`serve`] runs it on a
//!   listener with graceful shutdown (SIGINT/SIGTERM: stop accepting, 503 new requests,
//!   let in-flight ones finish within the drain timeout).
//! - Handlers validate a request completely ([`request`]) before it takes a place in the
//!   bounded queue; errors are OpenAI-shaped ([`error`]).

pub mod constraint;
pub mod engine_loop;
pub mod error;
pub mod metrics;
pub mod page;
pub mod prompt;
pub mod request;
pub mod routes;
pub mod shutdown;
pub mod submit;
pub mod tools;
pub mod viz;

use anyhow::Context;
use engine_loop::{EngineLoop, Faults, Job, LoopConfig, LoopShared, LoopStats};
use metrics::Metrics;
use minfer_engine::Engine;
use minfer_tokenizer::template::ChatTemplate;
use minfer_tokenizer::Tokenizer;
use request::Limits;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

pub use routes::app;
pub use shutdown::serve;

/// Server settings (the engine's are in its own config).
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// The name `/v1/models` reports.
    pub model_id: String,
    /// Most sequences running at once (`--parallel`).
    pub parallel: usize,
    /// Most requests waiting for a sequence (`--queue`); beyond it 503.
    pub queue: usize,
    /// Most prompt tokens one forward reads (`--chunk`).
    pub chunk: usize,
    /// `Authorization: Bearer KEY` required on every route but `/health` and the page.
    pub api_key: Option<String>,
    /// Parse special-token text in raw completion prompts (`--no-parse-special` turns it off).
    pub parse_special: bool,
    /// Largest request body accepted (`--max-body-bytes`).
    pub body_limit: usize,
    /// How long in-flight requests may run after SIGINT/SIGTERM.
    pub drain_timeout: Duration,
    /// How long a client may take to send a request's headers (`--header-timeout`); past
    /// it the connection is closed (slow-loris clients cannot hold connections open).
    pub header_timeout: Duration,
    /// Most choices per request (`--max-n`); None: `parallel`.
    pub max_n: Option<usize>,
    /// Most prompt tokens (`--max-prompt-tokens`); None: the context less one.
    pub max_prompt_tokens: Option<usize>,
    /// Most tokens generated per request, `max_tokens` × `n` (`--max-total-tokens`); None:
    /// the context × `max_n`, what the cells could hold.
    pub max_total_tokens: Option<usize>,
    /// Most bytes of a chat request's `tools` as JSON (`--max-tools-bytes`).
    pub max_tools_bytes: usize,
    /// The one origin browsers may call the API from (`--cors-origin`); None: no CORS
    /// headers at all, so browsers refuse cross-origin calls.
    pub cors_origin: Option<String>,
    /// Prompt lookup for the requests that do not say (`--lookup[=N]`, `--draft-max`): only
    /// those it is exact for, greedy and unconstrained (request::speculative).
    pub lookup: Option<minfer_generate::lookup::LookupConfig>,
    /// A draft model or self-drafting for the requests that do not say (`--draft MODEL`,
    /// `--self-draft LAYERS`): every request lookup would support drafts with it, each
    /// running sequence on a draft sequence of its own, the draft's forwards batched across
    /// them (request::speculative). Not with `lookup`.
    pub draft: Option<minfer_generate::draft::DraftHandle>,
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            model_id: "minfer".into(),
            parallel: 8,
            queue: 64,
            chunk: 512,
            api_key: None,
            parse_special: true,
            body_limit: 4 << 20,
            drain_timeout: Duration::from_secs(30),
            header_timeout: Duration::from_secs(10),
            max_n: None,
            max_prompt_tokens: None,
            max_total_tokens: None,
            max_tools_bytes: 256 << 10,
            cors_origin: None,
            lookup: None,
            draft: None,
        }
    }
}

pub struct AppState {
    pub cfg: ServeConfig,
    pub tok: Arc<Tokenizer>,
    /// None when the model has no usable chat template (chat requests are refused).
    pub template: Option<ChatTemplate>,
    pub template_error: Option<String>,
    pub limits: Limits,
    pub eog: Vec<u32>,
    jobs: Mutex<mpsc::Sender<Job>>,
    /// Requests accepted and not yet admitted by the engine loop.
    pub queued: Arc<AtomicUsize>,
    /// Requests being answered (queued, running or streaming).
    pub in_flight: AtomicUsize,
    pub draining: AtomicBool,
    /// Ends every request left in the engine loop (shutdown, after the drain).
    pub abort: Arc<AtomicBool>,
    pub metrics: Arc<Metrics>,
    pub faults: Arc<Faults>,
    pub stats: Arc<LoopStats>,
    /// Unix seconds the server started (`created` of `/v1/models`).
    pub created: u64,
    /// The grammar factory over the vocabulary, built on the first constrained request.
    pub grammars: std::sync::OnceLock<Result<Arc<minfer_generate::constrain::Grammars>, String>>,
}

impl AppState {
    /// Starts the engine loop on its own thread with `engine`, which it then owns.
    pub fn start(engine: Engine, cfg: ServeConfig) -> anyhow::Result<Arc<AppState>> {
        if cfg.lookup.is_some() && cfg.draft.is_some() {
            anyhow::bail!("one default drafter at a time: prompt lookup or a draft model");
        }
        let md = engine.model().metadata();
        let tok = Arc::new(Tokenizer::from_metadata(md).context("cannot build the tokenizer")?);
        let (template, template_error) = match ChatTemplate::from_metadata(md) {
            Ok(l) => {
                if let Some(n) = &l.notice {
                    tracing::info!("note: {n}");
                }
                (Some(l.template), None)
            }
            Err(e) => (None, Some(e.to_string())),
        };
        let n_ctx = engine.n_ctx();
        let max_n = cfg.max_n.unwrap_or(cfg.parallel).min(cfg.parallel);
        let limits = Limits {
            n_ctx,
            max_n,
            vocab: engine.hparams().vocab_size,
            max_prompt_tokens: cfg.max_prompt_tokens.unwrap_or(n_ctx),
            max_total_tokens: cfg.max_total_tokens.unwrap_or(n_ctx.saturating_mul(max_n)),
            max_tools_bytes: cfg.max_tools_bytes,
        };
        let eog = tok.eog_ids().to_vec();
        let metrics = Arc::new(Metrics::new());
        let faults = Arc::new(Faults::default());
        let stats = Arc::new(LoopStats::default());
        let queued = Arc::new(AtomicUsize::new(0));
        let abort = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        let lp = EngineLoop::new(
            engine,
            tok.clone(),
            LoopConfig {
                parallel: cfg.parallel,
                chunk: cfg.chunk,
                cache_entries: 64.max(cfg.parallel * 2),
            },
            LoopShared {
                metrics: metrics.clone(),
                faults: faults.clone(),
                stats: stats.clone(),
                queued: queued.clone(),
                abort: abort.clone(),
                draft: cfg.draft.clone(),
            },
        );
        std::thread::Builder::new()
            .name("minfer-engine".into())
            .spawn(move || lp.run(rx))
            .context("cannot start the engine thread")?;
        let created = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Ok(Arc::new(AppState {
            cfg,
            tok,
            template,
            template_error,
            limits,
            eog,
            jobs: Mutex::new(tx),
            queued,
            in_flight: AtomicUsize::new(0),
            draining: AtomicBool::new(false),
            abort,
            metrics,
            faults,
            stats,
            created,
            grammars: std::sync::OnceLock::new(),
        }))
    }
}
