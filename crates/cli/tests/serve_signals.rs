//! `minfer serve` through the binary: SIGTERM/SIGINT stop accepting connections, answer new
//! requests on open connections with 503, let in-flight ones finish within --drain-timeout,
//! then exit 0 and log what was abandoned.

use minfer_testkit::models;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

struct Served {
    child: Child,
    addr: String,
    /// The server's stderr lines after the `listening` line.
    log: mpsc::Receiver<String>,
}

fn serve(model: &std::path::Path, extra: &[&str]) -> Served {
    let mut child = Command::new(env!("CARGO_BIN_EXE_minfer"))
        .args(["serve", "-m"])
        .arg(model)
        .args(["--port", "0", "-c", "2048", "-t", "2"])
        .args(extra)
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let err = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let t0 = Instant::now();
    let addr = loop {
        let line = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the server printed its address");
        if let Some(a) = line.strip_prefix("listening on http://") {
            break a.to_string();
        }
        assert!(t0.elapsed() < Duration::from_secs(60));
    };
    Served {
        child,
        addr,
        log: rx,
    }
}

fn post(path: &str, body: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// Reads one response with a Content-Length body: (status, body).
fn read_response(r: &mut BufReader<TcpStream>) -> (u16, String) {
    let mut status = String::new();
    r.read_line(&mut status).unwrap();
    let code: u16 = status.split(' ').nth(1).unwrap().parse().unwrap();
    let mut len = 0;
    loop {
        let mut h = String::new();
        r.read_line(&mut h).unwrap();
        if h == "\r\n" {
            break;
        }
        if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
            len = v.trim().parse().unwrap();
        }
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body).unwrap();
    (code, String::from_utf8(body).unwrap())
}

fn signal(child: &Child, sig: i32) {
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
}

fn wait_exit(child: &mut Child, within: Duration) -> std::process::ExitStatus {
    let t0 = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        assert!(t0.elapsed() < within, "the server did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn log_until(s: &Served, needle: &str) -> String {
    let t0 = Instant::now();
    let mut all = String::new();
    while t0.elapsed() < Duration::from_secs(30) {
        match s.log.recv_timeout(Duration::from_secs(30)) {
            Ok(l) => {
                all.push_str(&l);
                all.push('\n');
                if l.contains(needle) {
                    return all;
                }
            }
            Err(_) => break,
        }
    }
    panic!("{needle:?} not logged; log: {all}");
}

#[test]
fn sigterm_drains_in_flight_requests_refuses_new_ones_and_exits_0() {
    let Some(model) = models::smol() else { return };
    let mut s = serve(&model, &["--drain-timeout", "30"]);
    // An idle keep-alive connection, proven open by one request.
    let idle = TcpStream::connect(&s.addr).unwrap();
    let mut idle_r = BufReader::new(idle.try_clone().unwrap());
    (&idle)
        .write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    assert_eq!(read_response(&mut idle_r).0, 200);
    // A streaming request in flight.
    let busy = TcpStream::connect(&s.addr).unwrap();
    let body = r#"{"messages":[{"role":"user","content":"Count from one to fifty."}],"max_tokens":48,"temperature":0,"stream":true}"#;
    (&busy)
        .write_all(post("/v1/chat/completions", body).as_bytes())
        .unwrap();
    let mut busy_r = BufReader::new(busy);
    let mut line = String::new();
    while !line.starts_with("data: ") {
        line.clear();
        busy_r.read_line(&mut line).unwrap();
    }
    signal(&s.child, libc::SIGTERM);
    log_until(&s, "shutting down");
    // New work on the open connection: 503, draining.
    (&idle)
        .write_all(
            post(
                "/v1/chat/completions",
                r#"{"messages":[{"role":"user","content":"hi"}]}"#,
            )
            .as_bytes(),
        )
        .unwrap();
    let (code, body) = read_response(&mut idle_r);
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("draining"), "{body}");
    // No new connections.
    let refused = TcpStream::connect_timeout(&s.addr.parse().unwrap(), Duration::from_secs(1));
    assert!(
        refused.is_err(),
        "a new connection was accepted while draining"
    );
    // The in-flight stream runs to its end.
    let mut rest = String::new();
    busy_r.read_to_string(&mut rest).unwrap();
    assert!(rest.contains("\"finish_reason\":\"length\""), "{rest}");
    assert!(rest.contains("data: [DONE]"), "{rest}");
    let status = wait_exit(&mut s.child, Duration::from_secs(30));
    assert!(status.success(), "exit status {status}");
    log_until(&s, "every request finished");
}

#[test]
fn a_drain_timeout_abandons_what_is_left_and_says_so() {
    let Some(model) = models::smol() else { return };
    let mut s = serve(&model, &["--drain-timeout", "0.5"]);
    let busy = TcpStream::connect(&s.addr).unwrap();
    let body = r#"{"messages":[{"role":"user","content":"Tell a long story."}],"max_tokens":2000,"temperature":0,"stream":true}"#;
    (&busy)
        .write_all(post("/v1/chat/completions", body).as_bytes())
        .unwrap();
    let mut busy_r = BufReader::new(busy);
    let mut line = String::new();
    while !line.starts_with("data: ") {
        line.clear();
        busy_r.read_line(&mut line).unwrap();
    }
    signal(&s.child, libc::SIGINT);
    let status = wait_exit(&mut s.child, Duration::from_secs(20));
    assert!(status.success(), "exit status {status}");
    log_until(&s, "abandoned 1 request");
}

/// A synthetic model large enough that a long reply is still running when a short drain
/// timeout ends (a few ms a token), and the ids of its end-of-generation tokens.
fn slow_model(tag: &str) -> (std::path::PathBuf, Vec<u32>) {
    let d = std::env::temp_dir().join(format!("minfer-serve-signals-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    let p = d.join("slow.gguf");
    let out = Command::new(env!("CARGO_BIN_EXE_minfer"))
        .args(["synth", "--arch", "qwen2", "--layers", "8", "--embd", "512"])
        .args([
            "--heads",
            "8",
            "--kv-heads",
            "4",
            "--ffn",
            "2048",
            "--type",
            "q8_0",
        ])
        .args(["--ctx", "4096", "-o"])
        .arg(&p)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let m = minfer_gguf::GgufModel::open(&p).unwrap();
    let id = |k: &str| match m.metadata().get(k) {
        Some(minfer_gguf::Value::U32(v)) => *v,
        other => panic!("{k}: {other:?}"),
    };
    let eog = vec![
        id("tokenizer.ggml.eos_token_id"),
        id("tokenizer.ggml.bos_token_id"),
    ];
    (p, eog)
}

/// A long chat request that never ends by itself (its end tokens banned).
fn long_request(eog: &[u32], stream: bool) -> String {
    let bias: Vec<String> = eog.iter().map(|t| format!("\"{t}\":-100")).collect();
    let body = format!(
        r#"{{"messages":[{{"role":"user","content":"Tell a long story."}}],"max_tokens":1500,"temperature":0,"stream":{stream},"logit_bias":{{{}}}}}"#,
        bias.join(",")
    );
    post("/v1/chat/completions", &body)
}

/// Issue 30, defect 3: when the drain timeout runs out, every request left ends properly:
/// a running stream with a final chunk (finish_reason) and `[DONE]`, a running
/// non-streamed request with its partial completion, a queued one with a 503 JSON.
#[test]
fn requests_left_at_the_drain_timeout_end_properly() {
    let (model, eog) = slow_model("timeout");
    let mut s = serve(&model, &["--drain-timeout", "0.5", "--parallel", "2"]);
    let stream = TcpStream::connect(&s.addr).unwrap();
    (&stream)
        .write_all(long_request(&eog, true).as_bytes())
        .unwrap();
    let mut stream_r = BufReader::new(stream);
    let mut line = String::new();
    while !line.starts_with("data: ") {
        line.clear();
        stream_r.read_line(&mut line).unwrap();
    }
    let running = TcpStream::connect(&s.addr).unwrap();
    (&running)
        .write_all(long_request(&eog, false).as_bytes())
        .unwrap();
    let queued = TcpStream::connect(&s.addr).unwrap();
    (&queued)
        .write_all(long_request(&eog, false).as_bytes())
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    signal(&s.child, libc::SIGTERM);
    let mut rest = String::new();
    stream_r.read_to_string(&mut rest).unwrap();
    assert!(
        rest.contains("\"finish_reason\":\"length\""),
        "{}",
        &rest[rest.len().saturating_sub(800)..]
    );
    assert!(
        rest.contains("data: [DONE]"),
        "{}",
        &rest[rest.len().saturating_sub(800)..]
    );
    // Which of the two was admitted first is the handlers' race: one runs, one waits.
    let mut replies: Vec<(u16, serde_json::Value)> = [running, queued]
        .into_iter()
        .map(|c| {
            let (code, body) = read_response(&mut BufReader::new(c));
            (code, serde_json::from_str(&body).unwrap())
        })
        .collect();
    replies.sort_by_key(|r| r.0);
    let (code, v) = &replies[0];
    assert_eq!(*code, 200, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
    assert!(v["choices"][0]["message"]["content"].is_string(), "{v}");
    let (code, v) = &replies[1];
    assert_eq!(*code, 503, "{v}");
    assert_eq!(v["error"]["code"], "shutdown", "{v}");
    let status = wait_exit(&mut s.child, Duration::from_secs(20));
    assert!(status.success(), "exit status {status}");
    log_until(&s, "abandoned 3 requests");
}

/// Issue 30, defect 3: a second SIGTERM ends the drain at once (llama-server's habit),
/// the stream still ending with `[DONE]`.
#[test]
fn a_second_signal_quits_at_once() {
    let (model, eog) = slow_model("second");
    let mut s = serve(&model, &["--drain-timeout", "600"]);
    let stream = TcpStream::connect(&s.addr).unwrap();
    (&stream)
        .write_all(long_request(&eog, true).as_bytes())
        .unwrap();
    let mut stream_r = BufReader::new(stream);
    let mut line = String::new();
    while !line.starts_with("data: ") {
        line.clear();
        stream_r.read_line(&mut line).unwrap();
    }
    signal(&s.child, libc::SIGTERM);
    log_until(&s, "shutting down: 1 request in flight");
    let t0 = Instant::now();
    signal(&s.child, libc::SIGTERM);
    let status = wait_exit(&mut s.child, Duration::from_secs(10));
    assert!(status.success(), "exit status {status}");
    assert!(t0.elapsed() < Duration::from_secs(8));
    let mut rest = String::new();
    stream_r.read_to_string(&mut rest).unwrap();
    assert!(
        rest.contains("data: [DONE]"),
        "{}",
        &rest[rest.len().saturating_sub(800)..]
    );
    log_until(&s, "at a second signal");
}
