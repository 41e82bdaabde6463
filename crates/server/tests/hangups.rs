//! Clients that hang up while their request is queued (issue 34's soak found this): with
//! every slot taken, a streamed request gets its role chunk at once and then waits; when its
//! client goes away it must leave the queue at once, not hold its place (and, admitted
//! later, be prefilled for nobody) until its first token cannot be sent. Under 64 soak
//! clients with 10 % cancelled, the stale places filled `--queue` and live clients got 503.
//!
//! SmolLM2 through the router in-process, one slot held by a long request whose
//! end-of-text tokens are banned (`logit_bias`), so it runs through the whole test.
//!
//! Control: without the `tx.closed()` arm in the streamed handlers' event loops
//! (routes/sse.rs `next_event`), the hung-up streams stay queued while the holder runs and
//! `hung_up_queued_requests_leave_the_queue_at_once` fails ("3 still queued").

mod support;

use axum::body::Body;
use axum::http::Request;
use http_body_util::BodyExt;
use minfer_server::ServeConfig;
use minfer_testkit::models;
use serde_json::json;
use std::time::{Duration, Instant};
use support::{chat, start, Server};
use tower::ServiceExt;

async fn cancelled(s: &Server) -> f64 {
    s.metric("minfer_requests_finished_total{reason=\"cancelled\"}")
        .await
}

/// Waits until `f` holds, for at most `secs`; false if it never did.
async fn within<F: std::future::Future<Output = bool>>(
    secs: u64,
    mut f: impl FnMut() -> F,
) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(secs) {
        if f().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hung_up_queued_requests_leave_the_queue_at_once() {
    let Some(m) = models::smol() else { return };
    let s = start(
        &m,
        4096,
        ServeConfig {
            parallel: 1,
            ..ServeConfig::default()
        },
    );
    // The holder: a stream that cannot end by itself (end-of-text and turn tokens banned).
    let mut hold = chat("Count from one to a thousand.", 3000);
    hold["stream"] = json!(true);
    hold["logit_bias"] = json!({"0": -100, "1": -100, "2": -100});
    let req = Request::post("/v1/chat/completions")
        .body(Body::from(hold.to_string()))
        .unwrap();
    let mut holder = s.app.clone().oneshot(req).await.unwrap().into_body();
    for _ in 0..3 {
        holder.frame().await.unwrap().unwrap();
    }
    assert_eq!(s.metric("minfer_requests_running").await, 1.0);
    let before = cancelled(&s).await;

    // Three streams queued behind it (a chat, a text completion, a chat), each hung up once
    // its role chunk (or first event) came.
    let mut bodies = Vec::new();
    for (path, body) in [
        ("/v1/chat/completions", {
            let mut b = chat("Say hello.", 8);
            b["stream"] = json!(true);
            b
        }),
        (
            "/v1/completions",
            json!({"prompt": "Once upon a time", "max_tokens": 8, "stream": true}),
        ),
        ("/v1/chat/completions", {
            let mut b = chat("Say goodbye.", 8);
            b["stream"] = json!(true);
            b
        }),
    ] {
        let req = Request::post(path)
            .body(Body::from(body.to_string()))
            .unwrap();
        let mut b = s.app.clone().oneshot(req).await.unwrap().into_body();
        if path == "/v1/chat/completions" {
            b.frame().await.unwrap().unwrap(); // the role chunk, sent while queued
        }
        bodies.push(b);
    }
    // A non-streamed request queued too, its client gone (the handler's future dropped).
    let app = s.app.clone();
    let plain = tokio::spawn(async move {
        let req = Request::post("/v1/chat/completions")
            .body(Body::from(chat("Say yes.", 8).to_string()))
            .unwrap();
        app.oneshot(req).await
    });
    assert!(
        within(5, || async {
            s.metric("minfer_requests_queued").await == 4.0
        })
        .await,
        "the four requests were never all queued ({} queued)",
        s.metric("minfer_requests_queued").await
    );
    drop(bodies);
    plain.abort();
    let gone = within(3, || async {
        s.metric("minfer_requests_queued").await == 0.0
    })
    .await;
    let queued = s.metric("minfer_requests_queued").await;
    let running = s.metric("minfer_requests_running").await;
    assert!(
        gone,
        "{queued} still queued 3 s after their clients hung up ({running} running): a hung-up \
         request holds its place in the queue"
    );
    assert_eq!(
        cancelled(&s).await - before,
        4.0,
        "each counts as cancelled once"
    );
    // The holder never stopped: the queue emptied by the hang-ups, not by admission.
    assert_eq!(running, 1.0);
    holder.frame().await.unwrap().unwrap();
    drop(holder);
    assert!(
        within(10, || async {
            s.metric("minfer_requests_running").await == 0.0
        })
        .await,
        "the holder was not cancelled"
    );
}
