"""Self-test of scripts/loadtest.py: a fake chat server on loopback answers each prompt (a
scenario name) with a correct or a deliberately broken stream, the driver runs each prompt
once, and every request must be classified as expected (ok, protocol, mismatch, divergence,
http, timeout, connection). Standard library only; takes a few seconds.

  python3 scripts/loadtest_selftest.py
"""

import contextlib
import http.server
import io
import json
import os
import socketserver
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loadtest as lt  # noqa: E402
import loadtest_soak as soak  # noqa: E402

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

# Hanging up on purpose (loadtest_soak.py): "dropped:HOW" is a request the client hung up on
# as planned, its text so far a prefix of the reference; a wrong prefix is a mismatch.
SCENARIOS_DISCONNECT = {
    "good": "dropped:deltas",
    "good ": "dropped:deltas",
    "wrong_first_delta": "mismatch",      # the text read before hanging up is wrong
    "http_500": "http",                   # a refusal stays an error
}
SCENARIOS_CANCEL = {f"good{' ' * i}": "dropped:*" for i in range(8)}  # both kinds expected

# /metrics of the fake server: minfer's gauges once idle, clean or with a leaked sequence.
CLEAN_METRICS = """# TYPE minfer_requests_running gauge
minfer_requests_running 0
minfer_requests_queued 0
minfer_engine_sequences 4
minfer_prefix_cache_entries 3
minfer_kv_cells_used 120
minfer_kv_cells_shared 0
minfer_kv_cells_free 904
minfer_requests_finished_total{reason="stop"} 9
"""
LEAKY_METRICS = CLEAN_METRICS.replace("minfer_engine_sequences 4", "minfer_engine_sequences 5")
METRICS_TEXT = [CLEAN_METRICS]

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
    elif scenario == "wrong_first_delta":
        pieces[0] = "Help"
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
        if self.path == "/metrics":
            body = METRICS_TEXT[0].encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif self.path == "/v1/models":
            self.send_json({"object": "list", "data": [{"id": "fake", "object": "model"}]})
        else:
            self.send_json({"status": "ok"})

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        scenario = req["messages"][0]["content"].strip()
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
            if scenario == "good_paced":  # long enough for the RSS sampler to sample
                time.sleep(0.02)
        if terminate:
            self.wfile.write(b"0\r\n\r\n")
        else:
            self.close_connection = True


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass  # the client hanging up on a broken stream is part of the test


def run_pass(port, scenarios, extra, want_rc=None):
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
        got = {True: "ok", None: f"dropped:{rec.get('dropped')}"}.get(rec["ok"]) or rec["kind"]
        want = scenarios[name]
        good = got == want or (want == "dropped:*" and got.startswith("dropped:"))
        mark = "ok  " if good else "FAIL"
        failures += not good
        print(f"{mark} {name:24} expected {want:11} got {got:11} {rec.get('detail', '')[:90]}")
    if len(doc["records"]) != len(names):
        print(f"FAIL: {len(doc['records'])} requests, expected {len(names)}")
        failures += 1
    if want_rc is None:
        want_rc = 1 if any(v not in ("ok",) and not v.startswith("dropped")
                           for v in scenarios.values()) else 0
    if rc != want_rc:
        print(f"FAIL: exit status {rc}, expected {want_rc}")
        failures += 1
    return failures, doc


def expect(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    return 0 if cond else 1


def soak_units():
    """The soak's arithmetic on made-up inputs."""
    print("-- soak units")
    f = 0
    line = [(t, 1000 + 2 * t) for t in range(0, 300, 5)]  # 2 KiB/s = 120 KiB/min
    f += expect(abs(soak.slope_per_min(line) - 120) < 1e-6, "slope of a line is its slope")
    flat = [(t, 5000 + (50 if i % 2 else -50)) for i, t in enumerate(range(0, 600, 5))]
    f += expect(abs(soak.slope_per_min(flat)) < 1, "slope of a flat noisy series is ~0")
    f += expect(soak.slope_per_min(line[:2]) is None, "no slope from 2 samples")
    r = soak.rss_report([(0, 100), (30, 900)] + [(60 + 5 * i, 1000) for i in range(20)], 60)
    f += expect(r["samples_after_warmup"] == 20 and r["slope_kib_per_min"] == 0
                and r["at_warmup_kib"] == 1000, "warm-up samples are left out of the slope")
    # A GPU server's RSS: rising while new batch shapes are captured, then flat. The whole
    # window's slope fails the bound, the second half's passes (--rss-window second-half);
    # control: a series still rising in its second half fails both.
    ok_run = {"errors": 0, "ok": 5, "errors_by_kind": {}}
    settle = soak.rss_report([(t, 1000 + 40 * min(t, 300)) for t in range(60, 660, 5)], 60)
    rising = soak.rss_report([(t, 1000 + 40 * t) for t in range(60, 660, 5)], 60)
    f += expect(not soak.verdict(ok_run, settle, None, [], 512)[0]
                and soak.verdict(ok_run, settle, None, [], 512, "second-half")[0],
                "a cache that settles passes over the second half only")
    f += expect(not soak.verdict(ok_run, rising, None, [], 512, "second-half")[0],
                "control: RSS still rising in the second half fails")
    recs = [{"ok": True, "end_s": 10, "ttft_s": 0.1, "total_s": 1.1, "completion_tokens": 11},
            {"ok": True, "end_s": 50, "ttft_s": 0.3, "total_s": 2.3, "completion_tokens": 11},
            {"ok": None, "end_s": 70}, {"ok": False, "end_s": 130, "kind": "http"}]
    rows = soak.per_minute(recs, lt.percentile)
    f += expect([(x["minute"], x["ok"], x["dropped"], x["errors"]) for x in rows]
                == [(0, 2, 0, 0), (1, 0, 1, 0), (2, 0, 0, 1)], "per-minute rows by end")
    f += expect(abs(rows[0]["ttft_p50_ms"] - 200) < 1e-9 and abs(rows[0]["tpot_p50_ms"] - 150)
                < 1e-9 and rows[1]["ttft_p50_ms"] is None, "per-minute percentiles")
    clean = {k: 0.0 for k in soak.METRICS}
    clean.update(minfer_engine_sequences=4, minfer_prefix_cache_entries=3,
                 minfer_kv_cells_used=100)
    f += expect(soak.metrics_problems(clean) == [], "clean idle counts pass")
    for change, what in (({"minfer_engine_sequences": 5}, "a leaked sequence"),
                         ({"minfer_requests_running": 1}, "a request still running"),
                         ({"minfer_requests_queued": 2}, "a request still queued"),
                         ({"minfer_prefix_cache_entries": 0, "minfer_engine_sequences": 1},
                          "cells in use without a cached prefix")):
        f += expect(soak.metrics_problems({**clean, **change}) != [], f"{what} is reported")
    f += expect(soak.metrics_problems({"minfer_requests_running": 0}) != [],
                "missing gauges are reported")
    samples = soak.RssSampler(os.getpid(), 0.02).start()
    time.sleep(0.15)
    got = samples.stop()
    f += expect(len(got) >= 3 and all(v > 0 for _, v in got), f"RSS sampled ({len(got)})")
    f += expect(soak.read_rss_kib(2 ** 22 + 12345) is None, "no RSS of a missing process")
    return f


def soak_passes(port):
    """--soak end to end: a clean run passes; a leaked sequence in /metrics, a steep RSS slope
    and an error each fail the verdict (exit 1)."""
    f = 0
    base = ["--soak", "--rss-pid", str(os.getpid()), "--rss-interval", "0.02", "--warmup", "0",
            "--metrics-wait", "1",
            "--disconnect-rate", "0.3", "--cancel-rate", "0.3"]
    good = {f"good_paced{' ' * i}": "*" for i in range(6)}
    for label, metrics, extra, scen, want in (
            ("clean", CLEAN_METRICS, ["--max-rss-slope", "1e15"], good, True),
            ("leak", LEAKY_METRICS, ["--max-rss-slope", "1e15"], good, False),
            ("rss", CLEAN_METRICS, ["--max-rss-slope=-1e15"], good, False),
            ("error", CLEAN_METRICS, ["--max-rss-slope", "1e15"],
             {**good, "http_500": "http"}, False)):
        METRICS_TEXT[0] = metrics
        scenarios = {k: "dropped:*" if v == "*" else v for k, v in scen.items()}
        with tempfile.TemporaryDirectory() as tmp:
            prompts = os.path.join(tmp, "p.txt")
            with open(prompts, "w") as fp:
                fp.write("\n".join(scenarios) + "\n")
            out = os.path.join(tmp, "r.json")
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                rc = lt.main(["--url", f"http://127.0.0.1:{port}", "--clients", "2",
                              "--max-requests", str(len(scenarios)), "--prompts", prompts,
                              "--timeout", "5", "--json", out] + base + extra)
            with open(out) as fp:
                doc = json.load(fp)
        text = buf.getvalue()
        verdict = [x for x in text.splitlines() if x.startswith("soak verdict: ")]
        f += expect(doc["passed"] is want and rc == (0 if want else 1) and len(verdict) == 1
                    and verdict[0].startswith("soak verdict: PASS" if want else
                                              "soak verdict: FAIL")
                    and "per minute" in text and "RSS: " in text,
                    f"soak {label}: {verdict[0] if verdict else 'no verdict line'} (rc {rc})")
    METRICS_TEXT[0] = CLEAN_METRICS
    return f


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
    failures = run_pass(port, SCENARIOS, [])[0]
    failures += run_pass(port, SCENARIOS_COMMENTS, ["--allow-sse-comments"])[0]
    failures += run_pass(port, SCENARIOS_DISCONNECT, ["--disconnect-rate", "1"])[0]
    n, doc = run_pass(port, SCENARIOS_CANCEL, ["--cancel-rate", "1"])
    kinds = sorted(doc["dropped"])
    if kinds != ["head", "send"]:
        print(f"FAIL: cancellations of kinds {kinds}, expected both head and send")
        n += 1
    failures += n
    failures += soak_units()
    failures += soak_passes(port)
    srv.shutdown()
    print("loadtest self-test: " + ("PASS" if not failures else f"{failures} FAILED"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
