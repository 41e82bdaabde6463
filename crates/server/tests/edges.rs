//! Issue 30's server edges on a synthetic model (no cached model needed): the chat page is
//! public under `--api-key` while the API is not, `top_logprobs` needs `logprobs` (OpenAI's
//! 400), and `/v1/completions` takes `prompt: ""` as OpenAI does.

mod support;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use minfer_models::Arch;
use minfer_server::ServeConfig;
use serde_json::json;
use support::start;
use tower::ServiceExt;

fn model() -> std::path::PathBuf {
    minfer_testkit::synth::model(Arch::Qwen2, 1, 3)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_an_api_key_the_page_is_public_and_the_api_is_not() {
    let cfg = ServeConfig {
        api_key: Some("sekrit".into()),
        ..ServeConfig::default()
    };
    let s = start(&model(), 256, cfg);
    let call = |path: &str, key: Option<&str>| {
        let mut r = Request::get(path);
        if let Some(k) = key {
            r = r.header("authorization", format!("Bearer {k}"));
        }
        let app = s.app.clone();
        let req = r.body(Body::empty()).unwrap();
        async move { app.oneshot(req).await.unwrap().status() }
    };
    assert_eq!(call("/", None).await, StatusCode::OK);
    assert_eq!(call("/health", None).await, StatusCode::OK);
    for path in ["/v1/models", "/metrics"] {
        assert_eq!(call(path, None).await, StatusCode::UNAUTHORIZED, "{path}");
        assert_eq!(call(path, Some("sekrit")).await, StatusCode::OK, "{path}");
    }
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1});
    let (st, v) = s.post("/v1/chat/completions", &body).await;
    assert_eq!(st, StatusCode::UNAUTHORIZED, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_logprobs_without_logprobs_is_a_400_naming_it() {
    let s = start(&model(), 256, ServeConfig::default());
    let body = json!({
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 1,
        "top_logprobs": 3,
    });
    let (st, v) = s.post("/v1/chat/completions", &body).await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["error"]["param"], "top_logprobs", "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("logprobs"),
        "{v}"
    );
    // With logprobs it is served.
    let mut ok = body.clone();
    ok["logprobs"] = json!(true);
    let (st, v) = s.post("/v1/chat/completions", &ok).await;
    assert_eq!(st, StatusCode::OK, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_completion_prompt_starts_from_bos() {
    let s = start(&model(), 256, ServeConfig::default());
    let (st, v) = s
        .post(
            "/v1/completions",
            &json!({"prompt": "", "max_tokens": 2, "temperature": 0}),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["usage"]["prompt_tokens"], 1, "{v}");
    let (st, v) = s
        .post("/v1/completions", &json!({"prompt": [], "max_tokens": 2}))
        .await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{v}");
}
