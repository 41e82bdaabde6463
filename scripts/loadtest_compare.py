"""Driver of scripts/loadtest-compare: `minfer serve` and llama.cpp's `llama-server` side by
side under the same load (scripts/loadtest.py), interleaved, medians and ratios as markdown.

  scripts/loadtest-compare [--clients 1,8,32] [--duration 60] [--reps 2]
                           [--minfer target/release/minfer] [--sides minfer,peer]
                           [--max-tokens 64] [--max-requests N] [--prompts FILE]
                           [--model GGUF] [--parallel 8] [--ctx 16384] [--threads 2]
                           [--json OUT]
  python3 scripts/loadtest_compare.py --render OUT.json    print the table of a JSON again

Each repetition starts each side's server once (on a free loopback port; same model, slots,
context and threads), fetches its reference replies (one at a time), runs the timed phase at
every client count in turn, and stops it. The order of the sides alternates between
repetitions (A B, B A, A B, ...) so both see the same drift of a shared machine. Per side and
client count the medians over repetitions of aggregate completion tokens/s, TTFT p50 and p99
and time per output token p50 are reported, with the ratios first side / second side.

Sides: "minfer" (`BIN serve -m MODEL --port P --parallel 8 -c 16384 -t 2`, plus `--host
127.0.0.1` when its --help has it) and "peer" (`llama-server ... --host 127.0.0.1 --kv-unified
--no-webui`). A side may be named twice (`--sides peer,peer`: an A/A run, which checks the
machinery and shows the noise). A minfer side without a `serve` subcommand is skipped with a
message, and the table shows the other side alone.

Correctness is checked as in scripts/loadtest: every streamed reply against its server's own
non-streamed reply. Greedy forks ("divergence") are errors for minfer, whose native arithmetic
is batch invariant (docs/PRECISION.md), and tolerated (counted, reported) for llama-server,
whose arithmetic depends on the batch; --allow-divergence all|none overrides that.
Exit status 1 when any side had an error.
"""

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loadtest as lt  # noqa: E402

NAMES = {"minfer": "minfer", "peer": "llama-server"}


def load_avg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def git_rev():
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=lt.REPO,
                             capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=lt.REPO, capture_output=True, text=True).stdout.strip()
        return rev + ("-dirty" if dirty else "") if rev else "unknown"
    except OSError:
        return "unknown"


def labels(sides):
    out, seen = [], {}
    for s in sides:
        seen[s] = seen.get(s, 0) + 1
        out.append(NAMES[s] + ("" if seen[s] == 1 else f"#{seen[s]}"))
    return out


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def aggregate(samples):
    """Medians and totals of one side's summaries at one client count."""
    if not samples:
        return None
    return {
        "n": len(samples),
        "tokens_per_s": median([s["tokens_per_s"] for s in samples]),
        "requests_per_s": median([s["requests_per_s"] for s in samples]),
        "ttft_p50_ms": median([s["ttft_ms"]["p50"] for s in samples]),
        "ttft_p99_ms": median([s["ttft_ms"]["p99"] for s in samples]),
        "tpot_p50_ms": median([s["tpot_ms"]["p50"] for s in samples]),
        "ok": sum(s["ok"] for s in samples),
        "errors": sum(s["errors"] for s in samples),
        "diverged_ok": sum(s["diverged_ok"] for s in samples),
        "sse_comments": sum(s.get("sse_comments", 0) for s in samples),
        "errors_by_kind": {k: sum(s["errors_by_kind"][k] for s in samples)
                           for k in lt.ERROR_KINDS},
    }


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--render":
        with open(sys.argv[2]) as f:
            print_md(json.load(f))
        return 0
    ap = argparse.ArgumentParser(prog="scripts/loadtest-compare",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", default="1,8,32", help="client counts, comma-separated")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--sides", default="minfer,peer",
                    help="one or two of minfer, peer (the ratios are first / second)")
    ap.add_argument("--minfer", default=os.path.join(
        os.environ.get("CARGO_TARGET_DIR", os.path.join(lt.REPO, "target")), "release",
        "minfer"), help="the minfer binary (default: target/release/minfer)")
    ap.add_argument("--json", metavar="OUT", help="write the summary as JSON here")
    lt.add_load_args(ap)
    ap.add_argument("--allow-divergence", choices=("auto", "all", "none"), default="auto",
                    help="auto: tolerated for llama-server only")
    lt.add_server_args(ap)
    ap.set_defaults(duration=60)
    a = ap.parse_args()
    clients = [int(c) for c in a.clients.split(",")]
    sides = a.sides.split(",")
    if len(sides) not in (1, 2) or any(s not in NAMES for s in sides):
        ap.error("--sides takes one or two of: minfer, peer")
    if any(c < 1 for c in clients) or a.reps < 1:
        ap.error("--clients and --reps must be positive")
    lt.install_sigterm()
    prompts = lt.load_prompts(a.prompts)
    names = labels(sides)
    started = datetime.datetime.now(datetime.timezone.utc)
    loads = [load_avg()]

    skipped, commands = {}, {}
    for side, name in zip(sides, names):
        argv, why = lt.server_argv(side, a, 0)
        if argv is None:
            skipped[name] = why
            print(f"loadtest-compare: {name} side skipped: {why}", file=sys.stderr)
        else:
            commands[name] = " ".join(argv).replace("--port 0", "--port P")
    live = [(s, n) for s, n in zip(sides, names) if n not in skipped]
    if not live:
        raise SystemExit("loadtest-compare: no side to run")

    samples = {n: {c: [] for c in clients} for _, n in live}
    refs = {n: [] for _, n in live}
    for rep in range(a.reps):
        order = live if rep % 2 == 0 else live[::-1]
        for side, name in order:
            allow = {"all": True, "none": False}.get(a.allow_divergence, side == "peer")
            port = lt.free_port()
            argv, _ = lt.server_argv(side, a, port)
            server = lt.Server(name, argv, port)
            try:
                target = server.start(a.startup_timeout)
                model = lt.model_name(target)
                r = lt.fetch_references(target, model, prompts,
                                        lt.prompts_used(prompts, a.max_requests),
                                        a.max_tokens, a.timeout, a.ref_concurrency)
                refs[name].append({str(k): v for k, v in r.items()})
                for c in clients:
                    s = lt.summarize(lt.TimedRun(target, model, prompts, r, a, c,
                                                 allow).run())
                    del s["records"]
                    samples[name][c].append(s)
                    loads.append(load_avg())
                    e = s["errors_by_kind"]
                    print(f"loadtest-compare: rep {rep + 1}/{a.reps} {name} clients {c}: "
                          f"{s['tokens_per_s']:.2f} tok/s, TTFT p50 "
                          f"{lt.fmt(s['ttft_ms']['p50'], '.0f')} p99 "
                          f"{lt.fmt(s['ttft_ms']['p99'], '.0f')} ms, ok {s['ok']} "
                          f"(diverged {s['diverged_ok']}), errors {s['errors']} "
                          + " ".join(f"{k}={v}" for k, v in e.items() if v)
                          + f"; load {loads[-1]:.2f}", file=sys.stderr, flush=True)
                    for kind, details in s["error_samples"].items():
                        for d in details[:2]:
                            print(f"loadtest-compare:   {kind}: {d}", file=sys.stderr)
            except KeyboardInterrupt:
                print("loadtest-compare: interrupted", file=sys.stderr)
                return 130
            finally:
                server.stop()
    finished = datetime.datetime.now(datetime.timezone.utc)

    results = []
    for c in clients:
        row = {"clients": c}
        for _, n in live:
            row[n] = aggregate(samples[n][c])
        results.append(row)
    summary = {
        "started": started.isoformat(timespec="seconds"),
        "finished": finished.isoformat(timespec="seconds"),
        "cpu": cpu_model(), "logical_cpus": os.cpu_count(),
        "load_avg_min": min(loads), "load_avg_max": max(loads),
        "commit": git_rev(), "model": a.model, "prompts_file": a.prompts,
        "n_prompts": len(prompts), "max_tokens": a.max_tokens, "duration_s": a.duration,
        "max_requests": a.max_requests, "timeout_s": a.timeout, "reps": a.reps,
        "clients": clients, "sides": names, "skipped": skipped, "commands": commands,
        "allow_divergence": a.allow_divergence, "allow_sse_comments": a.allow_sse_comments,
        "command": "scripts/loadtest-compare " + " ".join(sys.argv[1:]),
        "reference_agreement": reference_agreement(refs),
        "results": results,
        "samples": {n: {str(c): samples[n][c] for c in clients} for _, n in live},
        "references": refs,
    }
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=1)
            f.write("\n")
    print_md(summary)
    if a.json:
        print(f"\n(JSON: {a.json})")
    return 1 if any(row[n]["errors"] for row in results for _, n in live) else 0


def reference_agreement(refs):
    """Per side: prompts whose reference text was the same at every start; across the first
    two sides: prompts whose first references are the same text."""
    out = {}
    for name, runs in refs.items():
        if runs:
            keys = runs[0].keys()
            out[name] = [sum(1 for k in keys if all(r[k]["text"] == runs[0][k]["text"]
                                                   for r in runs)), len(keys), len(runs)]
    names = [n for n, runs in refs.items() if runs]
    if len(names) == 2:
        x, y = refs[names[0]][0], refs[names[1]][0]
        out["across"] = [sum(1 for k in x if x[k]["text"] == y[k]["text"]), len(x)]
    return out


def f0(x):
    return "-" if x is None else f"{x:.0f}"


def f2(x):
    return "-" if x is None else f"{x:.2f}"


def ratio(x, y):
    return "-" if x is None or y is None or y == 0 else f"{x / y:.2f}"


def print_md(s):
    """The markdown report (also: `loadtest_compare.py --render FILE.json`)."""
    names = s["sides"]
    live = [n for n in names if n not in s["skipped"]]
    print(f"{s['started']} to {s['finished']}; {s['cpu']}, {s['logical_cpus']} CPUs; load "
          f"average {s['load_avg_min']:.1f} to {s['load_avg_max']:.1f}; commit {s['commit']}")
    print(f"model {os.path.basename(s['model'])}; {s['n_prompts']} prompts round-robin, "
          f"max_tokens {s['max_tokens']}, greedy; {s['duration_s']:g} s per run"
          + (f" (at most {s['max_requests']} requests)" if s["max_requests"] else "")
          + f", {s['reps']} interleaved repetitions, medians")
    print(f"command: `{s['command']}`")
    for n in names:
        if n in s["skipped"]:
            print(f"{n}: SKIPPED: {s['skipped'][n]}")
        else:
            print(f"{n}: `{s['commands'][n]}`")
    print()
    a = live[0]
    b = live[1] if len(live) > 1 else None
    if b is None:
        print(f"| clients | {a} tok/s | {a} TTFT p50 ms | {a} TTFT p99 ms | {a} ms/token p50 "
              f"| {a} req/s | {a} ok / errors |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for row in s["results"]:
            x = row[a]
            print(f"| {row['clients']} | {f2(x['tokens_per_s'])} | {f0(x['ttft_p50_ms'])} "
                  f"| {f0(x['ttft_p99_ms'])} | {f0(x['tpot_p50_ms'])} "
                  f"| {f2(x['requests_per_s'])} | {x['ok']} / {x['errors']} |")
    else:
        print(f"| clients | {a} tok/s | {b} tok/s | tok/s {a} / {b} | {a} TTFT p50 ms "
              f"| {b} TTFT p50 ms | {a} TTFT p99 ms | {b} TTFT p99 ms | TTFT p99 {a} / {b} "
              f"| {a} ms/token p50 | {b} ms/token p50 | {a} ok / errors | {b} ok / errors |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
              "| ---: | ---: |")
        for row in s["results"]:
            x, y = row[a], row[b]
            print(f"| {row['clients']} | {f2(x['tokens_per_s'])} | {f2(y['tokens_per_s'])} "
                  f"| {ratio(x['tokens_per_s'], y['tokens_per_s'])} | {f0(x['ttft_p50_ms'])} "
                  f"| {f0(y['ttft_p50_ms'])} | {f0(x['ttft_p99_ms'])} | {f0(y['ttft_p99_ms'])} "
                  f"| {ratio(x['ttft_p99_ms'], y['ttft_p99_ms'])} | {f0(x['tpot_p50_ms'])} "
                  f"| {f0(y['tpot_p50_ms'])} | {x['ok']} / {x['errors']} "
                  f"| {y['ok']} / {y['errors']} |")
    print()
    for n in live:
        div = sum(row[n]["diverged_ok"] for row in s["results"])
        comments = sum(row[n].get("sse_comments", 0) for row in s["results"])
        errs = {}
        for row in s["results"]:
            for k, v in row[n]["errors_by_kind"].items():
                errs[k] = errs.get(k, 0) + v
        agree = s["reference_agreement"].get(n)
        print(f"{n}: errors " + (", ".join(f"{k} {v}" for k, v in errs.items() if v) or "none")
              + (f"; {div} ok replies forked from the reference (greedy divergence, tolerated)"
                 if div else "")
              + (f"; {comments} SSE comment lines skipped (--allow-sse-comments)"
                 if comments else "")
              + (f"; reference replies identical at all {agree[2]} starts: {agree[0]}/{agree[1]}"
                 if agree and agree[2] > 1 else ""))
    if "across" in s["reference_agreement"]:
        x = s["reference_agreement"]["across"]
        print(f"reference replies identical across the two sides: {x[0]}/{x[1]} prompts")


if __name__ == "__main__":
    sys.exit(main())
