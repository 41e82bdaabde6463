//! `minfer serve` through the real binary on a loopback port: the official `openai` Python
//! package against it (crates/server/tests/openai_client.py), and curl for the exact SSE
//! framing. Each part prints a SKIP line and passes when its model, Python with `openai`,
//! or curl is missing.

use minfer_testkit::models;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a server may take to load and print its address.
const START: Duration = Duration::from_secs(180);
/// How long one client run may take.
const CLIENT: Duration = Duration::from_secs(600);

/// A `minfer serve` child, killed when dropped (also when a test fails).
struct Server {
    child: Child,
    /// `http://ADDR`.
    base: String,
    /// Its stderr so far, for failure messages.
    log: Arc<Mutex<Vec<String>>>,
}

impl Server {
    fn start(model: &Path) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_minfer"))
            .arg("serve")
            .arg("-m")
            .arg(model)
            .args(["--port", "0", "--parallel", "4", "-c", "2048"])
            .args(["--alias", "minfer-test"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start minfer serve");
        let stderr = child.stderr.take().expect("piped stderr");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        let keep = log.clone();
        // Reads stderr to the end (so the pipe never fills), reporting the address once.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(addr) = line.strip_prefix("listening on ") {
                    let _ = tx.send(addr.trim().to_string());
                }
                keep.lock().unwrap().push(line);
            }
        });
        let mut s = Server {
            child,
            base: String::new(),
            log,
        };
        match rx.recv_timeout(START) {
            Ok(base) => {
                assert!(base.starts_with("http://127.0.0.1:"), "{base}");
                s.base = base;
            }
            Err(_) => panic!(
                "minfer serve printed no address within {START:?}; stderr:\n{}",
                s.stderr()
            ),
        }
        s
    }

    fn stderr(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `$MINFER_PYTHON` (scripts/test sets it), else the venv scripts/venv makes; it must
/// import `openai`. None after a SKIP line.
fn python() -> Option<PathBuf> {
    let nonempty = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    let venv = nonempty("MINFER_VENV")
        .map(PathBuf::from)
        .or_else(|| nonempty("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("minfer/venv")))
        .or_else(|| nonempty("HOME").map(|h| PathBuf::from(h).join(".cache/minfer/venv")));
    let p = nonempty("MINFER_PYTHON")
        .map(PathBuf::from)
        .or_else(|| venv.map(|v| v.join("bin/python")))
        .filter(|p| p.exists());
    let Some(p) = p else {
        println!("SKIP: no Python (set MINFER_PYTHON or run scripts/venv)");
        return None;
    };
    let ok = Command::new(&p)
        .args(["-c", "import openai"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        println!(
            "SKIP: {} cannot import openai (run scripts/venv)",
            p.display()
        );
        return None;
    }
    Some(p)
}

fn have_curl() -> bool {
    let ok = Command::new("curl")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        println!("SKIP: no curl");
    }
    ok
}

fn client_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../server/tests/openai_client.py")
}

/// Runs `cmd` to the end within `limit`, returning its status and stdout + stderr.
fn run_bounded(mut cmd: Command, limit: Duration) -> (bool, String) {
    let dir = std::env::temp_dir().join(format!(
        "minfer-serve-openai-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let out_path = dir.join("out.txt");
    let out = std::fs::File::create(&out_path).unwrap();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .expect("start the client");
    let t = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let text = std::fs::read_to_string(&out_path).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    match status {
        Some(s) => (s.success(), text),
        None => (false, format!("{text}\n(killed after {limit:?})")),
    }
}

fn run_client(py: &Path, server: &Server, args: &[&str]) {
    let mut cmd = Command::new(py);
    cmd.arg(client_script()).arg(&server.base).args(args);
    let (ok, out) = run_bounded(cmd, CLIENT);
    println!("{out}");
    assert!(
        ok,
        "openai_client.py {args:?} failed:\n{out}\nserver stderr:\n{}",
        server.stderr()
    );
    assert!(out.contains("all ok"), "{out}");
}

#[test]
fn openai_python_client_against_smollm2() {
    let Some(model) = models::smol() else { return };
    let Some(py) = python() else { return };
    let server = Server::start(&model);
    run_client(&py, &server, &["--model-kind", "smol"]);
}

/// Qwen's template renders tools and has `<tool_call>` syntax: `required` must yield a
/// parsed call with JSON arguments, streamed and not.
#[test]
fn openai_python_client_tools_on_qwen() {
    let Some(model) = models::qwen() else { return };
    let Some(py) = python() else { return };
    let server = Server::start(&model);
    run_client(&py, &server, &["--model-kind", "qwen", "--only", "tools"]);
}

/// A response as curl prints it with `-i`: status line, headers (lower-cased names), body.
struct CurlReply {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl CurlReply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

fn curl_post(server: &Server, path: &str, body: &Value) -> CurlReply {
    let mut cmd = Command::new("curl");
    cmd.args(["-sN", "-i", "--max-time", "300", "-H"])
        .arg("Content-Type: application/json")
        .arg("--data-binary")
        .arg(body.to_string())
        .arg(format!("{}{path}", server.base));
    let (ok, out) = run_bounded(cmd, CLIENT);
    assert!(
        ok,
        "curl failed: {out}\nserver stderr:\n{}",
        server.stderr()
    );
    let (head, body) = out
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no end of headers: {out:?}"));
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("status line {status_line:?}"));
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    CurlReply {
        status,
        headers,
        body: body.to_string(),
    }
}

/// The events of an SSE body framed exactly as OpenAI frames them: each one
/// `data: <payload>\n\n`, with no other lines, the last one `data: [DONE]\n\n`. Returns the
/// JSON payloads before `[DONE]`.
fn strict_sse(body: &str) -> Vec<Value> {
    assert!(body.ends_with("\n\n"), "the body ends an event: {body:?}");
    let blocks: Vec<&str> = body[..body.len() - 2].split("\n\n").collect();
    let (last, events) = blocks.split_last().expect("events");
    assert_eq!(*last, "data: [DONE]", "the last event is [DONE]: {body:?}");
    events
        .iter()
        .map(|b| {
            assert!(!b.contains('\n'), "one line per event: {b:?}");
            let json = b
                .strip_prefix("data: ")
                .unwrap_or_else(|| panic!("an event is `data: …`: {b:?}"));
            let v: Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {json:?}"));
            assert!(v.is_object(), "{v}");
            v
        })
        .collect()
}

#[test]
fn curl_sees_openai_sse_framing() {
    let Some(model) = models::smol() else { return };
    if !have_curl() {
        return;
    }
    let server = Server::start(&model);

    let chat = serde_json::json!({
        "model": "minfer-test",
        "messages": [{"role": "user", "content": "Count to five."}],
        "max_tokens": 12, "temperature": 0, "stream": true,
        "stream_options": {"include_usage": true},
    });
    let r = curl_post(&server, "/v1/chat/completions", &chat);
    assert_eq!(r.status, 200, "{}", r.body);
    let ct = r.header("content-type").unwrap_or("");
    assert!(ct.starts_with("text/event-stream"), "content-type {ct:?}");
    let ev = strict_sse(&r.body);
    assert!(ev.len() >= 3, "{ev:?}");
    let id = ev[0]["id"].as_str().expect("an id").to_string();
    assert!(id.starts_with("chatcmpl-"), "{id}");
    assert_eq!(
        ev[0]["choices"][0]["delta"]["role"], "assistant",
        "{}",
        ev[0]
    );
    let mut text = String::new();
    let mut finishes = Vec::new();
    for (k, e) in ev.iter().enumerate() {
        assert_eq!(e["id"], id.as_str(), "one id for the stream: {e}");
        assert_eq!(e["object"], "chat.completion.chunk", "{e}");
        assert_eq!(e["model"], "minfer-test", "{e}");
        let choices = e["choices"].as_array().expect("choices");
        if k == ev.len() - 1 {
            assert!(choices.is_empty(), "the usage chunk has no choices: {e}");
            let u = &e["usage"];
            let (p, c) = (
                u["prompt_tokens"].as_u64().unwrap(),
                u["completion_tokens"].as_u64().unwrap(),
            );
            assert!(p > 0 && (1..=12).contains(&c), "{u}");
            assert_eq!(u["total_tokens"].as_u64(), Some(p + c), "{u}");
            continue;
        }
        assert_eq!(choices.len(), 1, "{e}");
        assert!(e.get("usage").is_none_or(Value::is_null), "{e}");
        if k > 0 {
            assert!(
                choices[0]["delta"].get("role").is_none(),
                "only the first delta has the role: {e}"
            );
        }
        if let Some(t) = choices[0]["delta"]["content"].as_str() {
            text.push_str(t);
        }
        if !choices[0]["finish_reason"].is_null() {
            finishes.push(choices[0]["finish_reason"].clone());
        }
    }
    assert_eq!(finishes.len(), 1, "one finish: {finishes:?}");
    assert!(!text.is_empty());

    // The same request unstreamed says the same (greedy).
    let mut plain = chat.clone();
    plain["stream"] = Value::Bool(false);
    plain.as_object_mut().unwrap().remove("stream_options");
    let r = curl_post(&server, "/v1/chat/completions", &plain);
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r
        .header("content-type")
        .unwrap_or("")
        .starts_with("application/json"));
    let v: Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], text.as_str(), "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], finishes[0], "{v}");

    // Text completions stream with the same framing.
    let cmpl = serde_json::json!({
        "prompt": "One, two,", "max_tokens": 6, "temperature": 0, "stream": true,
    });
    let r = curl_post(&server, "/v1/completions", &cmpl);
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r
        .header("content-type")
        .unwrap_or("")
        .starts_with("text/event-stream"));
    let ev = strict_sse(&r.body);
    assert!(
        ev.iter().all(|e| e["object"] == "text_completion"),
        "{ev:?}"
    );
    let finishes = ev
        .iter()
        .filter(|e| !e["choices"][0]["finish_reason"].is_null())
        .count();
    assert_eq!(finishes, 1, "{ev:?}");

    // A refused streamed request is a plain JSON error, not a stream.
    let mut bad = chat.clone();
    bad["top_p"] = Value::from(7);
    let r = curl_post(&server, "/v1/chat/completions", &bad);
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r
        .header("content-type")
        .unwrap_or("")
        .starts_with("application/json"));
    let v: Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(v["error"]["param"], "top_p", "{v}");
}
