"""Self-test of scripts/loadtest.py: a fake chat server on loopback answers each prompt (a
scenario name) with a correct or a deliberately broken stream, the driver runs each prompt
once, and every request must be classified as expected (ok, protocol, mismatch, divergence,
http, timeout, connection). Standard library only; takes a few seconds.

  python3 scripts/loadtest_selftest.py
"""

import http.server
import json
import os
import socketserver
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loadtest as lt  # noqa: E402

PIECES = ["Hello", " world", ",", " this", " is", " fine", "."]
FORK = ["Hello", " world", "!", " All", " good", " here", "."]

# scenario: expected kind ("ok" or an error kind)
SCENARIOS = {
    "good": "ok",
    "good_openai_style": "ok",       # CRLF line ends, "usage": null on every other chunk
    "good_one_delta": "ok",          # the whole text in one delta (usage still 7 tokens)
    "no_done": "protocol",
    "no_usage": "protocol",
    "comment_line": "protocol",      # an SSE comment (a keep-alive): strict mode refuses it
    "two_data_lines": "protocol",
    "bad_json": "protocol",
    "no_blank_line_at_end": "protocol",
    "data_after_done": "protocol",
    "wrong_object": "protocol",
    "id_changes": "protocol",
    "usage_before_finish": "protocol",
    "truncated_chunked": "protocol",
    "chunk_without_crlf": "protocol",
    "extra_blank_line": "protocol",
    "wrong_content_type": "protocol",
    "lost_delta": "mismatch",
    "duplicated_delta": "mismatch",
    "lost_last_delta": "mismatch",
    "usage_off_by_one": "mismatch",
    "fork": "divergence",
    "http_500": "http",
    "slow": "timeout",
    "close_before_response": "connection",
}

# The same server with --allow-sse-comments: keep-alive comments between events are skipped.
SCENARIOS_COMMENTS = {
    "good": "ok",
    "comment_line": "ok",
    "comment_first": "ok",           # a keep-alive before the first event (a queued request)
    "comment_inside_event": "protocol",
    "no_done": "protocol",
}


def chunk(pieces_or_obj, i=0, finish=None, usage=None, cid="chatcmpl-1", openai=False):
    obj = {"id": cid, "object": "chat.completion.chunk", "created": 1, "model": "fake",
           "choices": [{"index": 0, "delta": pieces_or_obj, "finish_reason": finish}]}
    if openai:
        obj["usage"] = None
    return obj


def usage_chunk(n, cid="chatcmpl-1"):
    return {"id": cid, "object": "chat.completion.chunk", "created": 1, "model": "fake",
            "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": n,
                                     "total_tokens": 5 + n}}


def events(scenario):
    """The SSE body (bytes) of a scenario, and whether to end the chunked body properly."""
    nl = "\r\n" if scenario == "good_openai_style" else "\n"
    pieces = list(PIECES)
    n_tokens = len(PIECES)
    if scenario == "fork":
        pieces = FORK
    elif scenario == "lost_delta":
        del pieces[3]
    elif scenario == "duplicated_delta":
        pieces.insert(3, pieces[3])
    elif scenario == "lost_last_delta":
        del pieces[-1]
    elif scenario == "usage_off_by_one":
        n_tokens += 1
    elif scenario == "good_one_delta":
        pieces = ["".join(PIECES)]
    openai = scenario == "good_openai_style"
    objs = [chunk({"role": "assistant", "content": ""}, openai=openai)]
    objs += [chunk({"content": p}, openai=openai) for p in pieces]
    objs.append(chunk({}, finish="stop", openai=openai))
    objs.append(usage_chunk(n_tokens))
    if scenario == "no_usage":
        objs.pop()
    if scenario == "wrong_object":
        objs[2]["object"] = "chat.completion"
    if scenario == "id_changes":
        objs[3]["id"] = "chatcmpl-2"
    if scenario == "usage_before_finish":
        objs[-2], objs[-1] = objs[-1], objs[-2]
    lines = [f"data: {json.dumps(o)}{nl}{nl}" for o in objs]
    if scenario == "bad_json":
        lines[2] = "data: {not json" + nl + nl
    if scenario == "comment_line":
        lines.insert(2, ": keep-alive" + nl + nl)
    if scenario == "comment_first":
        lines.insert(0, ":" + nl + nl)
    if scenario == "comment_inside_event":
        lines[2] = lines[2].replace(nl + nl, nl + ":" + nl + nl)
    if scenario == "two_data_lines":
        lines[2] = lines[2].replace(nl + nl, nl + "data: {}" + nl + nl)
    if scenario != "no_done":
        lines.append(f"data: [DONE]{nl}" + ("" if scenario == "no_blank_line_at_end" else nl))
    if scenario == "extra_blank_line":
        lines.insert(3, nl)
    if scenario == "data_after_done":
        lines.append(lines[1])
    return "".join(lines).encode(), scenario != "truncated_chunked"


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def send_json(self, obj, status=200):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/v1/models":
            self.send_json({"object": "list", "data": [{"id": "fake", "object": "model"}]})
        else:
            self.send_json({"status": "ok"})

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        scenario = req["messages"][0]["content"]
        if not req["stream"]:
            self.send_json({"id": "chatcmpl-0", "object": "chat.completion", "created": 1,
                            "model": "fake", "choices": [{
                                "index": 0, "finish_reason": "stop",
                                "message": {"role": "assistant", "content": "".join(PIECES)}}],
                            "usage": {"prompt_tokens": 5, "completion_tokens": len(PIECES),
                                      "total_tokens": 5 + len(PIECES)}})
            return
        if scenario == "http_500":
            self.send_json({"error": "boom"}, status=500)
            return
        if scenario == "close_before_response":
            self.close_connection = True
            return
        body, terminate = events(scenario)
        self.send_response(200)
        self.send_header("Content-Type", "application/json" if scenario == "wrong_content_type"
                         else "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if scenario == "slow":
            time.sleep(3)
        for i in range(0, len(body), 97):  # chunk boundaries inside lines, on purpose
            part = body[i:i + 97]
            end = b"\n" if scenario == "chunk_without_crlf" else b"\r\n"
            self.wfile.write(f"{len(part):x}\r\n".encode() + part + end)
            self.wfile.flush()
        if terminate:
            self.wfile.write(b"0\r\n\r\n")
        else:
            self.close_connection = True


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass  # the client hanging up on a broken stream is part of the test


def run_pass(port, scenarios, extra):
    """Runs each scenario once through loadtest.main; the number of misclassified ones."""
    names = list(scenarios)
    with tempfile.TemporaryDirectory() as tmp:
        prompts = os.path.join(tmp, "prompts.txt")
        with open(prompts, "w") as f:
            f.write("\n".join(names) + "\n")
        out = os.path.join(tmp, "report.json")
        rc = lt.main(["--url", f"http://127.0.0.1:{port}", "--clients", "3",
                      "--duration", "60", "--max-requests", str(len(names)),
                      "--prompts", prompts, "--timeout", "1.5", "--json", out] + extra)
        with open(out) as f:
            doc = json.load(f)
    failures = 0
    print(f"-- loadtest {' '.join(extra)}")
    for rec in doc["records"]:
        name = names[rec["prompt"]]
        got = "ok" if rec["ok"] else rec["kind"]
        want = scenarios[name]
        mark = "ok  " if got == want else "FAIL"
        failures += got != want
        print(f"{mark} {name:24} expected {want:11} got {got:11} {rec.get('detail', '')[:90]}")
    if len(doc["records"]) != len(names):
        print(f"FAIL: {len(doc['records'])} requests, expected {len(names)}")
        failures += 1
    want_rc = 1 if any(v != "ok" for v in scenarios.values()) else 0
    if rc != want_rc:
        print(f"FAIL: exit status {rc}, expected {want_rc}")
        failures += 1
    return failures


def main():
    try:
        lt.loopback_target("http://192.0.2.1:8080")
        print("FAIL: a non-loopback URL was accepted")
        return 1
    except SystemExit:
        pass
    srv = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    port = srv.server_address[1]
    failures = run_pass(port, SCENARIOS, [])
    failures += run_pass(port, SCENARIOS_COMMENTS, ["--allow-sse-comments"])
    srv.shutdown()
    print("loadtest self-test: " + ("PASS" if not failures else f"{failures} FAILED"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
