//! Serving with graceful shutdown. On SIGINT or SIGTERM the server stops accepting
//! connections (the listening socket is closed), answers new requests on open connections
//! with 503, and lets in-flight requests finish within the drain timeout; then it returns
//! how many it abandoned.

use crate::routes::app;
use crate::AppState;
use std::future::{Future, IntoFuture};
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

/// Installs the SIGINT and SIGTERM handlers now and returns a future that resolves on either.
/// Registration is eager (not at the future's first poll) so that a signal arriving right
/// after the caller announces its address is caught rather than killing the process. Must be
/// called inside a tokio runtime.
pub fn signal() -> std::io::Result<impl Future<Output = ()>> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut int = signal(SignalKind::interrupt())?;
        let mut term = signal(SignalKind::terminate())?;
        Ok(async move {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
        })
    }
    #[cfg(not(unix))]
    {
        Ok(async {
            let _ = tokio::signal::ctrl_c().await;
        })
    }
}

/// Serves `state` on `listener` until `stop` resolves, then drains (see the module docs).
/// Returns the number of requests still in flight when the drain timeout ran out.
pub async fn serve(
    state: Arc<AppState>,
    listener: TcpListener,
    stop: impl Future<Output = ()>,
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
    let server = tokio::spawn(axum::serve(l, app(state.clone())).into_future());
    stop.await;
    state.draining.store(true, Ordering::SeqCst);
    state.metrics.set_draining(true);
    let _ = tx.send(true);
    // The accept loop is always parked in `accept`, so it sees the flag at once; the bound
    // only guards against a server task that already ended.
    let _ = tokio::time::timeout(Duration::from_secs(2), closed_rx).await;
    let timeout = state.cfg.drain_timeout;
    let n = state.in_flight.load(Ordering::SeqCst);
    eprintln!(
        "shutting down: {n} request(s) in flight, waiting up to {:.1} s",
        timeout.as_secs_f64()
    );
    let deadline = Instant::now() + timeout;
    while state.in_flight.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let abandoned = state.in_flight.load(Ordering::SeqCst);
    if abandoned > 0 {
        eprintln!(
            "shutdown: abandoned {abandoned} request(s) still in flight after {:.1} s",
            timeout.as_secs_f64()
        );
    } else {
        eprintln!("shutdown: every request finished");
    }
    server.abort();
    Ok(abandoned)
}
