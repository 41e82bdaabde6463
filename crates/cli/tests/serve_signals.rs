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
