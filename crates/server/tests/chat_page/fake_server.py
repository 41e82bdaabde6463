#!/usr/bin/env python3
"""Stand-in for `minfer serve` while developing the chat page (and the page test's --fake mode).

Serves crates/server/src/page/index.html at `/`, `GET /health`, `GET /v1/models`, and a fake
`POST /v1/chat/completions` that streams OpenAI-style SSE chunks slowly: a role chunk, content
chunks (Markdown with a fenced code block; with max_tokens >= 1000, filler up to max_tokens), a final chunk with
finish_reason, then `data: [DONE]`. One "token" is one chunk, so max_tokens bounds the chunks.

Messages containing these markers trigger the error paths the page must show:
  [[http-error]]    400 with an OpenAI error JSON body
  [[stream-error]]  a few content chunks, then a `data: {"error": {...}}` frame

`GET /fake/stats` reports how many streams ended because the client went away, so a test can
check that the page's Stop really dropped the connection.

With --upstream URL, `/v1/*` is passed through to a real OpenAI-compatible server instead (the
page is still this checkout's), streaming its answer as it comes and dropping the upstream
request when the browser goes away: a way to try the page on a real model before `minfer serve`
serves it. Standard library only.
"""

import argparse
import http.client
import json
import os
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src", "page", "index.html")
MODEL = "fake-model"
LONG = 1000  # max_tokens from which the reply runs on with filler

REPLY = """Here is a **short** answer with *emphasis*, `inline code` and a [link](https://example.com/docs?a=1&b=2).

## Steps

1. Read the input.
2. Sort it:
   - stable
   - in place
3. Print it.

```python
def main():
    xs = sorted(int(x) for x in input().split())
    print(" ".join(map(str, xs)))  # <b>not bold</b>
```

> You wrote: {echo}

That is all."""


def tokens(text):
    """Splits text into small pieces (words with their whitespace), like a tokenizer would."""
    out, cur = [], ""
    for ch in text:
        cur += ch
        if ch in " \n":
            out.append(cur)
            cur = ""
    if cur:
        out.append(cur)
    return out


def filler():
    n = 0
    while True:
        n += 1
        yield from tokens(f"Sentence number {n} of a long reply that goes on until it is stopped. ")


class State:
    lock = threading.Lock()
    disconnects = 0
    completed = 0
    requests = 0


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fake-minfer/0"
    delay = 0.03
    api_key = None
    upstream = None

    def log_message(self, fmt, *args):
        sys.stderr.write("fake_server: " + (fmt % args) + "\n")

    def send_json(self, status, obj):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def error(self, status, message, kind="invalid_request_error"):
        self.send_json(status, {"error": {"message": message, "type": kind, "code": None}})

    def authorized(self):
        if not self.api_key:
            return True
        if self.headers.get("Authorization") == "Bearer " + self.api_key:
            return True
        self.error(401, "invalid or missing API key", "authentication_error")
        return False

    def do_GET(self):
        if self.path == "/":
            with open(PAGE, "rb") as f:
                body = f.read()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()
            self.wfile.write(body)
        elif self.path == "/health":
            self.send_json(200, {"status": "ok"})
        elif self.path == "/fake/stats":
            with State.lock:
                self.send_json(200, {"disconnects": State.disconnects, "completed": State.completed,
                                     "requests": State.requests})
        elif self.path == "/v1/models":
            if self.upstream:
                self.proxy("GET", None)
            elif self.authorized():
                self.send_json(200, {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "minfer"}]})
        else:
            self.error(404, f"no route for GET {self.path}")

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if self.path != "/v1/chat/completions":
            return self.error(404, f"no route for POST {self.path}")
        if self.upstream:
            return self.proxy("POST", raw)
        if not self.authorized():
            return
        try:
            req = json.loads(raw)
            messages = req["messages"]
            assert isinstance(messages, list) and messages
            last = messages[-1]
            assert last["role"] == "user" and isinstance(last["content"], str)
        except Exception as e:  # noqa: BLE001 - any malformed body is a 400
            return self.error(400, f"bad request body: {e!r}")
        with State.lock:
            State.requests += 1
        text = last["content"]
        if "[[http-error]]" in text:
            return self.error(400, "fake error requested by the message")
        max_tokens = int(req.get("max_tokens") or 256)
        pieces = tokens(REPLY.replace("{echo}", " ".join(text.split())))
        finish = "stop"
        if max_tokens < len(pieces):
            pieces, finish = pieces[:max_tokens], "length"
        elif max_tokens >= LONG:
            # A "long" request: filler until max_tokens (a test stops it long before that).
            more = filler()
            pieces += [next(more) for _ in range(min(max_tokens, 100_000) - len(pieces))]
            finish = "length"
        if not req.get("stream"):
            return self.send_json(200, {
                "id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()), "model": MODEL,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(pieces)},
                             "finish_reason": finish}],
                "usage": {"prompt_tokens": 1, "completion_tokens": len(pieces), "total_tokens": len(pieces) + 1},
            })
        self.stream(pieces, finish, stream_error="[[stream-error]]" in text)

    def proxy(self, method, raw):
        u = urllib.parse.urlsplit(self.upstream)
        conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=600)
        headers = {"Content-Type": "application/json"}
        if self.headers.get("Authorization"):
            headers["Authorization"] = self.headers["Authorization"]
        try:
            conn.request(method, self.path, body=raw, headers=headers)
            resp = conn.getresponse()
        except OSError as e:
            conn.close()
            return self.error(502, f"upstream {self.upstream}: {e}", "server_error")
        with State.lock:
            State.requests += 1
        try:
            self.send_response(resp.status)
            self.send_header("Content-Type", resp.getheader("Content-Type", "application/octet-stream"))
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            while True:
                data = resp.read1(65536)
                if not data:
                    break
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
            with State.lock:
                State.completed += 1
        except (BrokenPipeError, ConnectionResetError):
            with State.lock:
                State.disconnects += 1
            self.log_message("client disconnected; dropping the upstream request")
            self.close_connection = True
        finally:
            conn.close()

    def stream(self, pieces, finish, stream_error):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": int(time.time()), "model": MODEL}

        def event(payload):
            data = ("data: " + (payload if isinstance(payload, str) else json.dumps(payload)) + "\n\n").encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        def chunk(delta, reason=None):
            return dict(base, choices=[{"index": 0, "delta": delta, "finish_reason": reason}])

        sent = 0
        try:
            event(chunk({"role": "assistant", "content": ""}))
            for p in pieces:
                time.sleep(self.delay)
                if stream_error and sent == 5:
                    event({"error": {"message": "fake error in the middle of the stream", "type": "server_error"}})
                    break
                event(chunk({"content": p}))
                sent += 1
            else:
                event(chunk({}, finish))
            event("[DONE]")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
            with State.lock:
                State.completed += 1
        except (BrokenPipeError, ConnectionResetError):
            with State.lock:
                State.disconnects += 1
            self.log_message("client disconnected after %d of %d chunks", sent, len(pieces))
            self.close_connection = True


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8089)
    ap.add_argument("--delay", type=float, default=0.03, help="seconds between content chunks")
    ap.add_argument("--api-key", help="require `Authorization: Bearer KEY`")
    ap.add_argument("--upstream", help="pass /v1/* through to this OpenAI-compatible server, e.g. http://127.0.0.1:8080")
    args = ap.parse_args()
    Handler.delay = args.delay
    Handler.api_key = args.api_key
    Handler.upstream = args.upstream
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    print(f"fake_server: serving {os.path.normpath(PAGE)} on http://{args.host}:{args.port}/", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
