//! The engine loop's profile in `/metrics` (issue 29's first point): forwards, rows by class,
//! the time inside forwards and in the turns that ran them, graph builds, CUDA graph counts.
//! The rows are checked against what the replies themselves report (their `usage`), which
//! the profile does not read: every prompt token not served from the prefix cache is one
//! prompt row, and every completion token but the first is one generation row (the first
//! comes from the prompt's last row, the last one sampled is never decoded).

mod support;

use serde_json::Value;
use std::sync::Arc;
use support::{chat, start};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_profile_counts_the_rows_the_replies_report() {
    let Some(m) = minfer_testkit::models::smol() else {
        return;
    };
    let s = Arc::new(start(&m, 4096, minfer_server::ServeConfig::default()));
    // Control: nothing ran, nothing counted.
    assert_eq!(s.metric("minfer_loop_forwards_total").await, 0.0);
    assert_eq!(s.metric("minfer_loop_turn_seconds_total").await, 0.0);
    let n = 6;
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let s = s.clone();
            tokio::spawn(async move {
                let body = chat(&format!("Name a colour, please (#{i})."), 10);
                let (st, v) = s.post("/v1/chat/completions", &body).await;
                assert!(st.is_success(), "{v}");
                v
            })
        })
        .collect();
    let (mut prompt_rows, mut generation_rows) = (0.0, 0.0);
    for t in tasks {
        let v: Value = t.await.unwrap();
        let u = &v["usage"];
        let cached = u["prompt_tokens_details"]["cached_tokens"]
            .as_f64()
            .unwrap_or(0.0);
        prompt_rows += u["prompt_tokens"].as_f64().unwrap() - cached;
        generation_rows += u["completion_tokens"].as_f64().unwrap() - 1.0;
    }
    // A turn is added to the profile once it ends, after the replies it finished went out:
    // the last turn may land a moment after the last reply, so read until the rows are in
    // (bounded; a count that never arrives fails below).
    let prompt_name = "minfer_loop_rows_total{class=\"prompt\"}";
    let generation_name = "minfer_loop_rows_total{class=\"generation\"}";
    let find = |text: &str, name: &str| -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
    };
    let mut text = String::new();
    for _ in 0..100 {
        let (_, b) = s.request("GET", "/metrics", "").await;
        text = String::from_utf8(b).unwrap();
        if find(&text, prompt_name) == Some(prompt_rows)
            && find(&text, generation_name) == Some(generation_rows)
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let sample =
        |name: &str| -> f64 { find(&text, name).unwrap_or_else(|| panic!("{name} missing")) };
    assert_eq!(sample(prompt_name), prompt_rows);
    assert_eq!(sample(generation_name), generation_rows);
    let forwards = sample("minfer_loop_forwards_total");
    let stats = s
        .state
        .stats
        .forwards
        .load(std::sync::atomic::Ordering::Relaxed) as f64;
    assert_eq!(forwards, stats);
    // Batched: fewer forwards than rows of generation.
    assert!(forwards > 0.0 && forwards < generation_rows, "{forwards}");
    let (fwd, turn) = (
        sample("minfer_loop_forward_seconds_total"),
        sample("minfer_loop_turn_seconds_total"),
    );
    assert!(fwd > 0.0 && fwd <= turn, "forward {fwd} s, turns {turn} s");
    assert!(sample("minfer_graph_builds_total") >= 1.0);
    // No CUDA in this build (or this test's engine): no CUDA graphs.
    assert_eq!(sample("minfer_cuda_graph_captures_total"), 0.0);
}
