"""Load-test driver for an OpenAI-compatible chat server (`minfer serve`, llama.cpp's
`llama-server`): N concurrent clients send streaming chat completions for a bounded time,
every reply is checked against the server's own non-streamed reply, and latency and throughput
are reported. A benchmark, not a test.

  scripts/loadtest [--url http://127.0.0.1:8080] [--clients 8] [--duration 30]
                   [--max-requests N] [--prompts FILE] [--max-tokens 64] [--timeout 300]
                   [--json OUT]
  scripts/loadtest --peer [--model GGUF] ...            start llama-server, test it, stop it
  scripts/loadtest --minfer target/release/minfer ...   the same with `minfer serve`

Loopback only: a URL whose host does not resolve to loopback addresses only is refused.

Soak (issue 34; scripts/soak runs it with its defaults): --soak adds latency percentiles per
minute, the server's RSS and its slope, the idle counts in /metrics and a verdict line;
--cancel-rate and --disconnect-rate make clients hang up on purpose (loadtest_soak.py).
Hung-up requests are neither ok nor errors, but the text read before the hang-up must be a
prefix of the reference.

Phases:
  1. reference: for each distinct prompt the timed phase will use, one non-streamed chat
     completion, one at a time (greedy: temperature 0, fixed seed, fixed max_tokens).
  2. timed: each client loops, taking the next prompt round-robin from one shared counter (so
     concurrent clients share prompts and the chat template's prefix), sending a streaming
     request with stream_options.include_usage, until --duration seconds have passed since
     the start or --max-requests requests were started; requests in flight then finish, each
     under a hard --timeout. Every streamed reply's text must equal its prompt's reference
     text exactly (and its usage and finish_reason must agree), or it counts as a mismatch:
     lost or duplicated tokens.

The SSE stream is parsed strictly: each event is exactly one `data: ` line followed by one
blank line (LF or CRLF line ends); chunks are JSON `chat.completion.chunk` objects with one
id, one choice (index 0) until finish_reason is set, then exactly one usage chunk with no
choices, then `data: [DONE]`, then the end of the body. Anything else (comments, other
fields, a missing usage chunk, a truncated chunked body) is a protocol error.

Error kinds: http (non-200 status), protocol, mismatch, timeout, connection (refused, reset).
Measured per request: time to first token (TTFT: from before the connect to the first chunk
with non-empty delta content), total time, completion tokens (usage), content deltas.
Reported: p50/p90/p99 TTFT, p50 time per output token ((total - TTFT) / (tokens - 1)),
aggregate completion tokens/s (completion tokens of ok requests / wall time of the timed
phase, drain included) and ok requests/s. Exit status 1 when any error occurred.

Standard library only (runs on the system python3). On a shared machine run it under `nice`.
"""

import argparse
import datetime
import ipaddress
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

import loadtest_soak as soak

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DEFAULT_PROMPTS = os.path.join(HERE, "loadtest-prompts.txt")
DEFAULT_MODEL = os.path.join(
    os.environ.get("MINFER_MODELS", os.path.expanduser("~/.cache/minfer/models")),
    "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
SEED = 42
MAX_LINE = 1 << 20  # longest SSE line accepted (bytes)
ERROR_KINDS = ("http", "protocol", "mismatch", "divergence", "timeout", "connection")
FINISH_REASONS = ("stop", "length")


def log(msg):
    print(f"loadtest: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Targets


class Target:
    """A loopback host and port."""

    def __init__(self, host, port):
        self.host, self.port = host, port

    def url(self):
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


def loopback_target(url):
    u = urllib.parse.urlsplit(url)
    if u.scheme != "http":
        raise SystemExit(f"loadtest: only http:// URLs are supported, not {url!r}")
    if u.path not in ("", "/") or u.query or u.fragment:
        raise SystemExit(f"loadtest: give the server's root URL (no path), not {url!r}")
    host = u.hostname
    if not host:
        raise SystemExit(f"loadtest: no host in {url!r}")
    port = u.port or 80
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as e:
        raise SystemExit(f"loadtest: cannot resolve {host!r}: {e}")
    addrs = {info[4][0].split("%")[0] for info in infos}
    if not addrs or not all(ipaddress.ip_address(a).is_loopback for a in addrs):
        raise SystemExit(f"loadtest: refusing {host!r}: it resolves to {sorted(addrs)}, "
                         "not only to loopback addresses (this tool loads local servers only)")
    return Target(host, port)


# ---------------------------------------------------------------------------------------------
# One request


class RequestError(Exception):
    def __init__(self, kind, detail, status=None):
        super().__init__(detail)
        self.kind, self.detail, self.status = kind, detail, status


def protocol(detail):
    return RequestError("protocol", detail)


def classify(exc, what):
    """The RequestError for an exception raised while talking to the server."""
    if isinstance(exc, RequestError):
        return exc
    if isinstance(exc, socket.timeout):
        return RequestError("timeout", f"{what}: timed out")
    if isinstance(exc, OSError):
        return RequestError("connection", f"{what}: {type(exc).__name__}: {exc}")
    return protocol(f"{what}: unexpected {type(exc).__name__}: {exc}")


class Exchange:
    """One HTTP/1.1 request on its own connection, spoken by hand over a socket so that the
    response framing (status line, headers, chunked encoding) is checked strictly, under one
    deadline (monotonic seconds) for the whole exchange."""

    MAX_HEAD = 64 << 10

    def __init__(self, target, deadline):
        self.target, self.deadline = target, deadline
        self.sock = None
        self.buf = bytearray()
        self.status = self.reason = None
        self.headers = {}
        self.body = None  # iterator over the body's bytes, framing removed
        self.pending = bytearray()  # body bytes read but not yet returned by readline

    def left(self):
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise RequestError("timeout", "request timed out")
        return left

    def fill(self):
        """Reads more bytes into buf; False at the end of the stream."""
        self.sock.settimeout(self.left())
        try:
            data = self.sock.recv(65536)
        except Exception as e:
            raise classify(e, "read")
        if not data:
            return False
        self.buf += data
        return True

    def crlf_line(self, what, limit):
        while True:
            i = self.buf.find(b"\n")
            if i >= 0:
                line = bytes(self.buf[:i + 1])
                del self.buf[:i + 1]
                if not line.endswith(b"\r\n"):
                    raise protocol(f"{what} line not ended by CRLF: {line[:80]!r}")
                return line[:-2]
            if len(self.buf) > limit:
                raise protocol(f"{what} line longer than {limit} bytes")
            if not self.fill():
                raise protocol(f"connection closed inside the {what}")

    def send(self, method, path, body=None, accept="*/*"):
        self.send_only(method, path, body, accept)
        return self.read_head()

    def send_only(self, method, path, body=None, accept="*/*"):
        """Connects and sends the request, reading nothing."""
        try:
            self.sock = socket.create_connection((self.target.host, self.target.port),
                                                 timeout=self.left())
        except Exception as e:
            raise classify(e, "connect")
        host = f"[{self.target.host}]" if ":" in self.target.host else self.target.host
        head = [f"{method} {path} HTTP/1.1", f"Host: {host}:{self.target.port}",
                f"Accept: {accept}", "User-Agent: minfer-loadtest"]
        if body is not None:
            head += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
        data = ("\r\n".join(head) + "\r\n\r\n").encode() + (body or b"")
        try:
            self.sock.settimeout(self.left())
            self.sock.sendall(data)
        except Exception as e:
            raise classify(e, "send")

    def read_head(self):
        # The status line: a server that closes the connection without one did not answer.
        while b"\n" not in self.buf:
            if len(self.buf) > self.MAX_HEAD:
                raise protocol("status line too long")
            if not self.fill():
                raise RequestError("connection", "closed without a response")
        status = self.crlf_line("status", self.MAX_HEAD)
        parts = status.split(b" ", 2)
        if len(parts) < 2 or parts[0] not in (b"HTTP/1.1", b"HTTP/1.0") or \
                not parts[1].isdigit() or len(parts[1]) != 3:
            raise protocol(f"bad status line {status[:80]!r}")
        self.status = int(parts[1])
        self.reason = parts[2].decode("latin-1") if len(parts) > 2 else ""
        while True:
            line = self.crlf_line("response head", self.MAX_HEAD)
            if not line:
                break
            name, sep, value = line.partition(b":")
            if not sep or not name or name != name.strip():
                raise protocol(f"bad header line {line[:80]!r}")
            key = name.decode("latin-1").lower()
            value = value.strip().decode("latin-1")
            self.headers[key] = self.headers[key] + ", " + value if key in self.headers \
                else value
        te = self.headers.get("transfer-encoding", "").lower()
        if te and te != "chunked":
            raise protocol(f"unsupported Transfer-Encoding {te!r}")
        if te == "chunked":
            if "content-length" in self.headers:
                raise protocol("both Transfer-Encoding and Content-Length")
            self.body = self.chunked()
        elif "content-length" in self.headers:
            v = self.headers["content-length"]
            if not v.isdigit():
                raise protocol(f"bad Content-Length {v!r}")
            self.body = self.sized(int(v))
        else:
            self.body = self.until_close()
        return self

    def chunked(self):
        while True:
            line = self.crlf_line("chunk size", 4096)
            size_text = line.split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise protocol(f"bad chunk size line {line[:80]!r}")
            if size_text.startswith((b"-", b"+", b"0x", b"0X")):
                raise protocol(f"bad chunk size line {line[:80]!r}")
            if size == 0:
                while self.crlf_line("chunked trailer", self.MAX_HEAD):
                    pass
                if self.buf:
                    raise protocol(f"bytes after the end of the chunked body: "
                                   f"{bytes(self.buf[:80])!r}")
                return
            while len(self.buf) < size + 2:
                if not self.fill():
                    raise protocol("connection closed inside a chunk (truncated body)")
            if self.buf[size:size + 2] != b"\r\n":
                raise protocol("chunk data not followed by CRLF")
            piece = bytes(self.buf[:size])
            del self.buf[:size + 2]
            yield piece

    def sized(self, n):
        while n > 0:
            if not self.buf and not self.fill():
                raise protocol(f"connection closed {n} bytes before the Content-Length")
            piece = bytes(self.buf[:n])
            del self.buf[:len(piece)]
            n -= len(piece)
            yield piece

    def until_close(self):
        while True:
            if self.buf:
                piece = bytes(self.buf)
                self.buf.clear()
                yield piece
            if not self.fill():
                return

    def header(self, name):
        return self.headers.get(name.lower(), "")

    def media_type(self):
        return self.header("Content-Type").split(";")[0].strip().lower()

    def read_all(self, limit=16 << 20):
        out = bytearray(self.pending)
        self.pending.clear()
        for piece in self.body:
            out += piece
            if len(out) > limit:
                raise protocol(f"body longer than {limit} bytes")
        return bytes(out)

    def readline(self):
        """The body's next line, with its LF; a last line without one; b"" at the end."""
        while True:
            i = self.pending.find(b"\n")
            if i >= 0:
                line = bytes(self.pending[:i + 1])
                del self.pending[:i + 1]
                return line
            if len(self.pending) > MAX_LINE:
                raise protocol(f"SSE line longer than {MAX_LINE} bytes")
            piece = next(self.body, None)
            if piece is None:
                line = bytes(self.pending)
                self.pending.clear()
                return line
            self.pending += piece

    def close(self):
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass


def chat_body(model, prompt, max_tokens, stream):
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": SEED,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return json.dumps(body).encode()


def check_status(ex):
    if ex.status != 200:
        try:
            body = ex.read_all(4096)
        except RequestError:
            body = b""
        text = body[:300].decode("utf-8", "replace")
        raise RequestError("http", f"HTTP {ex.status} {ex.reason}: {text}", status=ex.status)


def check_usage(usage, where):
    if not isinstance(usage, dict):
        raise protocol(f"{where}: usage is not an object")
    for key in ("prompt_tokens", "completion_tokens"):
        v = usage.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise protocol(f"{where}: usage.{key} is not a non-negative integer: {v!r}")
    return usage


def fetch_reply(target, model, prompt, max_tokens, timeout):
    """The non-streamed reply: {"text", "completion_tokens", "prompt_tokens", "finish_reason"}."""
    ex = Exchange(target, time.monotonic() + timeout)
    try:
        ex.send("POST", "/v1/chat/completions", chat_body(model, prompt, max_tokens, False),
                accept="application/json")
        check_status(ex)
        if ex.media_type() != "application/json":
            raise protocol(f"non-streamed reply has Content-Type {ex.media_type()!r}")
        raw = ex.read_all()
    finally:
        ex.close()
    try:
        obj = json.loads(raw)
    except ValueError:
        raise protocol("non-streamed reply is not JSON")
    if not isinstance(obj, dict) or obj.get("object") != "chat.completion":
        raise protocol("non-streamed reply is not a chat.completion object")
    choices = obj.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        raise protocol("non-streamed reply does not have exactly one choice")
    msg = choices[0].get("message")
    if not isinstance(msg, dict) or not isinstance(msg.get("content"), str):
        raise protocol("non-streamed reply has no message.content string")
    if msg.get("role") != "assistant":
        raise protocol(f"non-streamed reply has role {msg.get('role')!r}")
    finish = choices[0].get("finish_reason")
    if finish not in FINISH_REASONS:
        raise protocol(f"non-streamed reply has finish_reason {finish!r}")
    usage = check_usage(obj.get("usage"), "non-streamed reply")
    return {"text": msg["content"], "completion_tokens": usage["completion_tokens"],
            "prompt_tokens": usage["prompt_tokens"], "finish_reason": finish}


class ChunkChecker:
    """Validates the sequence of chat.completion.chunk objects of one stream."""

    def __init__(self, max_tokens):
        self.max_tokens = max_tokens
        self.id = None
        self.parts = []
        self.deltas = 0
        self.finish = None
        self.usage = None
        self.chunks = 0

    def chunk(self, raw):
        """Checks one chunk (the bytes after `data: `); returns its delta content ("" if none)."""
        self.chunks += 1
        where = f"chunk {self.chunks}"
        try:
            obj = json.loads(raw)
        except ValueError:
            raise protocol(f"{where} is not JSON: {raw[:120]!r}")
        if not isinstance(obj, dict):
            raise protocol(f"{where} is not a JSON object")
        if obj.get("object") != "chat.completion.chunk":
            raise protocol(f"{where} has object {obj.get('object')!r}, "
                           "not 'chat.completion.chunk'")
        cid = obj.get("id")
        if not isinstance(cid, str) or not cid:
            raise protocol(f"{where} has no id")
        if self.id is None:
            self.id = cid
        elif cid != self.id:
            raise protocol(f"{where} has id {cid!r}, the stream began with {self.id!r}")
        if self.usage is not None:
            raise protocol(f"{where} comes after the usage chunk")
        choices = obj.get("choices")
        if not isinstance(choices, list):
            raise protocol(f"{where} has no choices list")
        usage = obj.get("usage")
        if usage is not None:
            self.usage = check_usage(usage, where)
            if choices:
                raise protocol(f"{where}: the usage chunk has choices")
            if self.finish is None:
                raise protocol(f"{where}: usage chunk before any finish_reason")
            return ""
        if self.finish is not None:
            raise protocol(f"{where}: a choice chunk after finish_reason {self.finish!r}")
        if len(choices) != 1 or not isinstance(choices[0], dict):
            raise protocol(f"{where} has {len(choices)} choices, expected one")
        choice = choices[0]
        if choice.get("index") != 0:
            raise protocol(f"{where} has choice index {choice.get('index')!r}")
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            raise protocol(f"{where} has no delta object")
        role = delta.get("role")
        if role is not None and role != "assistant":
            raise protocol(f"{where} has role {role!r}")
        content = delta.get("content")
        if content is not None and not isinstance(content, str):
            raise protocol(f"{where} has non-string delta.content")
        finish = choice.get("finish_reason")
        if finish is not None:
            if finish not in FINISH_REASONS:
                raise protocol(f"{where} has finish_reason {finish!r}")
            self.finish = finish
        if content:
            self.parts.append(content)
            self.deltas += 1
            return content
        return ""

    def done(self):
        if self.finish is None:
            raise protocol("[DONE] without a finish_reason")
        if self.usage is None:
            raise protocol("[DONE] without a usage chunk (stream_options.include_usage)")
        n = self.usage["completion_tokens"]
        if n > self.max_tokens:
            raise protocol(f"usage.completion_tokens {n} > max_tokens {self.max_tokens}")
        if self.finish == "length" and n != self.max_tokens:
            raise protocol(f"finish_reason 'length' with {n} completion tokens, "
                           f"max_tokens {self.max_tokens}")

    def text(self):
        return "".join(self.parts)


class Dropped(Exception):
    """The client hung up on purpose (a soak's cancellation or disconnect, see
    loadtest_soak.py): how, after how many content deltas, and the text read until then."""

    def __init__(self, how, deltas, text, ttft_s, total_s):
        super().__init__(how)
        self.how, self.deltas, self.text = how, deltas, text
        self.ttft_s, self.total_s = ttft_s, total_s


def stream_reply(target, model, prompt, max_tokens, timeout, allow_comments=False, drop=None):
    """One streaming request. Returns (measurements, reply) or raises RequestError.
    allow_comments: SSE comment lines (`:` keep-alives) between events are skipped, each
    with its blank line, and counted; otherwise they are protocol errors.
    drop: None, or where the client closes its connection on purpose, raising Dropped:
    ("send",) right after sending the request, ("head",) once the response head came (both
    before any token), ("deltas", k) after the k-th content delta (mid-stream)."""
    t0 = time.monotonic()
    ex = Exchange(target, t0 + timeout)
    checker = ChunkChecker(max_tokens)
    ttft = None
    try:
        if drop and drop[0] == "send":
            ex.send_only("POST", "/v1/chat/completions",
                         chat_body(model, prompt, max_tokens, True), accept="text/event-stream")
            raise Dropped("send", 0, "", None, time.monotonic() - t0)
        ex.send("POST", "/v1/chat/completions", chat_body(model, prompt, max_tokens, True),
                accept="text/event-stream")
        check_status(ex)
        if drop and drop[0] == "head":
            raise Dropped("head", 0, "", None, time.monotonic() - t0)
        if ex.media_type() != "text/event-stream":
            raise protocol(f"streamed reply has Content-Type {ex.media_type()!r}")
        data = None  # the data line of the event being read, until its blank line
        done = False
        comment = False  # a comment line was read: a blank line may close it
        comments = 0
        while True:
            line = ex.readline()
            if not line:
                break
            if len(line) > MAX_LINE:
                raise protocol(f"SSE line longer than {MAX_LINE} bytes")
            if not line.endswith(b"\n"):
                raise protocol(f"stream ended inside a line: {line[:80]!r}")
            line = line[:-1]
            if line.endswith(b"\r"):
                line = line[:-1]
            if done:
                raise protocol(f"data after [DONE]: {line[:80]!r}")
            if data is None:
                if allow_comments and line.startswith(b":"):
                    comment = True
                    comments += 1
                    continue
                if allow_comments and comment and not line:
                    comment = False
                    continue
                if not line.startswith(b"data: "):
                    raise protocol(f"expected a `data: ` line, got {line[:80]!r}")
                comment = False
                data = line[6:]
                continue
            if line:
                raise protocol(f"event of more than one line: {line[:80]!r}")
            if data == b"[DONE]":
                checker.done()
                done = True
            elif checker.chunk(data):
                if ttft is None:
                    ttft = time.monotonic() - t0
                if drop and drop[0] == "deltas" and checker.deltas >= drop[1]:
                    raise Dropped("deltas", checker.deltas, checker.text(), ttft,
                                  time.monotonic() - t0)
            data = None
        if data is not None:
            raise protocol("stream ended inside an event (no blank line after the data line)")
        if not done:
            raise protocol("stream ended without `data: [DONE]`")
    finally:
        ex.close()
    total = time.monotonic() - t0
    tokens = checker.usage["completion_tokens"]
    reply = {"text": checker.text(), "completion_tokens": tokens,
             "finish_reason": checker.finish}
    m = {"ttft_s": ttft if ttft is not None else total, "total_s": total,
         "completion_tokens": tokens, "content_deltas": checker.deltas,
         "prompt_tokens": checker.usage["prompt_tokens"], "sse_comments": comments}
    return m, reply


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def one_gap(ref, got, pos):
    """Whether got is ref with one run of characters deleted or inserted at or after pos (what
    a lost or duplicated delta does to a stream of the same generation)."""
    k = len(got) - len(ref)
    if k < 0:
        return got[pos:] == ref[pos - k:]
    if k > 0:
        return got[pos + k:] == ref[pos:]
    return False


def compare_reply(prompt_index, ref, got):
    """None, or (kind, detail) for a streamed reply that differs from the reference reply.

    kind "mismatch" (lost or duplicated tokens): the same text with another usage or
    finish_reason, or the reference text with one run of characters deleted or inserted.
    kind "divergence": the texts fork at some position and never realign, i.e. the greedy
    decode took another token there: a server whose arithmetic depends on the batch (or on the
    cached prefix) does this; a batch-invariant one must not."""
    r, g = ref["text"], got["text"]
    counts = (f"tokens {got['completion_tokens']} streamed, {ref['completion_tokens']} reference;"
              f" finish {got['finish_reason']} / {ref['finish_reason']}")
    pos = first_difference(r, g)
    if pos is None:
        if got["completion_tokens"] != ref["completion_tokens"]:
            return "mismatch", (f"prompt {prompt_index}: same text, but {counts}")
        if got["finish_reason"] != ref["finish_reason"]:
            return "mismatch", (f"prompt {prompt_index}: same text, but {counts}")
        return None
    lo = max(0, pos - 24)
    where = (f"at character {pos} (lengths {len(g)} streamed, {len(r)} reference; {counts}): "
             f"reference {r[lo:pos + 24]!r}, streamed {g[lo:pos + 24]!r}")
    # A reply that stopped by its own choice (finish "stop") at another length than the other
    # forked into, or away from, the end-of-generation token: not a lost or duplicated tail.
    other_end = got["completion_tokens"] != ref["completion_tokens"] and "stop" in (
        got["finish_reason"], ref["finish_reason"])
    if one_gap(r, g, pos) and not other_end:
        return "mismatch", f"prompt {prompt_index}: lost or duplicated text {where}"
    return "divergence", f"prompt {prompt_index}: greedy reply forks {where}"


# ---------------------------------------------------------------------------------------------
# Phases


def load_prompts(path):
    with open(path, encoding="utf-8") as f:
        prompts = [line.strip() for line in f]
    prompts = [p for p in prompts if p and not p.startswith("#")]
    if not prompts:
        raise SystemExit(f"loadtest: no prompts in {path}")
    return prompts


def model_name(target, timeout=30):
    """The id of the server's first model (GET /v1/models), or "default"."""
    ex = Exchange(target, time.monotonic() + timeout)
    try:
        ex.send("GET", "/v1/models", accept="application/json")
        if ex.status == 200:
            data = json.loads(ex.read_all()).get("data")
            if isinstance(data, list) and data and isinstance(data[0].get("id"), str):
                return data[0]["id"]
    except (RequestError, ValueError, AttributeError):
        pass
    finally:
        ex.close()
    return "default"


def prompts_used(prompts, max_requests):
    n = len(prompts) if not max_requests else min(len(prompts), max_requests)
    return list(range(n))


def fetch_references(target, model, prompts, indices, max_tokens, timeout, concurrency=1):
    """{prompt index: reply}, fetched `concurrency` at a time (1: each alone, unbatched);
    raises SystemExit when a reference request fails."""
    refs, failures = {}, []
    todo = list(indices)
    lock = threading.Lock()
    t0 = time.monotonic()

    def worker():
        while True:
            with lock:
                if not todo or failures:
                    return
                i = todo.pop(0)
            try:
                reply = fetch_reply(target, model, prompts[i], max_tokens, timeout)
            except Exception as e:
                with lock:
                    failures.append((i, classify(e, "reference")))
                return
            with lock:
                refs[i] = reply

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(max(1, concurrency))]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():
            t.join(0.5)
    if failures:
        i, e = failures[0]
        raise SystemExit(f"loadtest: reference reply for prompt {i} failed ({e.kind}): "
                         f"{e.detail}")
    log(f"reference: {len(refs)} non-streamed replies in {time.monotonic() - t0:.1f} s"
        + (f" ({concurrency} at a time)" if concurrency > 1 else ""))
    return refs


class TimedRun:
    def __init__(self, target, model, prompts, refs, a, clients, allow_divergence):
        self.target, self.model, self.prompts, self.refs = target, model, prompts, refs
        self.max_tokens, self.timeout, self.max_requests = a.max_tokens, a.timeout, a.max_requests
        self.duration, self.clients = a.duration, clients
        self.allow_divergence = allow_divergence
        self.allow_comments = a.allow_sse_comments
        # Which requests hang up on purpose (loadtest_soak.DropPlan); None: none does.
        self.drops = getattr(a, "drop_plan", None)
        self.lock = threading.Lock()
        self.started = 0
        self.records = []
        self.stop = threading.Event()
        self.t0 = self.t_end = None

    def claim(self):
        with self.lock:
            if self.stop.is_set() or time.monotonic() >= self.t_end:
                return None
            if self.max_requests and self.started >= self.max_requests:
                return None
            self.started += 1
            return self.started - 1

    def client(self, cid):
        while True:
            seq = self.claim()
            if seq is None:
                return
            k = seq % len(self.prompts)
            rec = {"client": cid, "seq": seq, "prompt": k,
                   "start_s": time.monotonic() - self.t0}
            drop = self.drops.pick(seq, self.refs[k]) if self.drops else None
            try:
                try:
                    m, reply = stream_reply(self.target, self.model, self.prompts[k],
                                            self.max_tokens, self.timeout, self.allow_comments,
                                            drop)
                except Dropped as d:
                    self.dropped(rec, k, d)
                    continue
                rec.update(m)
                bad = compare_reply(k, self.refs[k], reply)
                if bad and (bad[0] != "divergence" or not self.allow_divergence):
                    raise RequestError(*bad)
                rec["ok"] = True
                if bad:
                    rec["divergence"] = bad[1]
            except Exception as e:  # every failure is a counted error, never a dead client
                err = classify(e, "client")
                rec.update(ok=False, kind=err.kind, detail=err.detail)
                if err.status is not None:
                    rec["status"] = err.status
            rec["end_s"] = time.monotonic() - self.t0
            with self.lock:
                self.records.append(rec)

    def dropped(self, rec, k, d):
        """Records a request the client hung up on; the text it read must be a prefix of the
        reference (a lost or duplicated token before the hang-up is a mismatch)."""
        ref = self.refs[k]["text"]
        rec.update(ok=None, dropped=d.how, content_deltas=d.deltas, total_s=d.total_s)
        if d.ttft_s is not None:
            rec["ttft_s"] = d.ttft_s
        if not ref.startswith(d.text):
            pos = first_difference(ref, d.text)
            lo = max(0, pos - 24)
            detail = (f"prompt {k}: the text read before hanging up ({len(d.text)} characters, "
                      f"{d.deltas} deltas) is not a prefix of the reference at character {pos}: "
                      f"reference {ref[lo:pos + 24]!r}, streamed {d.text[lo:pos + 24]!r}")
            if self.allow_divergence:
                rec["divergence"] = detail
            else:
                rec.update(ok=False, kind="mismatch", detail=detail)
        rec["end_s"] = time.monotonic() - self.t0
        with self.lock:
            self.records.append(rec)

    def run(self):
        self.t0 = time.monotonic()
        self.t_end = self.t0 + self.duration
        threads = [threading.Thread(target=self.client, args=(c,), daemon=True)
                   for c in range(self.clients)]
        for t in threads:
            t.start()
        try:
            for t in threads:
                while t.is_alive():
                    t.join(0.5)
        except BaseException:
            self.stop.set()
            raise
        self.wall = time.monotonic() - self.t0
        return self


def percentile(xs, q):
    if not xs:
        return None
    s = sorted(xs)
    k = (len(s) - 1) * q / 100
    lo = math.floor(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def dist_ms(xs, qs=(50, 90, 99)):
    d = {f"p{q}": (None if not xs else percentile(xs, q) * 1000) for q in qs}
    d["max"] = max(xs) * 1000 if xs else None
    return d


def summarize(run):
    recs = sorted(run.records, key=lambda r: r["seq"])
    ok = [r for r in recs if r["ok"] is True]
    bad = [r for r in recs if r["ok"] is False]
    dropped = {}  # hung up on purpose (ok None), by where
    for r in recs:
        if r["ok"] is None:
            dropped[r["dropped"]] = dropped.get(r["dropped"], 0) + 1
    errors = {k: sum(1 for r in bad if r["kind"] == k) for k in ERROR_KINDS}
    statuses = {}
    for r in bad:
        if "status" in r:
            statuses[str(r["status"])] = statuses.get(str(r["status"]), 0) + 1
    diverged = [r["divergence"] for r in ok if "divergence" in r]
    tokens = sum(r["completion_tokens"] for r in ok)
    deltas = sum(r["content_deltas"] for r in ok)
    tpot = [(r["total_s"] - r["ttft_s"]) / (r["completion_tokens"] - 1)
            for r in ok if r["completion_tokens"] > 1]
    samples = {}
    for r in bad:
        samples.setdefault(r["kind"], [])
        if len(samples[r["kind"]]) < 5:
            samples[r["kind"]].append(r["detail"])
    wall = run.wall if recs else 0.0
    return {
        "clients": run.clients, "duration_s": run.duration, "max_requests": run.max_requests,
        "max_tokens": run.max_tokens, "wall_s": wall,
        "requests": len(recs), "ok": len(ok), "errors": len(bad), "dropped": dropped,
        "allow_divergence": run.allow_divergence, "diverged_ok": len(diverged),
        "allow_sse_comments": run.allow_comments,
        "sse_comments": sum(r.get("sse_comments", 0) for r in ok),
        "divergence_samples": diverged[:5],
        "errors_by_kind": errors, "http_statuses": statuses, "error_samples": samples,
        "ttft_ms": dist_ms([r["ttft_s"] for r in ok]),
        "total_ms": dist_ms([r["total_s"] for r in ok]),
        "tpot_ms": dist_ms(tpot),
        "completion_tokens": tokens, "content_deltas": deltas,
        "tokens_per_s": tokens / wall if wall > 0 else 0.0,
        "requests_per_s": len(ok) / wall if wall > 0 else 0.0,
        "records": recs,
    }


def fmt(x, spec=".1f"):
    return "-" if x is None else format(x, spec)


def print_summary(s, out=sys.stdout):
    w = out.write
    w(f"clients {s['clients']}, duration {s['duration_s']:g} s"
      + (f", max {s['max_requests']} requests" if s["max_requests"] else "")
      + f", max_tokens {s['max_tokens']}: {s['requests']} requests in {s['wall_s']:.1f} s wall\n")
    e = s["errors_by_kind"]
    tolerated = (f" ({s['diverged_ok']} diverged from the reference: tolerated)"
                 if s["allow_divergence"] else "")
    w(f"  ok {s['ok']}{tolerated}, errors {s['errors']} ("
      + ", ".join(f"{k} {e[k]}" for k in ERROR_KINDS) + ")"
      + ("; HTTP statuses " + ", ".join(f"{k}: {v}" for k, v in sorted(s["http_statuses"].items()))
         if s["http_statuses"] else "") + "\n")
    w(f"  {'':22}{'p50':>10}{'p90':>10}{'p99':>10}{'max':>10}\n")
    for key, label in (("ttft_ms", "TTFT ms"), ("total_ms", "request ms"),
                       ("tpot_ms", "per output token ms")):
        d = s[key]
        w(f"  {label:22}" + "".join(f"{fmt(d[q]):>10}" for q in ("p50", "p90", "p99", "max"))
          + "\n")
    w(f"  completion tokens {s['completion_tokens']} (usage), {s['content_deltas']} content "
      f"deltas; {s['tokens_per_s']:.2f} completion tok/s, {s['requests_per_s']:.3f} req/s\n")
    if s["dropped"]:
        d = s["dropped"]
        w(f"  hung up on purpose: {sum(d.values())} (before sending was read: {d.get('send', 0)},"
          f" after the response head: {d.get('head', 0)}, mid-stream: {d.get('deltas', 0)})\n")
    if s["allow_sse_comments"]:
        w(f"  SSE comment lines skipped (--allow-sse-comments): {s['sse_comments']}\n")
    for kind, details in s["error_samples"].items():
        for d in details:
            w(f"  {kind}: {d}\n")
    for d in s["divergence_samples"][:3]:
        w(f"  divergence (tolerated): {d}\n")


# ---------------------------------------------------------------------------------------------
# Servers started by this tool (--peer, --minfer; scripts/loadtest-compare)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def locate_peer():
    """llama-server's path: built once by scripts/peer-build, beside its llama-bench."""
    r = subprocess.run([os.path.join(HERE, "peer-build")], capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(r.stderr)
        raise SystemExit("loadtest: scripts/peer-build failed")
    path = os.path.join(os.path.dirname(r.stdout.strip().splitlines()[-1]), "llama-server")
    if not os.access(path, os.X_OK):
        raise SystemExit(f"loadtest: no llama-server at {path}")
    return path


def minfer_serve_help(binary):
    """`BINARY serve --help`'s text, or None when there is no such subcommand."""
    try:
        r = subprocess.run([binary, "serve", "--help"], capture_output=True, text=True,
                           timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout if r.returncode == 0 else None


def server_argv(side, a, port):
    """The command line of one side ("peer" or "minfer"), or None with the reason skipped."""
    common = ["-m", a.model, "--port", str(port), "--parallel", str(a.parallel),
              "-c", str(a.ctx), "-t", str(a.threads)]
    if side == "peer":
        binary = a.peer_bin or locate_peer()
        # Unified KV (one pool shared by the slots), no web UI; prompt-cache settings default.
        return [binary] + common + ["--host", "127.0.0.1", "--kv-unified", "--no-webui"] \
            + a.peer_arg, None
    binary = a.minfer
    if not binary or not os.access(binary, os.X_OK):
        return None, f"no minfer binary at {binary!r} (build it: cargo build --release)"
    help_text = minfer_serve_help(binary)
    if help_text is None:
        return None, f"`{binary} serve` is not available yet (no serve subcommand)"
    host = ["--host", "127.0.0.1"] if "--host" in help_text else []
    return [binary, "serve"] + common + host + a.minfer_arg, None


class Server:
    def __init__(self, side, argv, port):
        self.side, self.argv, self.port = side, argv, port
        self.proc = None
        fd, self.log_path = tempfile.mkstemp(prefix=f"minfer-loadtest-{side}-", suffix=".log")
        os.close(fd)

    def start(self, startup_timeout):
        log(f"starting {self.side}: {' '.join(self.argv)} (log {self.log_path})")
        with open(self.log_path, "wb") as f:
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=f,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        target = Target("127.0.0.1", self.port)
        t0 = time.monotonic()
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"loadtest: {self.side} exited with {self.proc.returncode} "
                                 f"while starting; its log:\n{self.log_tail()}")
            ex = Exchange(target, time.monotonic() + 5)
            try:
                if ex.send("GET", "/health").status == 200:
                    ex.read_all()
                    break
            except RequestError:
                pass
            finally:
                ex.close()
            if time.monotonic() - t0 > startup_timeout:
                self.stop()
                raise SystemExit(f"loadtest: {self.side} not healthy after "
                                 f"{startup_timeout} s; its log:\n{self.log_tail()}")
            time.sleep(0.25)
        log(f"{self.side} healthy after {time.monotonic() - t0:.1f} s")
        return target

    def log_tail(self, n=20):
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    def stop(self):
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        log(f"stopped {self.side} (exit {self.proc.returncode})")


def add_server_args(ap):
    ap.add_argument("--model", "-m", default=DEFAULT_MODEL, help="GGUF for started servers")
    ap.add_argument("--parallel", type=int, default=8, help="server slots (started servers)")
    ap.add_argument("--ctx", "-c", type=int, default=16384, help="server context (cells)")
    ap.add_argument("--threads", "-t", type=int, default=2, help="server threads")
    ap.add_argument("--peer-bin", help="llama-server binary (default: from scripts/peer-build)")
    ap.add_argument("--peer-arg", action="append", default=[],
                    help="extra llama-server argument (repeatable)")
    ap.add_argument("--minfer-arg", action="append", default=[],
                    help="extra `minfer serve` argument (repeatable)")
    ap.add_argument("--startup-timeout", type=float, default=180)


def add_load_args(ap):
    ap.add_argument("--duration", type=float, default=30, help="seconds (new requests stop)")
    ap.add_argument("--max-requests", type=int, default=0, help="cap on requests (0: none)")
    ap.add_argument("--prompts", default=DEFAULT_PROMPTS, help="one prompt per line")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--timeout", type=float, default=300, help="hard limit per request (s)")
    ap.add_argument("--allow-sse-comments", action="store_true",
                    help="skip SSE comment lines (`:` keep-alives, e.g. axum's after 15 s "
                    "without an event) between events, counted in the report; by default they "
                    "are protocol errors (llama-server and OpenAI send none)")
    ap.add_argument("--ref-concurrency", type=int, default=1,
                    help="reference replies fetched this many at a time (default 1: each "
                    "alone, so the references are unbatched decodes)")


def install_sigterm():
    def on_term(signum, frame):
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, on_term)


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="scripts/loadtest", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="server root URL, loopback only (default "
                    "http://127.0.0.1:8080, or the server --peer/--minfer starts)")
    ap.add_argument("--clients", type=int, default=8)
    add_load_args(ap)
    ap.add_argument("--json", metavar="OUT", help="write the report as JSON here")
    ap.add_argument("--allow-divergence", action=argparse.BooleanOptionalAction, default=None,
                    help="count a greedy reply that forks from the reference (no lost or "
                    "duplicated text, another token chosen somewhere) as ok, reported apart; "
                    "default: on for --peer (llama.cpp's arithmetic depends on the batch), "
                    "off otherwise")
    who = ap.add_mutually_exclusive_group()
    who.add_argument("--peer", action="store_true", help="start llama-server and test it")
    who.add_argument("--minfer", metavar="BIN", help="start `BIN serve` and test it")
    ap.add_argument("--port", type=int, default=0, help="port of a started server (0: free)")
    add_server_args(ap)
    soak.add_soak_args(ap)
    a = ap.parse_args(argv)
    if a.clients < 1 or a.duration <= 0 or a.max_tokens < 1 or a.timeout <= 0:
        ap.error("--clients, --duration, --max-tokens and --timeout must be positive")
    soak.check_soak_args(ap, a)
    a.drop_plan = soak.DropPlan(a.cancel_rate, a.disconnect_rate, a.drop_seed)
    if not a.drop_plan.active():
        a.drop_plan = None
    install_sigterm()
    prompts = load_prompts(a.prompts)
    if a.allow_divergence is None:
        a.allow_divergence = bool(a.peer)
    started = datetime.datetime.now(datetime.timezone.utc)
    server = None
    side = "peer" if a.peer else "minfer" if a.minfer else None
    try:
        if side:
            if a.url:
                ap.error("--url and --peer/--minfer exclude each other")
            port = a.port or free_port()
            argv_, why = server_argv(side, a, port)
            if argv_ is None:
                log(f"{side} side skipped: {why}")
                return 3
            server = Server(side, argv_, port)
            target = server.start(a.startup_timeout)
        else:
            target = loopback_target(a.url or "http://127.0.0.1:8080")
        model = model_name(target)
        log(f"target {target.url()}, model {model!r}, {len(prompts)} prompts")
        refs = fetch_references(target, model, prompts, prompts_used(prompts, a.max_requests),
                                a.max_tokens, a.timeout, a.ref_concurrency)
        log(f"timed phase: {a.clients} clients, {a.duration:g} s")
        pid = a.rss_pid or (server.proc.pid if server else 0)
        probe = lambda: soak.read_counters(target, Exchange)  # noqa: E731
        sampler = (soak.RssSampler(pid, a.rss_interval, probe=probe).start()
                   if a.soak and pid else None)
        s = summarize(TimedRun(target, model, prompts, refs, a, a.clients,
                                a.allow_divergence).run())
        if a.soak:
            soak.finish(s, a, target, Exchange, sampler, percentile)
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    finally:
        if server:
            server.stop()
    print(f"loadtest {target.url()}" + (f" ({side}: {' '.join(server.argv)})" if server else "")
          + f", model {model}, prompts {a.prompts} ({len(prompts)})")
    print_summary(s)
    if a.soak:
        soak.print_soak(s, sys.stdout)
    if a.json:
        doc = {"started": started.isoformat(timespec="seconds"), "url": target.url(),
               "side": side, "server_command": server.argv if server else None,
               "model": model, "prompts_file": a.prompts, "prompts": prompts,
               "seed": SEED, "references": {str(k): v for k, v in refs.items()}, **s}
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
    return 1 if s["errors"] or (a.soak and not s["passed"]) else 0


if __name__ == "__main__":
    sys.exit(main())
