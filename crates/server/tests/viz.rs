//! `minfer viz`'s routes in-process (no socket) over a synthetic model: the graph has the
//! decode graph's nodes, a run streams `step` and `token` events to a connected page with
//! capture armed, a run with no page connected is not captured, bad `/viz/run` bodies get a
//! 400 naming the field, and replay mode serves a saved trace's nodes and phases, with
//! `--diff`'s outcome naming the node where a second trace parts.
//!
//! Controls: arming on every run (`let armed = true` in viz/live.rs) fails the "no page,
//! no capture" assertion (checked by hand); a page that never connects gets no events (the stream test reads the
//! events a held SSE body received).

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use minfer_engine::{Engine, EngineConfig};
use minfer_models::Arch;
use minfer_server::viz::{app, VizState};
use minfer_testkit::synth;
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use tower::ServiceExt;

fn engine(path: &std::path::Path) -> Engine {
    Engine::load(
        path,
        EngineConfig {
            n_ctx: 256,
            threads: 1,
            ..Default::default()
        },
    )
    .expect("load")
}

async fn call(
    router: &axum::Router,
    method: Method,
    path: &str,
    body: &str,
) -> (StatusCode, Value) {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let r = router.clone().oneshot(req).await.unwrap();
    let status = r.status();
    let bytes = r.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// POSTs a run until it is accepted (the previous one may still be finishing).
async fn start_run(router: &axum::Router, body: &str) -> Value {
    let t0 = Instant::now();
    loop {
        let (s, v) = call(router, Method::POST, "/viz/run", body).await;
        if s == StatusCode::ACCEPTED {
            return v;
        }
        assert_eq!(s, StatusCode::CONFLICT, "{v}");
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the previous run never ended"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Reads SSE `data:` objects from `body` until one of type `until`.
async fn events_until(body: &mut Body, until: &str) -> Vec<Value> {
    let mut got = Vec::new();
    let mut buf = String::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let frame = tokio::time::timeout(left, body.frame())
            .await
            .expect("events in time")
            .expect("the stream is open")
            .expect("a frame");
        if let Some(d) = frame.data_ref() {
            buf.push_str(&String::from_utf8_lossy(d));
        }
        while let Some(end) = buf.find("\n\n") {
            let chunk: String = buf.drain(..end + 2).collect();
            for line in chunk.lines() {
                if let Some(data) = line.strip_prefix("data: ") {
                    let v: Value = serde_json::from_str(data).unwrap();
                    let done = v["type"] == until;
                    got.push(v);
                    if done {
                        return got;
                    }
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_graph_runs_and_capture_only_while_a_page_is_connected() {
    let path = synth::model(Arch::Qwen2, 2, 7);
    let want_nodes = {
        let mut e = engine(&path);
        let g: Value = serde_json::from_str(&e.graph_json(1, 1).unwrap()).unwrap();
        g["nodes"].as_array().unwrap().len()
    };
    let st = VizState::live(engine(&path), "synth").unwrap();
    let router = app(st.clone());

    let (s, g) = call(&router, Method::GET, "/viz/graph", "").await;
    assert_eq!(s, StatusCode::OK);
    let nodes = g["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), want_nodes, "the decode graph's nodes");
    assert_eq!(g["n_layers"], 2);
    assert!(
        nodes.iter().any(|n| n["fused"].is_array()),
        "SwiGLU is fused on the CPU"
    );
    assert!(g["edges"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["kv"] == true));
    for role in ["input", "attention", "ffn", "kv", "output"] {
        assert!(
            nodes.iter().any(|n| n["role"] == role),
            "a node of role {role}"
        );
    }

    // No page: the run is not captured.
    assert_eq!(st.pages(), 0);
    let v = start_run(&router, r#"{"prompt": "hello", "max_tokens": 2}"#).await;
    assert_eq!(v["armed"], false, "{v}");
    idle(&st).await;
    assert_eq!(
        st.captured_runs(),
        0,
        "a run with no page connected was captured"
    );

    // A page holds the stream: the next run is captured and streamed.
    let req = Request::get("/viz/events").body(Body::empty()).unwrap();
    let mut body = router.clone().oneshot(req).await.unwrap().into_body();
    let hello = events_until(&mut body, "hello").await;
    assert_eq!(hello[0]["mode"], "live");
    // What the timeline's times are, per backend that times its nodes.
    let cpu_timing = hello[0]["timing"]["cpu"].as_str().unwrap_or_default();
    assert!(cpu_timing.contains("wall time"), "{}", hello[0]);
    assert_eq!(st.pages(), 1);
    let v = start_run(&router, r#"{"prompt": "hello", "max_tokens": 3}"#).await;
    assert_eq!(v["armed"], true, "{v}");
    let ev = events_until(&mut body, "run_end").await;
    assert_eq!(st.captured_runs(), 1);
    let kinds: Vec<&str> = ev.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(kinds.first(), Some(&"run_start"), "{kinds:?}");
    let end = ev.last().unwrap();
    let n_tokens = kinds.iter().filter(|&&k| k == "token").count();
    // Three, or fewer when the model samples its end-of-generation token.
    assert!((1..=3).contains(&n_tokens), "{kinds:?}");
    assert_eq!(end["tokens"], n_tokens, "{end}");
    let steps: Vec<&Value> = ev.iter().filter(|e| e["type"] == "step").collect();
    // One forward per token: the prompt's gives the first, each decode the next.
    assert_eq!(steps.len(), n_tokens, "{kinds:?}");
    assert_eq!(steps[0]["phase"]["kind"], "prefill");
    assert!(
        steps[0]["phase"]["chosen"]["id"].is_u64(),
        "the step's sampled token"
    );
    let names: Vec<&str> = steps[steps.len() - 1]["phase"]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["name"].as_str().unwrap())
        .collect();
    assert!(
        names.iter().all(|n| nodes.iter().any(|g| g["name"] == *n)),
        "step nodes are graph nodes"
    );
    assert!(
        !names.iter().any(|n| n.ends_with("_store")),
        "no KV stores captured"
    );
    // Every streamed node carries its time (the CPU times each one while armed).
    for s in &steps {
        let nodes = s["phase"]["nodes"].as_array().unwrap();
        assert!(
            nodes.iter().all(|n| n["ns"].as_u64() > Some(0)),
            "{}",
            s["phase"]["kind"]
        );
    }
    drop(body);

    // The page went away: capture is off again.
    let t0 = Instant::now();
    while st.pages() > 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the dropped stream still counts"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let v = start_run(&router, r#"{"prompt": "hello", "max_tokens": 1}"#).await;
    assert_eq!(v["armed"], false, "{v}");
    idle(&st).await;
    assert_eq!(
        st.captured_runs(),
        1,
        "the run after the page left was captured"
    );
}

async fn idle(st: &VizState) {
    let t0 = Instant::now();
    while st.busy() {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the run never ended"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn bad_run_bodies_are_400s_naming_the_field() {
    let doc = json!({"format": "minfer-trace", "version": 1, "model": "m", "backends": ["cpu"],
        "phases": [{"kind": "prefill", "step": 0, "n_tokens": 1, "text": "a", "top5": [],
                    "chosen": {"id": 3, "text": "b"},
                    "nodes": [{"name": "L0.q", "op": "MatMul", "backend": "cpu", "shape": [4, 1],
                               "min": 0.0, "max": 1.0, "mean": 0.5, "absmean": 0.5, "nan": 0,
                               "inf": 0, "sample": [0.0, 1.0]}]}]});
    // --diff: a copy with one value changed parts at that node.
    let mut other = doc.clone();
    other["phases"][0]["nodes"][0]["mean"] = json!(0.75);
    let d = minfer_server::viz::replay::diff_of(&doc, &other, 1e-3, "b.json").unwrap();
    assert_eq!(
        (&d["status"], &d["at"]["name"]),
        (&json!("differ"), &json!("L0.q")),
        "{d}"
    );
    assert_eq!(d["file"], "b.json");
    let same = minfer_server::viz::replay::diff_of(&doc, &doc, 1e-3, "a.json").unwrap();
    assert_eq!(
        same["status"], "agree",
        "control: a trace agrees with itself"
    );
    let st = VizState::replay(doc, "t.json", None).unwrap();
    let router = app(st);
    for (body, param) in [
        (r#"{"max_tokens": 0}"#, "max_tokens"),
        (r#"{"max_tokens": 2000}"#, "max_tokens"),
        (r#"{"temperature": -1}"#, "temperature"),
        (r#"{"prompt": 5}"#, "prompt"),
        (r#"{"prompt": "x", "top_k": 5}"#, "top_k"),
    ] {
        let (s, v) = call(&router, Method::POST, "/viz/run", body).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{body}: {v}");
        assert_eq!(v["error"]["param"], param, "{body}: {v}");
    }
    let (s, _) = call(&router, Method::POST, "/viz/run", "not json").await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    let (s, _) = call(&router, Method::GET, "/viz/nothing", "").await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    // Replay: the trace's nodes, a layer from the name; the prompt is not needed.
    let (_, g) = call(&router, Method::GET, "/viz/graph", "").await;
    assert_eq!(g["nodes"].as_array().unwrap().len(), 1);
    assert_eq!(g["nodes"][0]["layer"], 0);
    assert_eq!(g["nodes"][0]["role"], "attention");
    let (s, v) = call(&router, Method::POST, "/viz/run", "{}").await;
    assert_eq!(
        (s, &v["mode"]),
        (StatusCode::ACCEPTED, &json!("replay")),
        "{v}"
    );
    // Not a trace: refused by name.
    let e = VizState::replay(json!({"format": "x"}), "bad.json", None)
        .err()
        .unwrap();
    assert!(e.to_string().contains("not a minfer trace"), "{e}");
}
