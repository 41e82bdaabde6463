//! A `minfer serve` child on a tiny synthetic model and a raw HTTP/1.1 client for it, for
//! the tests that need the real binary's sockets (header timeouts, key files, hostile
//! bytes): `serve_hardening.rs` and `serve_fuzz.rs`.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// A chat template of Qwen's shape, with tools (so `tools` requests render).
const TEMPLATE: &str = "{%- if tools %}{{- '<|im_start|>system\\n' }}{%- for tool in tools %}{{- tool | tojson }}{%- endfor %}{{- '<|im_end|>\\n' }}{%- endif %}{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + (message.content or '') + '<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

/// Writes the tiny model (2 layers, 64 wide; the built-in tokenizer) into `dir`.
pub fn tiny_model(dir: &Path) -> PathBuf {
    use minfer_models::synth::{synthesize, SynthSpec};
    let p = dir.join("tiny.gguf");
    let mut w = synthesize(&SynthSpec::new(
        minfer_models::Arch::Qwen2,
        2,
        64,
        4,
        2,
        128,
    ))
    .unwrap();
    w.set(
        "tokenizer.chat_template",
        minfer_gguf::Value::String(TEMPLATE.into()),
    );
    std::fs::write(&p, w.to_bytes()).unwrap();
    p
}

pub fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("minfer-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A `minfer serve` child, killed when dropped (also when a test fails).
pub struct Server {
    child: Child,
    pub addr: String,
    log: Arc<Mutex<Vec<String>>>,
}

impl Server {
    /// Starts `minfer serve -m model --port 0 ARGS…` with `envs`; waits for its address.
    pub fn start(model: &Path, args: &[&str], envs: &[(&str, &str)]) -> Server {
        let mut c = Command::new(env!("CARGO_BIN_EXE_minfer"));
        c.arg("serve")
            .arg("-m")
            .arg(model)
            .args(["--port", "0", "-t", "1"])
            .args(args)
            .env_remove("MINFER_API_KEY")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in envs {
            c.env(k, v);
        }
        let mut child = c.spawn().expect("start minfer serve");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        let keep = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(a) = line.strip_prefix("listening on http://") {
                    let _ = tx.send(a.trim().to_string());
                }
                keep.lock().unwrap().push(line);
            }
        });
        let mut s = Server {
            child,
            addr: String::new(),
            log,
        };
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(a) => s.addr = a,
            Err(_) => panic!("no address within 60 s; stderr:\n{}", s.stderr()),
        }
        s
    }

    pub fn stderr(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Still running (not crashed).
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub fn connect(&self) -> TcpStream {
        let s = TcpStream::connect(&self.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        s.set_nodelay(true).unwrap();
        s
    }

    /// Sends `raw` on a new connection and reads until the server closes it (or `wait`).
    pub fn raw(&self, raw: &[u8], wait: Duration) -> Vec<u8> {
        let mut s = self.connect();
        s.set_read_timeout(Some(wait)).unwrap();
        // The server may answer (413, 400) and close before the whole body is sent.
        let _ = s.write_all(raw);
        read_all(&mut s, wait)
    }

    /// One request with `Connection: close`; the parsed reply.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Reply {
        let mut req = format!("{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n");
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        if !body.is_empty() || method == "POST" {
            req.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        req.push_str("\r\n");
        let mut bytes = req.into_bytes();
        bytes.extend_from_slice(body);
        let raw = self.raw(&bytes, Duration::from_secs(60));
        Reply::parse(&raw).unwrap_or_else(|| Reply {
            status: 0,
            headers: Vec::new(),
            body: raw,
        })
    }

    pub fn post_json(&self, path: &str, body: &str, headers: &[(&str, &str)]) -> Reply {
        let mut h = vec![("Content-Type", "application/json")];
        h.extend_from_slice(headers);
        self.request("POST", path, &h, body.as_bytes())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Reads until EOF, an error or `wait` passes.
pub fn read_all(s: &mut TcpStream, wait: Duration) -> Vec<u8> {
    let t = Instant::now();
    let mut out = Vec::new();
    let mut buf = [0u8; 16384];
    while t.elapsed() < wait {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    out
}

/// A parsed HTTP/1.1 reply (the body de-chunked when chunked).
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn parse(raw: &[u8]) -> Option<Reply> {
        let end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
        let head = std::str::from_utf8(&raw[..end]).ok()?;
        let mut lines = head.split("\r\n");
        let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        let rest = &raw[end + 4..];
        let chunked = headers
            .iter()
            .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
        let body = if chunked {
            dechunk(rest)
        } else {
            rest.to_vec()
        };
        Some(Reply {
            status,
            headers,
            body,
        })
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Option<serde_json::Value> {
        serde_json::from_slice(&self.body).ok()
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The OpenAI error shape: `{"error": {"message": string, "type": string, …}}`.
    pub fn is_api_error(&self) -> bool {
        self.json()
            .is_some_and(|j| j["error"]["message"].is_string() && j["error"]["type"].is_string())
    }
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(i) = b.windows(2).position(|w| w == b"\r\n") {
        let n = std::str::from_utf8(&b[..i])
            .ok()
            .and_then(|s| usize::from_str_radix(s.split(';').next()?.trim(), 16).ok());
        let Some(n) = n else { break };
        if n == 0 || b.len() < i + 2 + n {
            break;
        }
        out.extend_from_slice(&b[i + 2..i + 2 + n]);
        b = &b[(i + 4 + n).min(b.len())..];
    }
    out
}
