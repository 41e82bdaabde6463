//! Server-sent events for streamed replies: a task turns job events into `data:` chunks;
//! when the client goes away the channel closes, the task ends and drops the job's event
//! receiver, which frees its sequences in the engine loop.

use crate::engine_loop::JobEvent;
use crate::error::ApiError;
use crate::metrics::Finish;
use crate::AppState;
use axum::response::sse::{Event, Sse};
use axum::response::IntoResponse;
use serde_json::Value;
use std::convert::Infallible;
use std::future::Future;
use tokio::sync::mpsc;
use tokio::sync::mpsc::UnboundedReceiver;

pub type SseTx = mpsc::Sender<Result<Event, Infallible>>;

/// The client went away: nothing more can be sent.
pub struct Gone;

/// The streamed response, fed by `drive` on its own task.
pub fn respond<F>(drive: impl FnOnce(SseTx) -> F) -> impl IntoResponse
where
    F: Future<Output = Result<(), Gone>> + Send + 'static,
{
    let (tx, rx) = mpsc::channel::<Result<Event, Infallible>>(64);
    tokio::spawn(drive(tx));
    // No keep-alive comments: OpenAI and llama-server send none, and strict clients count them
    // as protocol errors (a queued stream gets its role chunk at once anyway).
    Sse::new(tokio_stream::wrappers::ReceiverStream::new(rx))
}

/// The job's next event (None: the engine loop stopped), or `Gone` as soon as the client
/// went away. A stream queued behind full slots waits long for its first token with nothing
/// to send; waiting on the job alone, it would keep its receiver, so its place in the queue,
/// until that token failed to send, and the engine would prefill it for nobody.
pub async fn next_event(
    events: &mut UnboundedReceiver<JobEvent>,
    tx: &SseTx,
) -> Result<Option<JobEvent>, Gone> {
    tokio::select! {
        biased;
        ev = events.recv() => Ok(ev),
        _ = tx.closed() => Err(Gone),
    }
}

pub async fn send(tx: &SseTx, v: &Value) -> Result<(), Gone> {
    tx.send(Ok(Event::default().data(v.to_string())))
        .await
        .map_err(|_| Gone)
}

/// The last event of every stream.
pub async fn done(tx: &SseTx) -> Result<(), Gone> {
    tx.send(Ok(Event::default().data("[DONE]")))
        .await
        .map_err(|_| Gone)
}

/// Ends a stream whose generation failed: an OpenAI error event, then `[DONE]`.
pub async fn fail(st: &AppState, tx: &SseTx, why: &str) -> Result<(), Gone> {
    st.metrics.request_finished(Finish::Error);
    let e = ApiError::generation_failed(why);
    send(tx, &e.body()).await?;
    done(tx).await
}
