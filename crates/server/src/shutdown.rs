//! Serving with graceful shutdown. On SIGINT or SIGTERM the server stops accepting
//! connections (the listening socket is closed), answers new requests on open connections
//! with 503, and lets in-flight requests finish within the drain timeout. When it runs out,
//! or at a second signal (as llama-server quits at once), every request left is ended
//! properly and it returns how many it abandoned.

use crate::routes::app;
use crate::AppState;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A listener that closes its socket once draining starts. It says so through `closed`, so
/// the drain is announced only once the kernel refuses new connections (announcing on the
/// signal alone let a client connect in between).
struct DrainingListener {
    inner: Option<TcpListener>,
    draining: watch::Receiver<bool>,
    closed: Option<tokio::sync::oneshot::Sender<()>>,
    addr: std::net::SocketAddr,
}

impl axum::serve::Listener for DrainingListener {
    type Io = TcpStream;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        {
            loop {
                if *self.draining.borrow() {
                    self.inner = None;
                    if let Some(closed) = self.closed.take() {
                        let _ = closed.send(());
                    }
                }
                let Some(l) = &self.inner else {
                    return std::future::pending().await;
                };
                tokio::select! {
                    r = l.accept() => match r {
                        Ok((io, addr)) => {
                            let _ = io.set_nodelay(true);
                            return (io, addr);
                        }
                        // Out of descriptors and the like: wait, then accept again.
                        Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                    },
                    _ = self.draining.changed() => {}
                }
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.addr)
    }
}

/// SIGINT and SIGTERM, installed when made; each [`Signals::recv`] waits for the next one.
pub struct Signals {
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
}

impl Signals {
    /// Resolves on the next SIGINT or SIGTERM.
    pub async fn recv(&mut self) {
        #[cfg(unix)]
        {
            tokio::select! {
                _ = self.int.recv() => {}
                _ = self.term.recv() => {}
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Installs the SIGINT and SIGTERM handlers now. Registration is eager (not at the first
/// poll) so that a signal arriving right after the caller announces its address is caught
/// rather than killing the process. Must be called inside a tokio runtime.
pub fn signal() -> std::io::Result<Signals> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
        })
    }
    #[cfg(not(unix))]
    {
        Ok(Signals {})
    }
}

/// Serves every connection `l` accepts on its own task: HTTP/1.1 with keep-alive and
/// pipelining, and a header read timeout (hyper's, which needs a timer that axum::serve
/// does not set): a client that has not sent a whole request head within `header_timeout`
/// is disconnected, so slow-loris clients cannot hold connections open.
async fn accept_loop(mut l: DrainingListener, app: axum::Router, header_timeout: Duration) {
    use axum::serve::Listener;
    loop {
        let (io, _addr) = l.accept().await;
        let svc = hyper_util::service::TowerToHyperService::new(app.clone());
        tokio::spawn(async move {
            let mut b = hyper::server::conn::http1::Builder::new();
            b.timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(header_timeout);
            // A connection's error is its client's (reset, timeout, bytes that are not
            // HTTP, answered by hyper with a bare 400): the connection ends, nothing else.
            let _ = b
                .serve_connection(hyper_util::rt::TokioIo::new(io), svc)
                .with_upgrades()
                .await;
        });
    }
}

/// `1 request`, `2 requests`.
fn requests(n: usize) -> String {
    format!("{n} request{}", if n == 1 { "" } else { "s" })
}

/// How long the handlers get to write the ends of the requests shutdown ended (final
/// chunks, `[DONE]`, 503s) once the engine loop has ended them.
const END_GRACE: Duration = Duration::from_secs(5);

/// Serves `state` on `listener` until the first signal, then drains (see the module docs):
/// in-flight requests may finish within the drain timeout; when it runs out, or at a second
/// signal, every request left is ended properly (a running one with its partial reply and
/// finish_reason `length`, then `[DONE]` when streamed; a queued one with a 503) and the
/// server returns. Returns the number of requests it ended so.
pub async fn serve(
    state: Arc<AppState>,
    listener: TcpListener,
    mut signals: Signals,
) -> std::io::Result<usize> {
    let addr = listener.local_addr()?;
    let (tx, rx) = watch::channel(false);
    let (closed_tx, closed_rx) = tokio::sync::oneshot::channel();
    let l = DrainingListener {
        inner: Some(listener),
        draining: rx,
        closed: Some(closed_tx),
        addr,
    };
    let server = tokio::spawn(accept_loop(l, app(state.clone()), state.cfg.header_timeout));
    signals.recv().await;
    state.draining.store(true, Ordering::SeqCst);
    state.metrics.set_draining(true);
    let _ = tx.send(true);
    // The accept loop is always parked in `accept`, so it sees the flag at once; the bound
    // only guards against a server task that already ended.
    let _ = tokio::time::timeout(Duration::from_secs(2), closed_rx).await;
    let timeout = state.cfg.drain_timeout;
    let n = state.in_flight.load(Ordering::SeqCst);
    tracing::info!(
        "shutting down: {} in flight, waiting up to {:.1} s (a second signal ends them now)",
        requests(n),
        timeout.as_secs_f64()
    );
    let deadline = Instant::now() + timeout;
    let mut again = std::pin::pin!(signals.recv());
    let mut second = false;
    while state.in_flight.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
        tokio::select! {
            _ = &mut again => {
                second = true;
                break;
            }
            _ = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
    }
    let abandoned = state.in_flight.load(Ordering::SeqCst);
    if abandoned > 0 {
        let why = if second {
            "at a second signal".to_string()
        } else {
            format!("after {:.1} s", timeout.as_secs_f64())
        };
        tracing::info!(
            "shutdown: abandoned {} still in flight {why}: running ones end with their partial \
             reply (finish_reason length), queued ones with a 503",
            requests(abandoned)
        );
        state.abort.store(true, Ordering::SeqCst);
        let grace = Instant::now() + END_GRACE;
        while state.in_flight.load(Ordering::SeqCst) > 0 && Instant::now() < grace {
            tokio::select! {
                _ = &mut again, if !second => break,
                _ = tokio::time::sleep(Duration::from_millis(10)) => {}
            }
        }
    } else {
        tracing::info!("shutdown: every request finished");
    }
    server.abort();
    Ok(abandoned)
}
