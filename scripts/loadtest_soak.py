"""The soak parts of scripts/loadtest.py (issue 34; docs/RELIABILITY.md, "Soak"): clients that
hang up on purpose, the server's RSS sampled from /proc and its slope, latency percentiles per
minute, the server's own counts read from /metrics once the load is over, and one verdict.

  --soak                    all of the below that apply, and the verdict line (exit 1 on FAIL)
  --cancel-rate P           a request hangs up before its first token with probability P: half
                            right after sending (the server may not have read it yet), half
                            once the response head came (queued or prefilling)
  --disconnect-rate P       a request hangs up mid-stream with probability P, after k content
                            deltas, k uniform in [1, reference tokens - 1]; the text read by
                            then must be a prefix of the reference
  --drop-seed N             the seed of those choices (a run's choices replay with it)
  --rss-pid PID             the process whose RSS is sampled (a server this tool starts: its own)
  --rss-interval S          seconds between samples (5)
  --warmup S                samples before this many seconds are left out of the slope (60)
  --max-rss-slope KIB       the verdict's bound on the slope, KiB per minute (512)
  --rss-window W            which samples that slope is over: after-warmup (every sample past
                            --warmup; the CPU's bar) or second-half (the second half of those:
                            a GPU server captures a CUDA graph for each new batch shape well
                            past 60 s, a bounded cache filling, docs/RELIABILITY.md §6)
  --metrics-wait S          how long the idle counts in /metrics may take to come clean (15)

Standard library only, like loadtest.py.
"""

import random
import threading
import time

# The /metrics gauges read after the load; minfer_engine_sequences counts the engine's
# sequences (running, cached prefixes, its default one).
METRICS = ("minfer_requests_running", "minfer_requests_queued", "minfer_engine_sequences",
           "minfer_prefix_cache_entries", "minfer_kv_cells_used", "minfer_kv_cells_shared",
           "minfer_kv_cells_free")


def add_soak_args(ap):
    ap.add_argument("--soak", action="store_true",
                    help="report per-minute percentiles, the RSS slope and the server's counts "
                    "after the load, and a verdict line (see loadtest_soak.py)")
    ap.add_argument("--cancel-rate", type=float, default=0.0,
                    help="fraction of requests that hang up before their first token")
    ap.add_argument("--disconnect-rate", type=float, default=0.0,
                    help="fraction of requests that hang up mid-stream")
    ap.add_argument("--drop-seed", type=int, default=1)
    ap.add_argument("--rss-pid", type=int, default=0,
                    help="sample this process's RSS (default: the server started here)")
    ap.add_argument("--rss-interval", type=float, default=5.0)
    ap.add_argument("--warmup", type=float, default=60.0,
                    help="seconds left out of the RSS slope and marked in the per-minute table")
    ap.add_argument("--max-rss-slope", type=float, default=512.0,
                    help="the verdict's bound on the RSS slope after warm-up, KiB/min")
    ap.add_argument("--rss-window", choices=("after-warmup", "second-half"),
                    default="after-warmup",
                    help="the samples the verdict's slope is over (see the module's text)")
    ap.add_argument("--metrics-wait", type=float, default=15.0,
                    help="seconds the idle counts in /metrics may take to come clean")


def check_soak_args(ap, a):
    for name in ("cancel_rate", "disconnect_rate"):
        v = getattr(a, name)
        if not 0.0 <= v <= 1.0:
            ap.error(f"--{name.replace('_', '-')} must be within [0, 1], not {v}")
    if a.cancel_rate + a.disconnect_rate > 1.0:
        ap.error("--cancel-rate and --disconnect-rate add up to more than 1")
    if a.rss_interval <= 0 or a.warmup < 0:
        ap.error("--rss-interval must be positive and --warmup not negative")


class DropPlan:
    """Which requests hang up, and where: a function of the request's number and the seed
    only, so that a run's choices do not depend on thread timing."""

    def __init__(self, cancel_rate, disconnect_rate, seed):
        self.cancel, self.disconnect, self.seed = cancel_rate, disconnect_rate, seed

    def pick(self, seq, ref):
        """None (the request runs to its end), ("send",), ("head",) or ("deltas", k)."""
        rng = random.Random(self.seed * 1_000_003 + seq)
        u = rng.random()
        if u < self.cancel:
            return ("send",) if rng.random() < 0.5 else ("head",)
        if u < self.cancel + self.disconnect:
            n = ref["completion_tokens"]
            if n < 2:
                return None  # no middle to hang up in
            return ("deltas", rng.randint(1, n - 1))
        return None

    def active(self):
        return self.cancel > 0 or self.disconnect > 0


def read_rss_kib(pid):
    """VmRSS of a process in KiB, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


# Counters read beside each RSS sample (when the sampler is given a probe): a graph built or a
# CUDA graph captured for a new batch shape costs host memory that stays while its plan is
# cached, so RSS that grows while these grow is the caches filling, not a leak.
COUNTERS = ("minfer_graph_builds_total", "minfer_cuda_graph_captures_total")


class RssSampler:
    """Samples a process's RSS every `interval` seconds on its own thread:
    [(seconds since start, KiB)]; with a `probe` (a callable giving {counter: value}), the
    COUNTERS at each sample too: [(seconds, {counter: value})]."""

    def __init__(self, pid, interval, t0=None, probe=None):
        self.pid, self.interval = pid, interval
        self.t0 = t0 if t0 is not None else time.monotonic()
        self.probe = probe
        self.counts = []
        self.samples = []
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def start(self):
        self.thread.start()
        return self

    def loop(self):
        while True:
            kib = read_rss_kib(self.pid)
            if kib is None:
                return
            self.samples.append((time.monotonic() - self.t0, kib))
            if self.probe is not None:
                c = self.probe()
                if c is not None:
                    self.counts.append((time.monotonic() - self.t0, c))
            if self.stop_event.wait(self.interval):
                return

    def stop(self):
        self.stop_event.set()
        self.thread.join(5)
        kib = read_rss_kib(self.pid)  # one at the very end, after the drain
        if kib is not None:
            self.samples.append((time.monotonic() - self.t0, kib))
        return self.samples


def slope_per_min(samples):
    """Least-squares slope of [(seconds, KiB)] in KiB per minute; None under 3 samples."""
    if len(samples) < 3:
        return None
    n = len(samples)
    mx = sum(t for t, _ in samples) / n
    my = sum(v for _, v in samples) / n
    sxx = sum((t - mx) ** 2 for t, _ in samples)
    if sxx == 0:
        return None
    sxy = sum((t - mx) * (v - my) for t, v in samples)
    return sxy / sxx * 60.0


def rss_report(samples, warmup, counts=()):
    after = [s for s in samples if s[0] >= warmup]
    kib = [v for _, v in samples]
    half = after[len(after) // 2:]
    # When the graph and CUDA-graph counters last moved: the slope after it is the memory of
    # a server whose caches have stopped filling.
    last_move, prev = None, None
    for t, c in counts:
        if prev is not None and c != prev:
            last_move = t
        prev = c
    settled = [s for s in after if last_move is not None and s[0] > last_move]
    return {
        "slope_second_half_kib_per_min": slope_per_min(half),
        "counters_first": counts[0][1] if counts else None,
        "counters_at_warmup": next((c for t, c in counts if t >= warmup), None),
        "counters_last": counts[-1][1] if counts else None,
        "counters_last_moved_s": last_move,
        "slope_after_counters_settled_kib_per_min": slope_per_min(settled),
        "samples_after_counters_settled": len(settled),
        "samples": len(samples), "samples_after_warmup": len(after), "warmup_s": warmup,
        "first_kib": kib[0] if kib else None, "max_kib": max(kib) if kib else None,
        "last_kib": kib[-1] if kib else None,
        "at_warmup_kib": after[0][1] if after else None,
        "slope_kib_per_min": slope_per_min(after),
        "series": samples,
    }


def per_minute(records, percentile):
    """One row per minute of the timed phase (by when each request ended): requests that
    completed, hung up on purpose, failed; TTFT and time per output token percentiles (ms) of
    the completed ones."""
    rows = {}
    for r in records:
        m = int(r["end_s"] // 60)
        row = rows.setdefault(m, {"minute": m, "ok": 0, "dropped": 0, "errors": 0,
                                  "ttft": [], "tpot": []})
        if r["ok"] is True:
            row["ok"] += 1
            row["ttft"].append(r["ttft_s"])
            if r["completion_tokens"] > 1:
                row["tpot"].append((r["total_s"] - r["ttft_s"]) / (r["completion_tokens"] - 1))
        elif r["ok"] is None:
            row["dropped"] += 1
        else:
            row["errors"] += 1
    out = []
    for m in sorted(rows):
        row = rows[m]
        for key in ("ttft", "tpot"):
            xs = row.pop(key)
            for q in (50, 90, 99):
                v = percentile(xs, q)
                row[f"{key}_p{q}_ms"] = None if v is None else v * 1000
        out.append(row)
    return out


def read_metrics(target, exchange_cls, timeout=10, names=METRICS):
    """{name: value} of the unlabelled samples among `names` from GET /metrics, or None when
    the server has no such route (not minfer) or does not answer."""
    ex = exchange_cls(target, time.monotonic() + timeout)
    try:
        ex.send("GET", "/metrics", accept="text/plain")
        if ex.status != 200:
            return None
        text = ex.read_all().decode("utf-8", "replace")
    except Exception:
        return None
    finally:
        ex.close()
    values = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) == 2 and parts[0] in names:
            try:
                values[parts[0]] = float(parts[1])
            except ValueError:
                pass
    return values


def read_counters(target, exchange_cls, timeout=5):
    """{counter: value} of the COUNTERS in /metrics (those present), or None."""
    return read_metrics(target, exchange_cls, timeout, COUNTERS)


def metrics_problems(v):
    """What is wrong with the server's counts once idle: [] when nothing. The engine then holds
    its cached prefixes and its default sequence, nothing else; the KV cells in use are those
    prefixes' (none when the cache is empty)."""
    missing = [k for k in METRICS if k not in v]
    if missing:
        return [f"/metrics lacks {', '.join(missing)}"]
    out = []
    if v["minfer_requests_running"] != 0:
        out.append(f"{v['minfer_requests_running']:g} requests still running")
    if v["minfer_requests_queued"] != 0:
        out.append(f"{v['minfer_requests_queued']:g} requests still queued")
    extra = v["minfer_engine_sequences"] - v["minfer_prefix_cache_entries"] - 1
    if extra != 0:
        out.append(f"the engine holds {v['minfer_engine_sequences']:g} sequences for "
                   f"{v['minfer_prefix_cache_entries']:g} cached prefixes and its default one "
                   f"({extra:+g}: a leaked or lost sequence)")
    if v["minfer_prefix_cache_entries"] == 0 and v["minfer_kv_cells_used"] != 0:
        out.append(f"{v['minfer_kv_cells_used']:g} KV cells in use with no cached prefix")
    return out


def settle_metrics(target, exchange_cls, wait=15.0):
    """Reads /metrics until the counts are clean or `wait` seconds passed (a hung-up request is
    dropped at the engine loop's next turn): (values or None, problems)."""
    t0 = time.monotonic()
    while True:
        v = read_metrics(target, exchange_cls)
        if v is None:
            return None, []
        problems = metrics_problems(v)
        if not problems or time.monotonic() - t0 > wait:
            return v, problems
        time.sleep(0.5)


def verdict(summary, rss, metrics, problems, max_slope, window="after-warmup"):
    """(passed, reasons): the line a soak ends with; `window` names the RSS samples whose
    slope is bounded (`--rss-window`)."""
    reasons = []
    if summary["errors"]:
        e = summary["errors_by_kind"]
        reasons.append(f"{summary['errors']} errors ("
                       + ", ".join(f"{k} {n}" for k, n in e.items() if n) + ")")
    if summary["ok"] == 0:
        reasons.append("no request completed")
    if rss is not None:
        second = window == "second-half"
        slope = rss["slope_second_half_kib_per_min" if second else "slope_kib_per_min"]
        where = "over the second half after warm-up" if second else "after warm-up"
        if slope is None:
            reasons.append(f"too few RSS samples after warm-up ({rss['samples_after_warmup']})")
        elif slope > max_slope:
            reasons.append(f"RSS grows {slope:.0f} KiB/min {where} (bound {max_slope:g})")
    if metrics is not None:
        reasons += problems
    return not reasons, reasons


def print_soak(s, out):
    w = out.write
    w(f"  per minute (by end; warm-up {s['warmup_s']:g} s){'':2}"
      f"{'ok':>5}{'hung up':>8}{'errors':>7}   TTFT ms p50 / p90 / p99"
      f"      per token ms p50 / p90 / p99\n")

    def f(x):
        return "-" if x is None else f"{x:.0f}"
    for row in s["per_minute"]:
        w(f"  minute {row['minute']:<3}{'':30}{row['ok']:>5}{row['dropped']:>8}{row['errors']:>7}"
          f"   {f(row['ttft_p50_ms']):>7} / {f(row['ttft_p90_ms']):>6} / "
          f"{f(row['ttft_p99_ms']):>6}   {f(row['tpot_p50_ms']):>7} / "
          f"{f(row['tpot_p90_ms']):>6} / {f(row['tpot_p99_ms']):>6}\n")
    r = s["rss"]
    if r is None:
        w("  RSS: not sampled (no --rss-pid and no server started here)\n")
    else:
        slope = r["slope_kib_per_min"]
        w(f"  RSS: {r['samples']} samples, {r['first_kib']} KiB at start, "
          f"{r['at_warmup_kib']} KiB at warm-up's end, max {r['max_kib']} KiB, "
          f"{r['last_kib']} KiB at the end; slope after warm-up "
          + ("-" if slope is None else f"{slope:+.1f} KiB/min")
          + f" over {r['samples_after_warmup']} samples (least squares)\n")
        h = r.get("slope_second_half_kib_per_min")
        w("  RSS slope over the second half of those samples: "
          + ("-" if h is None else f"{h:+.1f} KiB/min") + "\n")
        if r.get("counters_last") is not None:
            def cs(c):
                return "none" if c is None else ", ".join(
                    f"{k.removeprefix('minfer_')} {v:g}" for k, v in sorted(c.items()))
            moved = r["counters_last_moved_s"]
            st = r["slope_after_counters_settled_kib_per_min"]
            w(f"  graph counters: {cs(r['counters_first'])} at start, "
              f"{cs(r['counters_at_warmup'])} at warm-up's end, {cs(r['counters_last'])} at "
              f"the end; last moved at "
              + ("-" if moved is None else f"{moved:.0f} s")
              + "; RSS slope after that "
              + ("-" if st is None else f"{st:+.1f} KiB/min")
              + f" over {r['samples_after_counters_settled']} samples\n")
    m = s["metrics"]
    if m is None:
        w("  /metrics: not read (the server has none, or did not answer)\n")
    else:
        w("  /metrics after the load: " + ", ".join(
            f"{k.removeprefix('minfer_')} {v:g}" for k, v in m.items()) + "\n")
    w(f"soak verdict: {'PASS' if s['passed'] else 'FAIL'}"
      + (f" ({s['ok']} ok, {sum(s['dropped'].values())} hung up on purpose, 0 errors, "
         f"every reply equal to its reference)" if s["passed"] else
         ": " + "; ".join(s["reasons"])) + "\n")


def finish(summary, a, target, exchange_cls, sampler, percentile):
    """Adds the soak's parts to a loadtest summary once the load is over."""
    rss = rss_report(sampler.stop(), a.warmup, sampler.counts) if sampler else None
    metrics, problems = settle_metrics(target, exchange_cls, a.metrics_wait)
    passed, reasons = verdict(summary, rss, metrics, problems, a.max_rss_slope, a.rss_window)
    summary.update(per_minute=per_minute(summary["records"], percentile), rss=rss,
                   metrics=metrics, metrics_problems=problems, warmup_s=a.warmup,
                   passed=passed, reasons=reasons,
                   drop_plan={"cancel_rate": a.cancel_rate, "disconnect_rate":
                              a.disconnect_rate, "seed": a.drop_seed})
    return summary

