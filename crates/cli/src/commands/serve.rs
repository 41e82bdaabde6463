//! `minfer serve [-m MODEL] [--host 127.0.0.1] [--port 8080] …`: the OpenAI-compatible
//! server (crate `minfer-server`); this module only maps flags to its config.

use super::args::ModelArgs;
use crate::usage;
use anyhow::Context;
use clap::Args as ClapArgs;
use minfer_server::{AppState, ServeConfig};
use std::time::Duration;

#[derive(ClapArgs, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
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
    /// page at /, which asks for the key itself). Not empty.
    #[arg(long = "api-key")]
    pub api_key: Option<String>,
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
fn resolve_host(host: &str) -> anyhow::Result<std::net::IpAddr> {
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

pub fn run(args: Args) -> anyhow::Result<()> {
    if args.parallel == 0 || args.parallel > 256 {
        usage!("--parallel {}: expected 1 to 256", args.parallel);
    }
    if args.api_key.as_deref().is_some_and(|k| k.trim().is_empty()) {
        usage!("--api-key: the key is empty (no request could ever send it); give a key or leave the flag out");
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
    if !host.is_loopback() && args.api_key.is_none() {
        eprintln!(
            "warning: serving on {host} without --api-key: anyone who can reach it can use it"
        );
    }
    let (engine, load_ms) = args.model.load()?;
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
        api_key: args.api_key.clone(),
        parse_special: !args.no_parse_special,
        drain_timeout: Duration::from_secs_f64(args.drain_timeout),
        ..ServeConfig::default()
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
        eprintln!("listening on http://{addr}");
        minfer_server::serve(state, listener, signals).await?;
        anyhow::Ok(())
    })
}
