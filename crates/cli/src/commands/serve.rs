//! `minfer serve [-m MODEL] [--host 127.0.0.1] [--port 8080] …`: the OpenAI-compatible
//! server (crate `minfer-server`); this module only maps flags to its config.

use super::args::ModelArgs;
use super::spec_args::SpecArgs;
use crate::usage;
use anyhow::Context;
use clap::Args as ClapArgs;
use minfer_server::{AppState, ServeConfig};
use std::time::Duration;

#[derive(ClapArgs, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    // The server's default speculation: requests that do not say (`"speculative"` absent
    // or null) get prompt lookup, the draft model or self-drafting wherever it is supported
    // (all but mirostat sampling, which decodes plainly). A request's own `"speculative"`
    // overrides it (`false`: off; `{"draft": false}`: not the draft model; `{"lookup": N}`:
    // lookup, also on a server that drafts with a model).
    #[command(flatten)]
    pub spec: SpecArgs,
    /// Address to bind: an IP address or a host name such as localhost (loopback unless
    /// told otherwise).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to bind (0 picks a free one; the address is printed).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Sequences generated at once (continuous batching).
    #[arg(long, default_value_t = 8)]
    pub parallel: usize,
    /// Requests that may wait for a sequence; beyond it 503 with Retry-After.
    #[arg(long, default_value_t = 64)]
    pub queue: usize,
    /// Most prompt tokens one forward reads, so long prompts do not stall running streams.
    #[arg(long, default_value_t = 512)]
    pub chunk: usize,
    /// Require `Authorization: Bearer KEY` on every API route (not /health, nor the chat
    /// page at /, which asks for the key itself). Not empty. Also from --api-key-file or
    /// the environment variable MINFER_API_KEY (a key on the command line is visible to
    /// other users in `ps`).
    #[arg(long = "api-key", conflicts_with = "api_key_file")]
    pub api_key: Option<String>,
    /// Read the API key from this file (its first line; surrounding whitespace dropped).
    #[arg(long = "api-key-file")]
    pub api_key_file: Option<std::path::PathBuf>,
    /// Let browser pages from this one origin (e.g. `https://app.example.com`) call the API:
    /// CORS headers for it, preflights answered. Without it no CORS header is sent.
    #[arg(long = "cors-origin")]
    pub cors_origin: Option<String>,
    /// Largest request body in bytes; a larger one is a 413.
    #[arg(long = "max-body-bytes", default_value_t = 4 << 20)]
    pub max_body_bytes: usize,
    /// Seconds a client may take to send a request's headers before it is disconnected
    /// (slow-loris clients).
    #[arg(long = "header-timeout", default_value_t = 10.0)]
    pub header_timeout: f64,
    /// Most choices (`n`) per request (default and at most --parallel).
    #[arg(long = "max-n")]
    pub max_n: Option<usize>,
    /// Most prompt tokens per request (default: the context less one).
    #[arg(long = "max-prompt-tokens")]
    pub max_prompt_tokens: Option<usize>,
    /// Most tokens one request may generate in all, max_tokens × n (default: the context ×
    /// --max-n).
    #[arg(long = "max-total-tokens")]
    pub max_total_tokens: Option<usize>,
    /// Most bytes of a chat request's `tools` list as JSON.
    #[arg(long = "max-tools-bytes", default_value_t = 256 << 10)]
    pub max_tools_bytes: usize,
    /// Tokenize special-token text in raw completion prompts as plain text.
    #[arg(long = "no-parse-special")]
    pub no_parse_special: bool,
    /// Seconds in-flight requests may run after SIGINT/SIGTERM.
    #[arg(long = "drain-timeout", default_value_t = 30.0)]
    pub drain_timeout: f64,
    /// The model name /v1/models reports (default: the model file's stem).
    #[arg(long)]
    pub alias: Option<String>,
}

/// The smallest `-c` a server starts with.
const MIN_SERVE_CTX: usize = 32;

/// `--host`: an IP address, or a name such as `localhost` resolved to its first address
/// (IPv4 first, as llama-server's default binds).
pub(crate) fn resolve_host(host: &str) -> anyhow::Result<std::net::IpAddr> {
    use std::net::ToSocketAddrs;
    if let Ok(ip) = host.parse() {
        return Ok(ip);
    }
    let addrs: Vec<std::net::SocketAddr> = match (host, 0u16).to_socket_addrs() {
        Ok(a) => a.collect(),
        Err(_) => Vec::new(),
    };
    let pick = addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or_else(|| addrs.first())
        .map(|a| a.ip());
    pick.ok_or_else(|| {
        super::UsageError(format!(
            "--host {host}: not an IP address nor a name this machine resolves"
        ))
        .into()
    })
}

/// The environment variable a key may come from (after --api-key and --api-key-file).
pub const API_KEY_ENV: &str = "MINFER_API_KEY";

/// The API key from --api-key, --api-key-file or MINFER_API_KEY (in that order), refused
/// when empty: a server that no request could ever pass is a mistake, not a lock.
fn api_key(args: &Args) -> anyhow::Result<Option<String>> {
    let (key, from) = if let Some(k) = &args.api_key {
        (k.clone(), "--api-key".to_string())
    } else if let Some(p) = &args.api_key_file {
        let text = std::fs::read_to_string(p).map_err(|e| {
            super::UsageError(format!(
                "--api-key-file {}: cannot read it: {e}",
                p.display()
            ))
        })?;
        let line = text.lines().next().unwrap_or("").to_string();
        (line, format!("--api-key-file {}", p.display()))
    } else {
        match std::env::var(API_KEY_ENV) {
            Ok(k) => (k, API_KEY_ENV.to_string()),
            Err(std::env::VarError::NotPresent) => return Ok(None),
            Err(std::env::VarError::NotUnicode(_)) => {
                usage!("{API_KEY_ENV}: the key is not valid UTF-8")
            }
        }
    };
    let key = key.trim().to_string();
    if key.is_empty() {
        usage!(
            "{from}: the key is empty (no request could ever send it); give a key or leave it out"
        );
    }
    Ok(Some(key))
}

pub fn run(args: Args) -> anyhow::Result<()> {
    args.spec.check()?;
    if args.parallel == 0 || args.parallel > 256 {
        usage!("--parallel {}: expected 1 to 256", args.parallel);
    }
    let api_key = api_key(&args)?;
    if let Some(n) = args.max_n.filter(|&n| n == 0 || n > args.parallel) {
        usage!(
            "--max-n {n}: expected 1 to --parallel ({}): more choices than sequences could never run",
            args.parallel
        );
    }
    for (flag, v) in [
        ("--max-prompt-tokens", args.max_prompt_tokens),
        ("--max-total-tokens", args.max_total_tokens),
        ("--max-body-bytes", Some(args.max_body_bytes)),
        ("--max-tools-bytes", Some(args.max_tools_bytes)),
    ] {
        if v == Some(0) {
            usage!("{flag} 0: no request could pass; give at least 1");
        }
    }
    if !(args.header_timeout > 0.0 && args.header_timeout.is_finite()) {
        usage!(
            "--header-timeout {}: expected seconds > 0",
            args.header_timeout
        );
    }
    if let Some(o) = &args.cors_origin {
        // An origin is scheme://host[:port], compared byte for byte with the browser's.
        let ok = (o.starts_with("http://") || o.starts_with("https://"))
            && !o.ends_with('/')
            && o.bytes().all(|b| b.is_ascii_graphic());
        if !ok && o != "null" {
            usage!(
                "--cors-origin {o:?}: expected an origin such as https://app.example.com (scheme and host, no path, no trailing /)"
            );
        }
    }
    if args.chunk == 0 {
        usage!("--chunk must be at least 1");
    }
    if !(args.drain_timeout >= 0.0 && args.drain_timeout.is_finite()) {
        usage!(
            "--drain-timeout {}: expected seconds >= 0",
            args.drain_timeout
        );
    }
    let host = resolve_host(&args.host)?;
    if let Some(n) = args.model.n_ctx.filter(|&n| n != 0 && n < MIN_SERVE_CTX) {
        usage!(
            "-c {n}: a server needs a context of at least {MIN_SERVE_CTX} tokens (a chat prompt alone \
             takes a dozen); 0 is the model's own"
        );
    }
    if !host.is_loopback() && api_key.is_none() {
        eprintln!(
            "warning: serving on {host} without --api-key: anyone who can reach it can use it"
        );
    }
    let (engine, load_ms) = args.model.load_with(Some(MIN_SERVE_CTX))?;
    // A draft sequence per running sequence, the draft's forwards batched across them.
    let draft = args.spec.draft_handle(&engine, &args.model, true)?;
    // A known name as given (`qwen2.5-coder-0.5b`), a file as its name without `.gguf`.
    let model_id = args.alias.clone().unwrap_or_else(|| {
        let m = &args.model.model;
        let file = std::path::Path::new(m)
            .file_name()
            .map_or_else(|| m.clone(), |f| f.to_string_lossy().into_owned());
        file.strip_suffix(".gguf").unwrap_or(&file).to_string()
    });
    let n_ctx = engine.n_ctx();
    let cfg = ServeConfig {
        model_id,
        parallel: args.parallel,
        queue: args.queue,
        chunk: args.chunk,
        api_key,
        parse_special: !args.no_parse_special,
        drain_timeout: Duration::from_secs_f64(args.drain_timeout),
        body_limit: args.max_body_bytes,
        header_timeout: Duration::from_secs_f64(args.header_timeout),
        max_n: args.max_n,
        max_prompt_tokens: args.max_prompt_tokens,
        max_total_tokens: args.max_total_tokens,
        max_tools_bytes: args.max_tools_bytes,
        cors_origin: args.cors_origin.clone(),
        lookup: args.spec.config(),
        draft: draft.clone(),
    };
    let state = AppState::start(engine, cfg)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind((host, args.port))
            .await
            .with_context(|| format!("cannot bind {host}:{}", args.port))?;
        let addr = listener.local_addr()?;
        let signals =
            minfer_server::shutdown::signal().context("cannot install signal handlers")?;
        eprintln!(
            "load: {load_ms:.1} ms; n_ctx {n_ctx}, {} parallel sequences",
            args.parallel
        );
        if let Some(l) = args.spec.config() {
            eprintln!(
                "lookup: n-gram {}, draft-max {} for requests that do not set \"speculative\" (not mirostat sampling)",
                l.ngram, l.draft_max
            );
        }
        if let Some(d) = &draft {
            eprintln!(
                "drafter: {} (draft-max {}, draft-min {}, draft-p-min {}) for requests that do not set \"speculative\" (not mirostat sampling; {{\"draft\": false}} opts out), a draft sequence per running sequence",
                args.spec.drafter_label(),
                d.cfg.draft_max,
                d.cfg.draft_min,
                d.cfg.p_min
            );
        }
        eprintln!("listening on http://{addr}");
        minfer_server::serve(state, listener, signals).await?;
        anyhow::Ok(())
    })
}
