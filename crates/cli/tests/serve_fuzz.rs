//! The hostile-HTTP fuzzer (issue 34): requests generated from the API's own request shapes
//! (chat and text completions with their sampling, tools, `response_format`, logprobs,
//! streaming; tokenize, detokenize, the GET routes), then mutated at three levels:
//!
//! - JSON: a node replaced by another type, a huge or non-finite number, a deep nesting,
//!   a long string, a lone surrogate escape; keys dropped, added, duplicated;
//! - bytes: invalid UTF-8 spliced in, the body cut short, bytes flipped, 10 MB bodies;
//! - transport: a Content-Length that lies, chunked bodies with bad sizes, header floods,
//!   bytes that are not HTTP, requests pipelined with garbage after them, streams the client
//!   half-closes or drops mid-reply, slow-loris headers.
//!
//! Each reply must be a valid completion (JSON, or SSE ending in `[DONE]`) or a 4xx/5xx —
//! with the OpenAI error shape whenever the request was well-formed HTTP (hyper answers
//! broken HTTP itself with a bare 400/408/431) — and `/health` must answer after every case;
//! the server must never exit nor print a panic, and its RSS is reported at the end.
//!
//! `MINFER_FUZZ_CASES` sets the number of cases (default 10⁴: CI's size, ~10 s);
//! `MINFER_FUZZ_SEED` replays a run (the seed is printed). `scripts/fuzz-http` runs the
//! long scheduled size (10⁵).
//!
//! Control: a `panic!` in `body()` of server/src/routes/mod.rs for a body over the limit
//! (tokio ends only that connection's task, so the server lives on) fails the first
//! big-body case with "no reply to well-formed HTTP".

mod serve_child;
mod serve_fuzz_gen;

use minfer_testkit::rng::Rng;
use serde_json::{json, Value};
use serve_child::{tiny_model, tmpdir, Reply, Server};
use serve_fuzz_gen::{chance, generate, mutate_json, pick, text, to_bytes};
use std::io::{Read, Write};
use std::time::{Duration, Instant};

fn cases() -> usize {
    std::env::var("MINFER_FUZZ_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000)
}

fn http(method: &str, path: &str, body: &[u8], extra: &str, close: bool) -> Vec<u8> {
    let conn = if close { "close" } else { "keep-alive" };
    let mut r = format!(
        "{method} {path} HTTP/1.1\r\nHost: fuzz\r\nConnection: {conn}\r\nContent-Type: application/json\r\n{extra}"
    );
    if method == "POST" {
        r.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    r.push_str("\r\n");
    let mut v = r.into_bytes();
    v.extend_from_slice(body);
    v
}

/// What a case sends, and how strictly its reply is judged.
struct Case {
    bytes: Vec<u8>,
    /// Well-formed HTTP: an error reply must have the OpenAI shape.
    well_formed: bool,
    path: &'static str,
    /// How: send all (0), send and half-close (1), send part then drop (2).
    how: u8,
    label: &'static str,
}

fn make_case(rng: &mut Rng, limit: usize) -> Case {
    let (method, path, body) = generate(rng);
    let mut body = body.unwrap_or(Value::Null);
    let mutate = chance(rng, 75);
    if mutate && !body.is_null() {
        for _ in 0..1 + rng.below(3) {
            mutate_json(rng, &mut body, 0);
        }
    }
    let bytes = if body.is_null() {
        Vec::new()
    } else if mutate {
        to_bytes(rng, &body)
    } else {
        serde_json::to_vec(&body).unwrap()
    };
    let well = |bytes, label| Case {
        bytes,
        well_formed: true,
        path,
        how: 0,
        label,
    };
    match rng.below(40) {
        // A body over the limit (10 MB at most), sent whole.
        0 => {
            let n = if chance(rng, 30) {
                10_000_000
            } else {
                limit + 1 + rng.below(limit)
            };
            let mut big = br#"{"messages":[{"role":"user","content":""#.to_vec();
            big.resize(n, b'a');
            well(
                http("POST", "/v1/chat/completions", &big, "", true),
                "big body",
            )
        }
        // A Content-Length that promises 10 bytes more than come, then half-close.
        1 => {
            let mut b = format!(
                "POST {path} HTTP/1.1\r\nHost: f\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
                bytes.len() + 10
            )
            .into_bytes();
            b.extend_from_slice(&bytes);
            Case {
                bytes: b,
                well_formed: false,
                path,
                how: 1,
                label: "short body",
            }
        }
        // Chunked with a bad size line.
        2 => {
            let r = format!(
                "POST {path} HTTP/1.1\r\nHost: f\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n{}\r\n{}\r\n0\r\n\r\n",
                pick(rng, &["zz", "ffffffffffffffffff", "-1", "3"]),
                String::from_utf8_lossy(&bytes)
            );
            Case {
                bytes: r.into_bytes(),
                well_formed: false,
                path,
                how: 0,
                label: "bad chunk",
            }
        }
        // A flood of headers, or one huge one.
        3 => {
            let extra = if chance(rng, 50) {
                (0..200)
                    .map(|i| format!("X-H{i}: v\r\n"))
                    .collect::<String>()
            } else {
                format!("X-Big: {}\r\n", "v".repeat(100_000))
            };
            Case {
                bytes: http(method, path, &bytes, &extra, true),
                well_formed: false,
                path,
                how: 0,
                label: "header flood",
            }
        }
        // Not HTTP at all.
        4 => {
            let junk: Vec<u8> = (0..1 + rng.below(2000))
                .map(|_| rng.below(256) as u8)
                .collect();
            Case {
                bytes: junk,
                well_formed: false,
                path,
                how: 1,
                label: "junk",
            }
        }
        // A valid request pipelined with garbage after it.
        5 => {
            let mut b = http(method, path, &bytes, "", false);
            b.extend_from_slice(b"GARBAGE \x00\xff HTTP/9.9\r\n\r\n");
            Case {
                bytes: b,
                well_formed: false,
                path,
                how: 1,
                label: "pipelined garbage",
            }
        }
        // A stream the client drops part way through its reply.
        6 => {
            let body = json!({"messages": [{"role": "user", "content": text(rng)}],
                "stream": true, "max_tokens": 64});
            let b = serde_json::to_vec(&body).unwrap();
            Case {
                bytes: http("POST", "/v1/chat/completions", &b, "", true),
                well_formed: true,
                path: "/v1/chat/completions",
                how: 2,
                label: "dropped stream",
            }
        }
        // Two requests pipelined on one connection.
        7 => {
            let mut b = http(method, path, &bytes, "", false);
            b.extend(http("GET", "/health", b"", "", true));
            Case {
                bytes: b,
                well_formed: true,
                path,
                how: 0,
                label: "pipelined",
            }
        }
        _ => well(
            http(method, path, &bytes, "", true),
            if mutate { "mutated" } else { "valid" },
        ),
    }
}

/// Every reply in `raw` (pipelined replies one after another), parsed.
fn replies(raw: &[u8]) -> Vec<Reply> {
    let mut out = Vec::new();
    let mut rest = raw;
    while let Some(start) = rest.windows(9).position(|w| w == b"HTTP/1.1 ") {
        let slice = &rest[start..];
        let next = slice[9..]
            .windows(9)
            .position(|w| w == b"HTTP/1.1 ")
            .map_or(slice.len(), |p| p + 9);
        if let Some(r) = Reply::parse(&slice[..next]) {
            out.push(r);
        }
        rest = &slice[next..];
    }
    out
}

/// Judges one reply; Err names what is wrong.
fn judge(case: &Case, r: &Reply) -> Result<(), String> {
    let ok_status = (200..300).contains(&r.status) || (400..600).contains(&r.status);
    if !ok_status {
        return Err(format!("status {}", r.status));
    }
    if r.status >= 400 {
        // hyper's own replies to broken HTTP have no body; ours always have the shape.
        if case.well_formed && !r.is_api_error() && !r.body.is_empty() {
            return Err(format!(
                "a {} without the error shape: {}",
                r.status,
                r.text()
            ));
        }
        if !r.body.is_empty() && !r.is_api_error() {
            return Err(format!(
                "a {} body that is not the error shape: {}",
                r.status,
                r.text()
            ));
        }
        return Ok(());
    }
    let ct = r.header("content-type").unwrap_or("");
    if ct.starts_with("text/event-stream") {
        if case.how == 2 {
            return Ok(());
        }
        let t = r.text();
        if !t.trim_end().ends_with("data: [DONE]") {
            return Err(format!("a stream without [DONE]: {t}"));
        }
        for line in t.lines().filter_map(|l| l.strip_prefix("data: ")) {
            if line != "[DONE]" && serde_json::from_str::<Value>(line).is_err() {
                return Err(format!("a stream event that is not JSON: {line}"));
            }
        }
        return Ok(());
    }
    if ct.starts_with("application/json") {
        let j = r
            .json()
            .ok_or_else(|| format!("200 JSON that does not parse: {}", r.text()))?;
        let completion = matches!(
            j["object"].as_str(),
            Some("chat.completion") | Some("text_completion")
        );
        if (case.path.starts_with("/v1/c")) && !completion && case.label != "pipelined" {
            return Err(format!(
                "a 200 from {} that is not a completion: {j}",
                case.path
            ));
        }
        if completion && j["choices"].as_array().is_none_or(|c| c.is_empty()) {
            return Err(format!("a completion without choices: {j}"));
        }
    }
    Ok(())
}

fn rss_kb(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let l = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    l.split_whitespace().nth(1)?.parse().ok()
}

#[test]
fn hostile_requests_get_a_completion_or_a_json_error_and_health_answers_throughout() {
    let seed = std::env::var("MINFER_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!("MINFER_FUZZ_SEED={seed}");
    let d = tmpdir("fuzz-http");
    let m = tiny_model(&d);
    let limit = 1 << 20;
    let mut s = Server::start(
        &m,
        &[
            "--parallel",
            "2",
            "-c",
            "256",
            "--max-body-bytes",
            &limit.to_string(),
            "--header-timeout",
            "2",
            "--queue",
            "16",
        ],
        &[],
    );
    let pid = s.pid();
    let rss0 = rss_kb(pid);
    // Slow-loris clients held open through the whole run: the timeout must end them.
    let mut loris: Vec<_> = (0..16).map(|_| s.connect()).collect();
    for c in &mut loris {
        c.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            .unwrap();
    }
    let mut rng = Rng::splitmix64(seed);
    let t0 = Instant::now();
    let mut tally = std::collections::BTreeMap::<String, usize>::new();
    // RSS after each tenth of the run: flat after warm-up, or growing with the cases.
    let mut rss = Vec::new();
    let n = cases();
    for i in 0..n {
        let case = make_case(&mut rng, limit);
        let mut c = s.connect();
        c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let raw = match case.how {
            2 => {
                let _ = c.write_all(&case.bytes);
                let mut buf = [0u8; 256];
                let got = c.read(&mut buf).unwrap_or(0);
                drop(c);
                buf[..got].to_vec()
            }
            how => {
                let _ = c.write_all(&case.bytes);
                if how == 1 {
                    let _ = c.shutdown(std::net::Shutdown::Write);
                }
                serve_child::read_all(&mut c, Duration::from_secs(30))
            }
        };
        let rs = replies(&raw);
        for r in &rs {
            if let Err(why) = judge(&case, r) {
                panic!(
                    "case {i} ({}, seed {seed}): {why}\nsent: {:?}",
                    case.label,
                    String::from_utf8_lossy(&case.bytes[..case.bytes.len().min(600)])
                );
            }
            *tally
                .entry(format!("{} {}", case.label, r.status))
                .or_default() += 1;
        }
        if rs.is_empty() {
            // Only broken HTTP or a dropped stream may end without a reply.
            assert!(
                !case.well_formed || case.how == 2,
                "case {i} ({}, seed {seed}): no reply to well-formed HTTP\nsent: {:?}",
                case.label,
                String::from_utf8_lossy(&case.bytes[..case.bytes.len().min(600)])
            );
            *tally.entry(format!("{} closed", case.label)).or_default() += 1;
        }
        assert!(
            s.alive(),
            "case {i} ({}): the server exited\n{}",
            case.label,
            s.stderr()
        );
        let h = s.request("GET", "/health", &[], b"");
        assert_eq!(
            h.status, 200,
            "case {i} ({}): /health said {h:?}",
            case.label
        );
        if (i + 1) % (n / 10).max(1) == 0 {
            rss.push(rss_kb(pid).unwrap_or(0));
        }
    }
    let took = t0.elapsed();
    for c in &mut loris {
        let got = serve_child::read_all(c, Duration::from_secs(5));
        let t = String::from_utf8_lossy(&got);
        assert!(
            got.is_empty() || t.starts_with("HTTP/1.1 408"),
            "a slow client: {t}"
        );
    }
    let log = s.stderr();
    assert!(!log.contains("panicked"), "{log}");
    eprintln!(
        "{n} cases in {:.1} s ({:.0}/s); RSS {rss0:?} kB at start, then per tenth {rss:?} kB; replies: {tally:?}",
        took.as_secs_f64(),
        n as f64 / took.as_secs_f64()
    );
}
