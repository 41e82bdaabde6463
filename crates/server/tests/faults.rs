//! Faults in the engine, on the real SmolLM2 model through the router: a forward that fails
//! for one request of a batch (the error naming its entry, or naming none), and NaN logits
//! for one request. In each, three requests run together; the faulted one gets a 500 naming
//! the reason, the other two get the tokens they get without the fault (greedy, the same
//! server's run before the fault is armed), and the faulted request's KV sequence is gone.
//!
//! Controls, each tried by hand once (the test failed, then the change was reverted):
//! - `reap` not releasing a failed sequence: the engine keeps one sequence more than the
//!   prefix cache accounts for, and [`wait_for_no_leak`] times out;
//! - `Batcher::step` failing every sequence of a failed forward (the old behaviour): the
//!   batch-mates get 500s;
//! - `SeqGen::accept` without its NaN check: the NaN request gets a 200 with a token drawn
//!   from the logits left (half of each row stays finite).

mod support;

use axum::http::StatusCode;
use minfer_engine::InjectedFault;
use minfer_server::engine_loop::MarkedFault;
use minfer_server::ServeConfig;
use minfer_testkit::models;
use serde_json::Value;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use support::{chat, start, Server};

const MATES: [&str; 2] = [
    "Write a haiku about Rust.",
    "Name three colours of the rainbow.",
];
const VICTIM: &str = "Tell me about zebras.";
/// Reply tokens the victim samples before its fault strikes: by then the three requests
/// decode in one batch.
const AFTER: usize = 6;

/// The three requests at once: the two batch-mates and the victim, in the middle.
async fn run_three(s: &Server) -> Vec<(StatusCode, Value)> {
    let mates = MATES.map(|m| chat(m, 24));
    let victim = chat(VICTIM, 24);
    let (a, v, b) = tokio::join!(
        s.post("/v1/chat/completions", &mates[0]),
        s.post("/v1/chat/completions", &victim),
        s.post("/v1/chat/completions", &mates[1]),
    );
    vec![a, v, b]
}

fn text(v: &Value) -> String {
    v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// Sequences the engine holds beyond the prefix cache's (its default sequence), once idle.
async fn extra_sequences(s: &Server) -> f64 {
    s.state.stats.engine_sequences.load(Ordering::SeqCst) as f64
        - s.metric("minfer_prefix_cache_entries").await
}

/// Waits until the engine holds no sequence beyond the cached prefixes and `base`.
async fn wait_for_no_leak(s: &Server, base: f64) {
    let t0 = Instant::now();
    loop {
        let running = s.metric("minfer_requests_running").await;
        let extra = extra_sequences(s).await;
        if running == 0.0 && extra == base {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "{running} running, {extra} sequences beyond the cache (want {base}): a failed \
             request's cells were not freed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The reference run, then the same three requests with `fault` on the victim: the mates'
/// replies equal the reference, the victim's reply is a 500 whose message holds `reason`.
async fn fault_hits_only_its_request(fault: InjectedFault, reason: &str) {
    let Some(m) = models::smol() else { return };
    let s = start(&m, 2048, ServeConfig::default());
    // The loop publishes its counts once it has started: the engine's default sequence.
    let t0 = Instant::now();
    while s.state.stats.engine_sequences.load(Ordering::SeqCst) == 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "the loop never published"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let base = extra_sequences(&s).await;
    let reference = run_three(&s).await;
    for (st, v) in &reference {
        assert_eq!(*st, StatusCode::OK, "{v}");
    }
    // The victim replies with more tokens than it samples before the fault.
    assert!(
        reference[1].1["usage"]["completion_tokens"]
            .as_u64()
            .unwrap()
            > AFTER as u64
    );
    wait_for_no_leak(&s, base).await;

    s.state.faults.marked.lock().unwrap().push(MarkedFault {
        prompt_contains: VICTIM.into(),
        after_tokens: AFTER,
        fault,
    });
    let got = run_three(&s).await;
    let (st, v) = &got[1];
    assert_eq!(*st, StatusCode::INTERNAL_SERVER_ERROR, "{v}");
    assert_eq!(v["error"]["type"], "server_error");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains(reason), "{msg}");
    for k in [0, 2] {
        assert_eq!(got[k].0, StatusCode::OK, "{}", got[k].1);
        assert_eq!(text(&got[k].1), text(&reference[k].1), "request {k}");
        assert_eq!(
            got[k].1["usage"]["completion_tokens"],
            reference[k].1["usage"]["completion_tokens"]
        );
    }
    // The fault struck a forward that held all three.
    assert!(s.state.stats.batch_at_fault.load(Ordering::SeqCst) >= 3);
    wait_for_no_leak(&s, base).await;
    // The server carries on: the victim's prompt, unmarked, gets its reference reply.
    s.state.faults.marked.lock().unwrap().clear();
    let (st, v) = s.post("/v1/chat/completions", &chat(VICTIM, 24)).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(text(&v), text(&reference[1].1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forward_failing_on_one_request_fails_that_request_alone() {
    fault_hits_only_its_request(
        InjectedFault::FailNamingEntry,
        "injected fault: the backend failed on the rows of sequence",
    )
    .await;
}

/// The error names no entry: the three rerun one by one, the victim fails again alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forward_failing_without_naming_a_request_reruns_each_alone() {
    fault_hits_only_its_request(
        InjectedFault::FailUnattributed,
        "injected fault: the backend failed for the batch",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nan_logits_fail_their_request_alone() {
    fault_hits_only_its_request(
        InjectedFault::NanLogits,
        &format!("the model's logits hold NaN (24576 of 49152) at reply token {AFTER}"),
    )
    .await;
}
