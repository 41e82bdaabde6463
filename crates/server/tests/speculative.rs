//! `"speculative": {"lookup": N, "draft_max": M}` and `serve --lookup` on the real SmolLM2
//! model (issue 31): greedy replies with prompt lookup equal the plain ones alone, streamed,
//! among 8 concurrent requests mixing lookup and plain (continuous batching) and on
//! /v1/completions, and under a grammar (a schema, `response_format`, a forced tool call);
//! sampled replies with lookup are served streamed and not, reproducible for a seed and
//! inside their grammar; the drafts are counted in `usage.completion_tokens_details`; a
//! server default applies wherever lookup is supported; what is not (mirostat sampling) is
//! a 400 naming it.
//! Controls: drafts were really accepted (else lookup against plain compares plain with
//! plain), the replies differ between prompts, and the requests shared forwards.

mod support;

use axum::http::StatusCode;
use minfer_generate::lookup::LookupConfig;
use minfer_server::ServeConfig;
use minfer_testkit::models;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use support::{chat, chat_stream_text, start, Server};

const CHAT: &str = "/v1/chat/completions";
const CMPL: &str = "/v1/completions";
const MAX_TOKENS: usize = 48;

const FUNCTIONS: [&str; 4] = [
    "def total_price(items, tax):\n    subtotal = 0\n    for item in items:\n        subtotal += item.price * item.count\n    return subtotal * (1 + tax)\n",
    "fn count_words(text: &str) -> usize {\n    let mut count = 0;\n    for word in text.split_whitespace() {\n        count += 1;\n    }\n    count\n}\n",
    "function average(values) {\n  let sum = 0;\n  for (const v of values) {\n    sum += v;\n  }\n  return sum / values.length;\n}\n",
    "def find_user(users, name):\n    for user in users:\n        if user.name == name:\n            return user\n    return None\n",
];

const EDITS: [&str; 2] = [
    "Rewrite this function with the first variable renamed to `acc`. Reply with the code only.",
    "Repeat this function exactly, then say one sentence about it.",
];

/// Eight code-edit prompts, whose replies copy their input.
fn prompts() -> Vec<String> {
    let mut out = Vec::new();
    for f in FUNCTIONS {
        for e in EDITS {
            out.push(format!("{e}\n\n```\n{f}```"));
        }
    }
    out
}

fn text_of(v: &Value) -> String {
    v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_else(|| panic!("no content: {v}"))
        .to_string()
}

/// (accepted, rejected) drafts of a usage object; None when it has no draft counts.
fn drafts(usage: &Value) -> Option<(u64, u64)> {
    let d = usage.get("completion_tokens_details")?;
    Some((
        d["accepted_prediction_tokens"].as_u64().unwrap(),
        d["rejected_prediction_tokens"].as_u64().unwrap(),
    ))
}

fn with_lookup(mut body: Value) -> Value {
    body["speculative"] = json!({"lookup": 3, "draft_max": 8});
    body
}

async fn ok(s: &Server, path: &str, body: &Value) -> Value {
    let (st, v) = s.post(path, body).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookup_replies_equal_plain_alone_streamed_and_among_others() {
    let Some(m) = models::smol() else { return };
    let s = Arc::new(start(
        &m,
        4096,
        ServeConfig {
            parallel: 8,
            ..ServeConfig::default()
        },
    ));
    let ps = prompts();
    let mut plain = Vec::new();
    let (mut accepted, mut rejected) = (0, 0);
    // The prompt whose drafts held best (the stream below must accept some).
    let mut best = (0, 0);
    for (i, p) in ps.iter().enumerate() {
        let v = ok(&s, CHAT, &chat(p, MAX_TOKENS)).await;
        assert_eq!(drafts(&v["usage"]), None, "a plain reply counts no drafts");
        plain.push(text_of(&v));
        let v = ok(&s, CHAT, &with_lookup(chat(p, MAX_TOKENS))).await;
        assert_eq!(text_of(&v), *plain.last().unwrap(), "prompt {p:?}");
        let (a, r) = drafts(&v["usage"]).expect("a lookup reply counts its drafts");
        accepted += a;
        rejected += r;
        if a > best.1 {
            best = (i, a);
        }
    }
    // Control: drafts were verified and accepted (SmolLM2-135M copies less than the demo
    // model: about 30% of the drafts hold on these).
    assert!(accepted >= 30, "{accepted} accepted, {rejected} rejected");
    let distinct: std::collections::HashSet<_> = plain.iter().collect();
    assert!(
        distinct.len() >= 6,
        "only {} distinct replies",
        distinct.len()
    );

    // Streamed with lookup equals non-streamed; the usage chunk counts the drafts.
    let mut body = with_lookup(chat(&ps[best.0], MAX_TOKENS));
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let (st, ev) = s.stream(CHAT, &body).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(chat_stream_text(&ev, 1)[0], plain[best.0]);
    let usage: Value = serde_json::from_str(&ev[ev.len() - 2]).unwrap();
    assert!(
        drafts(&usage["usage"]).is_some_and(|(a, _)| a > 0),
        "{usage}"
    );

    // Eight at once, lookup and plain interleaved, streamed and not: each the same reply.
    let forwards_before = s.state.stats.forwards.load(Ordering::Relaxed);
    s.state.stats.max_running.store(0, Ordering::Relaxed);
    let tasks: Vec<_> = ps
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let s = s.clone();
            let mut body = chat(p, MAX_TOKENS);
            if i % 2 == 0 {
                body = with_lookup(body);
            }
            tokio::spawn(async move {
                if i % 4 < 2 {
                    body["stream"] = json!(true);
                    let (st, ev) = s.stream(CHAT, &body).await;
                    assert_eq!(st, StatusCode::OK);
                    chat_stream_text(&ev, 1).remove(0)
                } else {
                    text_of(&ok(&s, CHAT, &body).await)
                }
            })
        })
        .collect();
    for (i, t) in tasks.into_iter().enumerate() {
        assert_eq!(
            t.await.unwrap(),
            plain[i],
            "request {i} changed among others"
        );
    }
    let max = s.state.stats.max_running.load(Ordering::Relaxed);
    let forwards = s.state.stats.forwards.load(Ordering::Relaxed) - forwards_before;
    assert!(max >= 4, "at most {max} sequences ran together");
    assert!(
        forwards < ps.len() * MAX_TOKENS / 2,
        "{forwards} forwards for {} requests: not batched",
        ps.len()
    );

    // Text completions: a raw prompt that repeats itself, with and without lookup.
    let raw = format!("Copy the code.\n\n{0}\nCopy:\n{0}", FUNCTIONS[0]);
    let body = json!({"prompt": raw, "max_tokens": MAX_TOKENS, "temperature": 0});
    let v = ok(&s, CMPL, &body).await;
    let expect = v["choices"][0]["text"].clone();
    let v = ok(&s, CMPL, &with_lookup(body)).await;
    assert_eq!(v["choices"][0]["text"], expect);
    assert!(drafts(&v["usage"]).is_some_and(|(a, _)| a > 0), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_default_applies_where_supported_and_a_request_may_turn_it_off() {
    let Some(m) = models::smol() else { return };
    let s = start(
        &m,
        2048,
        ServeConfig {
            lookup: Some(LookupConfig::default()),
            ..ServeConfig::default()
        },
    );
    let p = &prompts()[1];
    let v = ok(&s, CHAT, &chat(p, MAX_TOKENS)).await;
    let expect = text_of(&v);
    assert!(drafts(&v["usage"]).is_some(), "the default ran: {v}");
    for off in [json!({"speculative": false})] {
        let mut body = chat(p, MAX_TOKENS);
        body.as_object_mut()
            .unwrap()
            .extend(off.as_object().unwrap().clone());
        let v = ok(&s, CHAT, &body).await;
        assert_eq!(text_of(&v), expect);
        assert_eq!(
            drafts(&v["usage"]),
            None,
            "`speculative: false` turns it off: {v}"
        );
    }
    // `null` reads as absent (as every optional field here): the default.
    let mut body = chat(p, MAX_TOKENS);
    body["speculative"] = Value::Null;
    assert!(drafts(&ok(&s, CHAT, &body).await["usage"]).is_some());
    // A sampled or a constrained request speculates too ...
    let mut body = chat(p, 8);
    body["temperature"] = json!(0.8);
    assert!(drafts(&ok(&s, CHAT, &body).await["usage"]).is_some());
    let mut body = chat(p, 8);
    body["response_format"] = json!({"type": "json_object"});
    assert!(drafts(&ok(&s, CHAT, &body).await["usage"]).is_some());
    // ... mirostat sampling is served plainly (the default steps aside) ...
    let mut body = chat(p, 8);
    body["temperature"] = json!(0.8);
    body["mirostat"] = json!(2);
    assert_eq!(drafts(&ok(&s, CHAT, &body).await["usage"]), None);
    // ... while asking for lookup with it is refused (control for the step-aside).
    body["speculative"] = json!({});
    let (st, v) = s.post(CHAT, &body).await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_lookup_cannot_do_is_refused_by_name() {
    let Some(m) = models::smol() else { return };
    let s = start(&m, 2048, ServeConfig::default());
    let base = || chat("Say hi.", 4);
    let set = |mut b: Value, k: &str, v: Value| {
        b[k] = v;
        b
    };
    let cases: Vec<(Value, &str, &str)> = vec![
        (
            set(base(), "speculative", json!({"lookup": 0})),
            "speculative.lookup",
            "out of range",
        ),
        (
            set(base(), "speculative", json!({"lookup": 17})),
            "speculative.lookup",
            "out of range",
        ),
        (
            set(base(), "speculative", json!({"lookup": 2.5})),
            "speculative.lookup",
            "integer",
        ),
        (
            set(base(), "speculative", json!({"lookup": "3"})),
            "speculative.lookup",
            "integer",
        ),
        (
            set(base(), "speculative", json!({"draft_max": 0})),
            "speculative.draft_max",
            "out of range",
        ),
        (
            set(base(), "speculative", json!({"draft_max": 65})),
            "speculative.draft_max",
            "out of range",
        ),
        (
            set(base(), "speculative", json!({"draft": "x.gguf"})),
            "speculative.draft",
            "takes `true` (the server's draft model) or `false`",
        ),
        (
            set(base(), "speculative", json!({"drafts": false})),
            "speculative.drafts",
            "not supported",
        ),
        (
            set(base(), "speculative", json!("lookup")),
            "speculative",
            "object",
        ),
        (
            set(
                set(
                    set(base(), "speculative", json!({})),
                    "temperature",
                    json!(0.7),
                ),
                "mirostat",
                json!(2),
            ),
            "speculative",
            "`mirostat`",
        ),
    ];
    for (body, param, says) in cases {
        let (st, v) = s.post(CHAT, &body).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{body}: {v}");
        assert_eq!(v["error"]["param"], param, "{body}: {v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(says), "{body}: {msg}");
    }
    // Text completions read the same field.
    let body = json!({"prompt": "a", "max_tokens": 2, "temperature": 0.5, "mirostat": 1, "speculative": {"lookup": 2}});
    let (st, v) = s.post(CMPL, &body).await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["error"]["param"], "speculative");
    // Controls: the edges of the ranges, `true` and `false`, sampling and grammars are served.
    let sampled = set(
        set(base(), "speculative", json!({})),
        "temperature",
        json!(0.7),
    );
    ok(&s, CHAT, &sampled).await;
    ok(
        &s,
        CMPL,
        &json!({"prompt": "a", "max_tokens": 2, "temperature": 0.5, "speculative": {"lookup": 2}}),
    )
    .await;
    for (k, v) in [
        ("grammar", json!("root ::= \"a\"")),
        ("json_schema", json!({"type": "object"})),
        ("response_format", json!({"type": "json_object"})),
    ] {
        ok(&s, CHAT, &set(set(base(), "speculative", json!({})), k, v)).await;
    }
    for spec in [
        json!({"lookup": 1, "draft_max": 1}),
        json!({"lookup": 16, "draft_max": 64}),
        json!(true),
        json!(false),
    ] {
        ok(&s, CHAT, &set(base(), "speculative", spec)).await;
    }
}

/// A forced tool call is a grammar too (on the Qwen demo model, whose template has tools):
/// with lookup its greedy call is the plain one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_tool_call_with_lookup_is_the_plain_call() {
    let Some(m) = models::qwen() else { return };
    let s = start(&m, 2048, ServeConfig::default());
    let body = |choice: &str| {
        json!({
            "messages": [{"role": "user", "content": "Weather in Paris? Then in Paris, France."}],
            "tools": [{"type": "function", "function": {"name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
            "tool_choice": choice, "max_tokens": 32, "temperature": 0,
        })
    };
    let plain = ok(&s, CHAT, &body("required")).await;
    let v = ok(&s, CHAT, &with_lookup(body("required"))).await;
    assert_eq!(
        v["choices"][0]["message"]["tool_calls"][0]["function"],
        plain["choices"][0]["message"]["tool_calls"][0]["function"],
        "{v}"
    );
    assert!(
        plain["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"].is_string(),
        "control: a call was made: {plain}"
    );
    assert!(drafts(&v["usage"]).is_some(), "{v}");
    // Control: tools the reply may use or not leave it unconstrained, and lookup runs.
    let v = ok(&s, CHAT, &with_lookup(body("auto"))).await;
    assert!(drafts(&v["usage"]).is_some(), "{v}");
}

/// Under a grammar, greedy replies with lookup are the plain ones, streamed and not; sampled
/// replies with lookup are served streamed and not, the same for the same seed, and stay
/// inside their grammar.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn constrained_and_sampled_requests_speculate() {
    let Some(m) = models::smol() else { return };
    let s = start(&m, 4096, ServeConfig::default());
    let record = r#"{"name": "total_price", "args": ["items", "tax"], "lines": 5, "pure": true}"#;
    let p = format!("Repeat this JSON object exactly, with no other text:\n{record}");
    let json_object = |mut b: Value| {
        b["response_format"] = json!({"type": "json_object"});
        b
    };
    let (mut accepted, mut counted) = (0, 0);
    for grammar in [
        json!({"response_format": {"type": "json_object"}}),
        json!({"grammar": "root ::= \"{\\\"name\\\": \\\"\" [a-z_]+ \"\\\"}\""}),
    ] {
        let mut body = chat(&p, MAX_TOKENS);
        body.as_object_mut()
            .unwrap()
            .extend(grammar.as_object().unwrap().clone());
        let plain = text_of(&ok(&s, CHAT, &body).await);
        let v = ok(&s, CHAT, &with_lookup(body.clone())).await;
        assert_eq!(text_of(&v), plain, "{grammar}");
        let (a, r) = drafts(&v["usage"]).expect("drafts counted");
        accepted += a;
        counted += a + r;
        let mut body = with_lookup(body);
        body["stream"] = json!(true);
        let (st, ev) = s.stream(CHAT, &body).await;
        assert_eq!(st, StatusCode::OK);
        assert_eq!(chat_stream_text(&ev, 1)[0], plain, "streamed, {grammar}");
    }
    eprintln!("constrained greedy: {accepted} of {counted} drafts kept");
    assert!(accepted > 0, "control: drafts held under the grammar");

    // Sampled, with and without a grammar: a seed repeats, streamed or not.
    for constrained in [false, true] {
        let mut body = with_lookup(chat(&p, MAX_TOKENS));
        body["temperature"] = json!(0.8);
        body["seed"] = json!(7);
        if constrained {
            body = json_object(body);
        }
        let v = ok(&s, CHAT, &body).await;
        let text = text_of(&v);
        assert!(drafts(&v["usage"]).is_some(), "{v}");
        assert_eq!(text_of(&ok(&s, CHAT, &body).await), text, "seeded");
        let mut streamed = body.clone();
        streamed["stream"] = json!(true);
        let (st, ev) = s.stream(CHAT, &streamed).await;
        assert_eq!(st, StatusCode::OK);
        assert_eq!(chat_stream_text(&ev, 1)[0], text, "streamed, seeded");
        if constrained && v["choices"][0]["finish_reason"] == "stop" {
            let parsed: Value =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
            assert!(parsed.is_object());
        }
    }
}
