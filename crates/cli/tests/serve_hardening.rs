//! `minfer serve`'s auth, CORS and limits through the real binary (issue 34): the key from
//! the flag, a file or `MINFER_API_KEY`, checked on every route but `/health` and the page;
//! CORS headers only for `--cors-origin`; each limit (`--max-body-bytes`, `--header-timeout`,
//! `--max-n`, `--max-prompt-tokens`, `--max-total-tokens`, `--max-tools-bytes`) refused one
//! past its value with an OpenAI-shaped JSON error and accepted at it.
//!
//! Controls: without `.header_read_timeout(…)` in server/src/shutdown.rs a slow-loris
//! connection stays open and `a_slow_client_is_disconnected…` fails; dropping the key check
//! in routes/mod.rs `guard` fails `the_key_…` on the first 401 it expects.

mod serve_child;

use serve_child::{tiny_model, tmpdir, Server};
use std::io::Write;
use std::time::{Duration, Instant};

fn bearer(k: &str) -> String {
    format!("Bearer {k}")
}

#[test]
fn the_key_comes_from_a_file_or_the_environment_and_guards_all_but_health_and_the_page() {
    let d = tmpdir("hardening-key");
    let m = tiny_model(&d);
    let keyfile = d.join("key");
    std::fs::write(&keyfile, "sk-from-file\n").unwrap();
    let s = Server::start(&m, &["--api-key-file", keyfile.to_str().unwrap()], &[]);
    assert_eq!(s.request("GET", "/health", &[], b"").status, 200);
    assert_eq!(
        s.request("GET", "/", &[], b"").status,
        200,
        "the page asks for the key itself"
    );
    let chat = r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}"#;
    for (path, method, body) in [
        ("/v1/models", "GET", ""),
        ("/metrics", "GET", ""),
        ("/v1/chat/completions", "POST", chat),
        (
            "/v1/completions",
            "POST",
            r#"{"prompt":"hi","max_tokens":2}"#,
        ),
        ("/tokenize", "POST", r#"{"content":"hi"}"#),
        ("/detokenize", "POST", r#"{"tokens":[1]}"#),
        ("/no/such/route", "GET", ""),
    ] {
        for auth in [
            None,
            Some(bearer("sk-from-fil")),
            Some(bearer("sk-from-file2")),
        ] {
            let mut h = vec![("Content-Type", "application/json")];
            if let Some(a) = &auth {
                h.push(("Authorization", a));
            }
            let r = s.request(method, path, &h, body.as_bytes());
            assert_eq!(r.status, 401, "{method} {path} with {auth:?}: {}", r.text());
            assert!(r.is_api_error(), "{}", r.text());
        }
        let k = bearer("sk-from-file");
        let h = [
            ("Content-Type", "application/json"),
            ("Authorization", &k[..]),
        ];
        let r = s.request(method, path, &h, body.as_bytes());
        let want = if path == "/no/such/route" { 404 } else { 200 };
        assert_eq!(r.status, want, "{method} {path}: {}", r.text());
    }
    drop(s);

    let s = Server::start(&m, &[], &[("MINFER_API_KEY", "sk-env")]);
    assert_eq!(s.request("GET", "/v1/models", &[], b"").status, 401);
    let k = bearer("sk-env");
    assert_eq!(
        s.request("GET", "/v1/models", &[("Authorization", &k)], b"")
            .status,
        200
    );
    drop(s);

    let run = |args: &[&str], env: &[(&str, &str)]| {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_minfer"));
        c.arg("serve")
            .arg("-m")
            .arg(&m)
            .args(args)
            .env_remove("MINFER_API_KEY");
        for (k, v) in env {
            c.env(k, v);
        }
        let o = c.output().unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    std::fs::write(&keyfile, "  \n").unwrap();
    let (code, err) = run(&["--api-key-file", keyfile.to_str().unwrap()], &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--api-key-file") && err.contains("empty"),
        "{err}"
    );
    let (code, err) = run(&[], &[("MINFER_API_KEY", "")]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("MINFER_API_KEY") && err.contains("empty"),
        "{err}"
    );
    let (code, err) = run(&["--api-key-file", "/nonexistent/key"], &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("/nonexistent/key"), "{err}");
    let (code, err) = run(&["--api-key", "a", "--api-key-file", "/x"], &[]);
    assert_eq!(code, Some(2), "{err}");
}

#[test]
fn cors_headers_only_for_the_origin_given() {
    let d = tmpdir("hardening-cors");
    let m = tiny_model(&d);
    let s = Server::start(&m, &[], &[]);
    let o = [("Origin", "http://evil.test")];
    let r = s.request("GET", "/v1/models", &o, b"");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("access-control-allow-origin"), None, "{r:?}");
    let r = s.request("OPTIONS", "/v1/chat/completions", &o, b"");
    assert_eq!(
        r.status, 405,
        "no preflight is answered without --cors-origin"
    );
    assert!(r.is_api_error(), "{}", r.text());
    drop(s);

    let s = Server::start(
        &m,
        &["--cors-origin", "http://app.test", "--api-key", "k"],
        &[],
    );
    let ok = [("Origin", "http://app.test")];
    let r = s.request("OPTIONS", "/v1/chat/completions", &ok, b"");
    assert_eq!(r.status, 204, "{r:?}");
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("http://app.test")
    );
    assert!(r
        .header("access-control-allow-headers")
        .is_some_and(|h| h.contains("authorization")));
    // A refusal still carries the header, so the page can read the error.
    let r = s.request("GET", "/v1/models", &ok, b"");
    assert_eq!(r.status, 401);
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("http://app.test")
    );
    let r = s.request("GET", "/v1/models", &o, b"");
    assert_eq!(r.header("access-control-allow-origin"), None, "{r:?}");
    let (code, err) = {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_minfer"))
            .args(["serve", "-m"])
            .arg(&m)
            .args(["--cors-origin", "app.test/"])
            .output()
            .unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--cors-origin"), "{err}");
}

fn chat_body(content: &str, extra: &str) -> String {
    format!(r#"{{"messages":[{{"role":"user","content":{content:?}}}],"temperature":0{extra}}}"#)
}

#[test]
fn each_limit_is_its_flag_with_a_json_error_one_past_it() {
    let d = tmpdir("hardening-limits");
    let m = tiny_model(&d);
    let s = Server::start(
        &m,
        &[
            "--parallel",
            "3",
            "--max-n",
            "2",
            "--max-body-bytes",
            "2000",
            "--max-prompt-tokens",
            "400",
            "--max-total-tokens",
            "50",
            "--max-tools-bytes",
            "300",
            "-c",
            "1024",
        ],
        &[],
    );
    let expect = |body: &str, status: u16, needle: &str| {
        let r = s.post_json("/v1/chat/completions", body, &[]);
        assert_eq!(r.status, status, "{body}: {}", r.text());
        if status >= 400 {
            assert!(r.is_api_error(), "{}", r.text());
            assert!(r.text().contains(needle), "{needle}: {}", r.text());
        }
    };
    // The body: 2000 bytes pass the size check (then fail as JSON), 2001 are a 413.
    let pad = |n: usize| {
        let base = chat_body("hi", r#","max_tokens":1,"user":"""#);
        let fill = n - base.len();
        format!("{}{}\"}}", &base[..base.len() - 2], "x".repeat(fill))
    };
    assert_eq!(pad(2000).len(), 2000);
    expect(&pad(2000), 200, "");
    expect(&pad(2001), 413, "2000");
    expect(&chat_body("hi", r#","n":2,"max_tokens":2"#), 200, "");
    expect(&chat_body("hi", r#","n":3,"max_tokens":2"#), 400, "--max-n");
    expect(&chat_body("hi", r#","n":2,"max_tokens":25"#), 200, "");
    expect(
        &chat_body("hi", r#","n":2,"max_tokens":26"#),
        400,
        "--max-total-tokens",
    );
    // No max_tokens: up to the context (1024) per choice, past the 50 in all.
    expect(&chat_body("hi", ""), 400, "too_many_tokens");
    // 500 letters and spaces are more than 400 tokens for the built-in tokenizer, fewer
    // than the context (1024): the limit refuses them, not the context.
    expect(
        &chat_body(&"a ".repeat(500), r#","max_tokens":2"#),
        400,
        "--max-prompt-tokens",
    );
    expect(&chat_body("a", r#","max_tokens":2"#), 200, "");
    let tool = |desc: &str| {
        format!(
            r#","max_tokens":2,"tools":[{{"type":"function","function":{{"name":"f","description":"{desc}","parameters":{{"type":"object"}}}}}}]"#
        )
    };
    // The tools' compact JSON: 93 bytes plus the description.
    let small = tool(&"d".repeat(300 - 93));
    let big = tool(&"d".repeat(301 - 93));
    expect(&chat_body("hi", &small), 200, "");
    expect(&chat_body("hi", &big), 400, "--max-tools-bytes");
}

#[test]
fn a_slow_client_is_disconnected_at_the_header_timeout_and_health_answers_meanwhile() {
    let d = tmpdir("hardening-loris");
    let m = tiny_model(&d);
    let s = Server::start(&m, &["--header-timeout", "1"], &[]);
    let mut slow: Vec<_> = (0..8).map(|_| s.connect()).collect();
    let t = Instant::now();
    for c in &mut slow {
        c.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            .unwrap();
    }
    // /health answers while eight clients hold half a header each.
    assert_eq!(s.request("GET", "/health", &[], b"").status, 200);
    for c in &mut slow {
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let got = serve_child::read_all(c, Duration::from_secs(5));
        let text = String::from_utf8_lossy(&got);
        // hyper ends the connection, with a 408 or without a reply.
        assert!(got.is_empty() || text.starts_with("HTTP/1.1 408"), "{text}");
    }
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(4),
        "the slow connections closed after {took:?} (timeout 1 s)"
    );
}
