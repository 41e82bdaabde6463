//! `minfer viz [-m MODEL] [--port 8081] [--trace FILE]`: a page in the browser that shows the
//! model's graph run (crate `minfer-server`, module `viz`); this module maps flags to it.
//! `--trace FILE` replays a saved trace instead of loading a model; `--diff B` also marks
//! the first node where trace B differs from it.

use super::args::{ModelArgs, DEFAULT_MODEL};
use crate::usage;
use anyhow::Context;
use clap::Args as ClapArgs;
use minfer_server::viz::VizState;
use std::path::PathBuf;

#[derive(ClapArgs, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to bind (loopback unless told otherwise; the page has no API key).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to bind (0 picks a free one; the address is printed).
    #[arg(long, default_value_t = 8081)]
    pub port: u16,
    /// Replay this saved trace (written by `--trace FILE` of run, chat or bench) instead of
    /// running a model: no model is loaded.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// With --trace: a second trace to compare it with (`minfer trace-diff TRACE DIFF`); the
    /// page marks the first node where they differ.
    #[arg(long, value_name = "FILE", requires = "trace")]
    pub diff: Option<PathBuf>,
    /// The tolerance of --diff, as `minfer trace-diff --tol`.
    #[arg(long, default_value_t = 1e-3, requires = "diff")]
    pub tol: f64,
}

fn read_trace(flag: &str, path: &std::path::Path) -> anyhow::Result<serde_json::Value> {
    // Exit 2 as `minfer trace-diff` does for a file it cannot use.
    let s = std::fs::read_to_string(path).map_err(|e| {
        super::UsageError(format!("{flag} {}: cannot read it: {e}", path.display()))
    })?;
    serde_json::from_str(&s)
        .map_err(|e| super::UsageError(format!("{flag} {}: not JSON: {e}", path.display())).into())
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let host = super::serve::resolve_host(&args.host)?;
    let state = match &args.trace {
        Some(path) => {
            let m = &args.model;
            if m.model != DEFAULT_MODEL || !m.backends.is_empty() || m.n_ctx.is_some() {
                usage!("--trace replays a saved trace without a model: -m, -c and --backend do not apply");
            }
            if !(args.tol.is_finite() && args.tol >= 0.0) {
                usage!("--tol {}: needs a finite value >= 0", args.tol);
            }
            let doc = read_trace("--trace", path)?;
            let diff = match &args.diff {
                Some(b) => {
                    let other = read_trace("--diff", b)?;
                    let name = b.display().to_string();
                    Some(
                        minfer_server::viz::replay::diff_of(&doc, &other, args.tol, &name)
                            .map_err(|e| super::UsageError(e.to_string()))?,
                    )
                }
                None => None,
            };
            VizState::replay(doc, &path.display().to_string(), diff)
                .map_err(|e| super::UsageError(e.to_string()))?
        }
        None => {
            let (engine, load_ms) = args.model.load()?;
            eprintln!("load: {load_ms:.1} ms");
            VizState::live(engine, &args.model.model)?
        }
    };
    if !host.is_loopback() {
        eprintln!("warning: serving viz on {host}: anyone who can reach it can run the model");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind((host, args.port))
            .await
            .with_context(|| format!("cannot bind {host}:{}", args.port))?;
        eprintln!("listening on http://{}", listener.local_addr()?);
        minfer_server::viz::serve(state, listener).await?;
        anyhow::Ok(())
    })
}
