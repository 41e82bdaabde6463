//! `serve --draft MODEL` and `serve --self-draft LAYERS` (issue 31) on a synthetic model, so
//! it runs everywhere: greedy replies of six concurrent requests (continuous batching, four
//! sequences at once) on a server whose draft model is the model itself, and on one that
//! self-drafts with its first 2 of 4 blocks, are byte for byte the replies of a server
//! without a drafter; `{"speculative": {"draft": false}}` opts a request out, `{"lookup":
//! N}` wins over the draft model for its request, `{"draft": true, "draft_max": M}` takes
//! the model at the request's own length, a `draft` that is not a boolean is a 400 naming
//! `speculative.draft` (as is `true` on a server without a model); a request's draft sequence is freed when it finishes and when its
//! client hangs up; a constrained (`json_object`) drafted reply is the plain server's; a
//! sampled drafted reply repeats for its seed (control: another seed differs); on a device
//! backend (metal-emu) a server self-drafting with 1 and 3 of 4 blocks (the draft on a sibling
//! of the model's backend, no weight placed twice) gives the plain server's replies there.
//!
//! Controls: the drafters really ran (drafts counted in the replies' usage, the draft
//! engine's forwards moved, the model drafting for itself had drafts accepted), the plain
//! server's replies count no drafts (so the comparison is not of the plain server with
//! itself) and differ between prompts, the requests shared forwards, and a draft sequence
//! is held while a stream runs (so "none left" is not a counter that never moves).

mod support;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use minfer_engine::{Engine, EngineConfig};
use minfer_generate::draft::{DraftConfig, DraftHandle, EngineDraft};
use minfer_models::Arch;
use minfer_server::{app, AppState, ServeConfig};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{chat, Server};
use tower::ServiceExt;

const CHAT: &str = "/v1/chat/completions";
const N_CTX: usize = 1024;
const MAX_TOKENS: usize = 40;

const PROMPTS: [&str; 6] = [
    "one two three one two three",
    "the cat sat on the mat",
    "abc abc abc abc",
    "Write a function that adds two numbers.",
    "hello world, hello again",
    "count: 1 2 3 4 5 6 7",
];

#[derive(Clone, Copy, Debug)]
enum Drafter {
    None,
    /// The model drafting for itself (a second engine on the same file).
    Itself,
    /// The model's first LAYERS blocks.
    SelfDraft(usize),
}

fn model() -> PathBuf {
    minfer_testkit::synth::model(Arch::Qwen2, 4, 11)
}

fn engine_cfg() -> EngineConfig {
    EngineConfig {
        n_ctx: N_CTX,
        threads: 1,
        ..EngineConfig::default()
    }
}

fn start(path: &Path, drafter: Drafter) -> Server {
    start_with(path, drafter, engine_cfg())
}

/// [`start`] with the engines' configuration (the backends: `--backend`).
fn start_with(path: &Path, drafter: Drafter, engine_cfg: EngineConfig) -> Server {
    let engine_cfg = || engine_cfg.clone();
    let engine = Engine::load(path, engine_cfg()).unwrap();
    // p-min 0: the draft proposes its full length every forward (a random model is unsure).
    let cfg = DraftConfig {
        draft_max: 6,
        draft_min: 0,
        p_min: 0.0,
    };
    let draft = match drafter {
        Drafter::None => None,
        Drafter::Itself => {
            let d = Engine::load(path, engine_cfg()).unwrap();
            Some(DraftHandle::new(EngineDraft::multi(d), cfg))
        }
        Drafter::SelfDraft(l) => {
            let d = engine.self_draft(l, engine_cfg()).unwrap();
            Some(DraftHandle::new(EngineDraft::multi(d), cfg))
        }
    };
    let state = AppState::start(
        engine,
        ServeConfig {
            parallel: 4,
            draft,
            ..ServeConfig::default()
        },
    )
    .unwrap();
    Server {
        app: app(state.clone()),
        state,
    }
}

/// (accepted, rejected) drafts of a reply; None when it counts none (it did not speculate).
fn drafts(v: &Value) -> Option<(u64, u64)> {
    let d = v["usage"].get("completion_tokens_details")?;
    Some((
        d["accepted_prediction_tokens"].as_u64()?,
        d["rejected_prediction_tokens"].as_u64()?,
    ))
}

fn text(v: &Value) -> String {
    v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_else(|| panic!("no content: {v}"))
        .to_string()
}

/// Every prompt's reply, the requests sent all at once.
async fn concurrent(s: &Arc<Server>, speculative: Option<Value>) -> Vec<Value> {
    let tasks: Vec<_> = PROMPTS
        .iter()
        .map(|p| {
            let s = s.clone();
            let mut body = chat(p, MAX_TOKENS);
            if let Some(sp) = &speculative {
                body["speculative"] = sp.clone();
            }
            tokio::spawn(async move {
                let (st, v) = s.post(CHAT, &body).await;
                assert_eq!(st, StatusCode::OK, "{v}");
                v
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

/// Waits until the server's draft model holds `n` sequences, for at most 3 s.
async fn draft_sequences_reach(s: &Server, n: usize) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(3) {
        if s.state.stats.draft_sequences.load(Ordering::SeqCst) == n {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drafted_replies_are_the_plain_servers_byte_for_byte() {
    let m = model();
    let plain_server = Arc::new(start(&m, Drafter::None));
    let plain = concurrent(&plain_server, None).await;
    for v in &plain {
        assert_eq!(
            drafts(v),
            None,
            "control: the plain server drafts nothing: {v}"
        );
    }
    let plain: Vec<String> = plain.iter().map(text).collect();
    let distinct: std::collections::HashSet<_> = plain.iter().collect();
    assert!(distinct.len() >= 4, "control: replies differ: {plain:?}");
    assert!(plain.iter().all(|t| !t.is_empty()));

    for drafter in [Drafter::Itself, Drafter::SelfDraft(2)] {
        let s = Arc::new(start(&m, drafter));
        let replies = concurrent(&s, None).await;
        let (mut accepted, mut rejected) = (0, 0);
        for (i, v) in replies.iter().enumerate() {
            assert_eq!(text(v), plain[i], "{drafter:?}, prompt {:?}", PROMPTS[i]);
            let (a, r) = drafts(v).unwrap_or_else(|| panic!("{drafter:?}: no draft counts: {v}"));
            accepted += a;
            rejected += r;
        }
        let stats = &s.state.stats;
        let forwards = stats.draft_forwards.load(Ordering::SeqCst);
        eprintln!(
            "{drafter:?}: {accepted} accepted, {rejected} rejected, {forwards} draft forwards"
        );
        // Controls: the drafter ran, the requests shared forwards.
        assert!(accepted + rejected > 0, "{drafter:?}: nothing drafted");
        assert!(forwards > 0, "{drafter:?}");
        assert!(stats.max_running.load(Ordering::SeqCst) >= 2, "{drafter:?}");
        if let Drafter::Itself = drafter {
            assert!(
                accepted > 10 * rejected.max(1),
                "the model drafting for itself: {accepted} accepted, {rejected} rejected"
            );
        }
        // Every finished request freed its draft sequence.
        assert!(
            draft_sequences_reach(&s, 0).await,
            "{drafter:?}: {} draft sequences left after every request finished",
            stats.draft_sequences.load(Ordering::SeqCst)
        );
    }
}

/// `serve --backend metal-emu --self-draft L`: the draft engine runs on a sibling of the
/// model's device backend (`Memory::sibling`: the same resident weights, nothing placed on
/// the device again) and the replies of six concurrent requests are the plain metal-emu
/// server's byte for byte, for L = 1 and 3. Controls: the plain server drafts nothing, the
/// self-drafting ones counted drafts and ran draft forwards, and the draft engine placed no
/// weight bytes on the device while the model's are there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_self_drafting_server_on_a_device_gives_the_plain_replies() {
    let m = model();
    let cfg = EngineConfig {
        backends: vec!["metal-emu".into()],
        ..engine_cfg()
    };
    let target = Engine::load(&m, cfg.clone()).unwrap();
    assert!(
        target.device_weights_bytes() > 0,
        "control: weights on the device"
    );
    let draft = target.self_draft(3, cfg.clone()).unwrap();
    assert_eq!(
        draft.device_weights_bytes(),
        0,
        "the draft placed no weight"
    );
    drop((target, draft));
    let plain_server = Arc::new(start_with(&m, Drafter::None, cfg.clone()));
    let plain = concurrent(&plain_server, None).await;
    assert!(
        plain.iter().all(|v| drafts(v).is_none()),
        "control: no drafts"
    );
    let plain: Vec<String> = plain.iter().map(text).collect();
    for l in [1, 3] {
        let s = Arc::new(start_with(&m, Drafter::SelfDraft(l), cfg.clone()));
        let replies = concurrent(&s, None).await;
        let mut drafted = 0;
        for (i, v) in replies.iter().enumerate() {
            assert_eq!(text(v), plain[i], "self-draft {l}, prompt {:?}", PROMPTS[i]);
            let (a, r) = drafts(v).unwrap_or_else(|| panic!("self-draft {l}: no counts: {v}"));
            drafted += a + r;
        }
        let forwards = s.state.stats.draft_forwards.load(Ordering::SeqCst);
        eprintln!("metal-emu self-draft {l}: {drafted} drafts, {forwards} draft forwards");
        assert!(drafted > 0 && forwards > 0, "self-draft {l}: the draft ran");
        assert!(draft_sequences_reach(&s, 0).await, "self-draft {l}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_opts_out_or_asks_for_lookup_and_bad_values_are_refused() {
    let m = model();
    let s = Arc::new(start(&m, Drafter::Itself));
    let plain = start(&m, Drafter::None);
    let p = PROMPTS[0];
    let (_, reference) = plain.post(CHAT, &chat(p, MAX_TOKENS)).await;

    // {"draft": false}: plain decoding, the draft engine not run.
    let before = s.state.stats.draft_forwards.load(Ordering::SeqCst);
    let mut body = chat(p, MAX_TOKENS);
    body["speculative"] = json!({"draft": false});
    let (st, v) = s.post(CHAT, &body).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(text(&v), text(&reference));
    assert_eq!(drafts(&v), None, "{v}");
    // {"lookup": 2}: lookup for this request (counted drafts), not the draft model.
    body["speculative"] = json!({"lookup": 2});
    let (st, v) = s.post(CHAT, &body).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(text(&v), text(&reference));
    assert!(drafts(&v).is_some(), "lookup counts its drafts: {v}");
    assert_eq!(
        s.state.stats.draft_forwards.load(Ordering::SeqCst),
        before,
        "neither request ran the draft model"
    );
    // Control: the server's default runs it.
    let (_, v) = s.post(CHAT, &chat(p, MAX_TOKENS)).await;
    assert_eq!(text(&v), text(&reference));
    assert!(s.state.stats.draft_forwards.load(Ordering::SeqCst) > before);

    // {"draft": true, "draft_max": 1}: the server's model at this request's length. Every
    // draft of the model drafting for itself is accepted, so a forward takes at most one
    // accepted draft and one token of its own: accepted <= half the reply; at the server's
    // length (6, control) more than half.
    let completion = |v: &Value| v["usage"]["completion_tokens"].as_u64().unwrap();
    body["speculative"] = json!({"draft": true, "draft_max": 1});
    let (st, v) = s.post(CHAT, &body).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(text(&v), text(&reference));
    let (a1, _) = drafts(&v).unwrap_or_else(|| panic!("no draft counts: {v}"));
    assert!(a1 > 0 && 2 * a1 <= completion(&v) + 1, "draft_max 1: {v}");
    body["speculative"] = json!({"draft": true});
    let (st, v) = s.post(CHAT, &body).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(text(&v), text(&reference));
    let (a6, _) = drafts(&v).unwrap_or_else(|| panic!("no draft counts: {v}"));
    assert!(2 * a6 > completion(&v) + 1, "the server's length 6: {v}");

    for (bad, param) in [
        (json!({"draft": "small.gguf"}), "speculative.draft"),
        (json!({"draft": 1}), "speculative.draft"),
        (json!({"draft": true, "lookup": 2}), "speculative.lookup"),
        (
            json!({"draft": true, "draft_max": 65}),
            "speculative.draft_max",
        ),
    ] {
        body["speculative"] = bad.clone();
        let (st, v) = s.post(CHAT, &body).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{bad}: {v}");
        assert_eq!(v["error"]["param"], param, "{bad}: {v}");
    }
    // A server without a draft model refuses {"draft": true} by name.
    body["speculative"] = json!({"draft": true});
    let (st, v) = plain.post(CHAT, &body).await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["error"]["param"], "speculative.draft", "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_up_stream_frees_its_draft_sequence() {
    let m = model();
    let s = start(&m, Drafter::Itself);
    // A stream that cannot end by itself (its end-of-generation tokens banned).
    let mut body = chat("one two three", 900);
    body["stream"] = json!(true);
    let bias: serde_json::Map<String, Value> = s
        .state
        .eog
        .iter()
        .map(|id| (id.to_string(), json!(-100)))
        .collect();
    body["logit_bias"] = Value::Object(bias);
    let req = Request::post(CHAT)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let mut stream = s.app.clone().oneshot(req).await.unwrap().into_body();
    for _ in 0..6 {
        stream.frame().await.unwrap().unwrap();
    }
    // Control: while it runs it holds a draft sequence.
    assert!(
        draft_sequences_reach(&s, 1).await,
        "a running stream holds no draft sequence ({})",
        s.state.stats.draft_sequences.load(Ordering::SeqCst)
    );
    drop(stream);
    assert!(
        draft_sequences_reach(&s, 0).await,
        "{} draft sequences left 3 s after the client hung up",
        s.state.stats.draft_sequences.load(Ordering::SeqCst)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn constrained_drafted_replies_are_the_plain_servers() {
    let m = model();
    let plain = start(&m, Drafter::None);
    let s = start(&m, Drafter::Itself);
    let mut drafted = 0;
    for p in &PROMPTS[..3] {
        let mut body = chat(p, MAX_TOKENS);
        body["response_format"] = json!({"type": "json_object"});
        let (st, a) = plain.post(CHAT, &body).await;
        assert_eq!(st, StatusCode::OK, "{a}");
        let (st, b) = s.post(CHAT, &body).await;
        assert_eq!(st, StatusCode::OK, "{b}");
        assert_eq!(text(&b), text(&a), "prompt {p:?}");
        let (acc, rej) = drafts(&b).expect("the constrained reply drafted");
        drafted += acc + rej;
        // Control: the grammar held (the reply opens a JSON object).
        assert!(text(&a).trim_start().starts_with('{'), "{}", text(&a));
    }
    assert!(
        drafted > 0,
        "control: the draft model ran under the grammar"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampled_drafted_replies_repeat_by_seed() {
    let s = start(&model(), Drafter::Itself);
    let reply = |seed: u64| {
        let mut body = chat(PROMPTS[3], MAX_TOKENS);
        body["temperature"] = json!(0.9);
        body["seed"] = json!(seed);
        let s = &s;
        async move {
            let (st, v) = s.post(CHAT, &body).await;
            assert_eq!(st, StatusCode::OK, "{v}");
            assert!(drafts(&v).is_some(), "the sampled reply drafted: {v}");
            text(&v)
        }
    };
    let (a, b, c) = (reply(5).await, reply(5).await, reply(6).await);
    assert_eq!(a, b, "a seed repeats");
    assert_ne!(a, c, "control: another seed draws differently");
}
