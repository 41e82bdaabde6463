"""Driver of scripts/peer-bench: interleaved minfer / llama-bench runs and the summary table.

Standard library only (runs on the system python3)."""

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys


def sh(cmd):
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def load_avg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def cpu_model():
    for line in sh(["lscpu"]).splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def no_warmup(a):
    return [] if a.warmup else ["--no-warmup"]


def depth(a):
    # Both tools take `-d N` (llama-bench's --n-depth): N tokens prefilled, untimed, before the test.
    return ["-d", str(a.d)] if a.d else []


def minfer_cmd(a, test, n, threads):
    p, g = (n, 0) if test == "pp" else (0, n)
    return [a.minfer, "bench", "-m", a.model, "-p", str(p), "-n", str(g), "-r", "1",
            "-t", str(threads), "--cache-type", a.cache_type, "-o", "json"] + depth(a) + no_warmup(a)


def llama_cmd(a, test, n, threads):
    p, g = (n, 0) if test == "pp" else (0, n)
    return [a.llama_bench, "-m", a.model, "-p", str(p), "-n", str(g), "-r", "1",
            "-t", str(threads), "-ctk", a.cache_type, "-ctv", a.cache_type, "-o", "json"] + depth(a) + no_warmup(a)


def one_sample(cmd, is_minfer):
    doc = json.loads(sh(cmd))
    rows = doc["results"] if is_minfer else doc
    if len(rows) != 1 or len(rows[0]["samples_ts"]) != 1:
        raise SystemExit(f"expected one row with one sample from {' '.join(cmd)}")
    return rows[0]["samples_ts"][0], doc


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--render":
        with open(sys.argv[2]) as f:
            print_md(json.load(f))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--minfer", required=True)
    ap.add_argument("--llama-bench", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-d", type=int, default=0, help="depth: tokens in the KV before each test")
    ap.add_argument("--cache-type", default="f16")
    ap.add_argument("--json", type=int, default=0)
    ap.add_argument("--membw", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=1)
    a = ap.parse_args()

    started = datetime.datetime.now(datetime.timezone.utc)
    loads = [load_avg()]
    minfer_rev = sh(["git", "rev-parse", "--short", "HEAD"]).strip()
    dirty = sh(["git", "status", "--porcelain", "--untracked-files=no"]).strip()
    if dirty:
        minfer_rev += "-dirty"
    llama_info = None
    minfer_info = None
    tests = [("pp", a.p)] if a.p > 0 else []
    tests += [("tg", a.n)] if a.n > 0 else []
    results = []
    for threads in [int(t) for t in a.threads.split(",")]:
        for test, n in tests:
            ours, theirs = [], []
            for rep in range(a.reps):
                print(f"peer-bench: t={threads} {test}{n} repetition {rep + 1}/{a.reps}",
                      file=sys.stderr)
                ts, doc = one_sample(minfer_cmd(a, test, n, threads), True)
                ours.append(ts)
                minfer_info = minfer_info or doc
                ts2, doc = one_sample(llama_cmd(a, test, n, threads), False)
                theirs.append(ts2)
                llama_info = llama_info or doc[0]
                loads.append(load_avg())
                # Every sample on stderr too, so an interrupted run still leaves its data.
                print(f"peer-bench: sample t={threads} {test}{n} minfer {ts:.3f} "
                      f"llama.cpp {ts2:.3f} t/s, load {loads[-1]:.2f}", file=sys.stderr)
            mo, ml = statistics.median(ours), statistics.median(theirs)
            results.append({
                "threads": threads, "test": f"{test}{n}",
                "minfer_median_ts": mo, "llama_median_ts": ml, "ratio": mo / ml,
                "minfer_samples_ts": ours, "llama_samples_ts": theirs,
            })
    membw = None
    if a.membw:
        membw = json.loads(sh([a.minfer, "bench", "--membw", "-p", "0", "-n", "0", "-t", a.threads,
                               "-o", "json"]))["membw"]
    finished = datetime.datetime.now(datetime.timezone.utc)
    facts = minfer_info["model"] if minfer_info else {}
    summary = {
        "started": started.isoformat(timespec="seconds"),
        "finished": finished.isoformat(timespec="seconds"),
        "cpu": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "cpu_simd": minfer_info["system"]["cpu_simd"] if minfer_info else None,
        "load_avg_min": min(loads), "load_avg_max": max(loads),
        "model": a.model, "model_type": facts.get("model_type"),
        "weight_bytes_per_token": facts.get("weight_bytes_per_token"),
        "cache_type": a.cache_type, "depth": a.d, "reps": a.reps, "warmup": bool(a.warmup),
        "minfer_commit": minfer_rev,
        "llama_cpp_commit": llama_info.get("build_commit") if llama_info else None,
        "llama_cpp_build_number": llama_info.get("build_number") if llama_info else None,
        "minfer_command": " ".join(minfer_cmd(a, "tg", a.n, "T")),
        "llama_command": " ".join(llama_cmd(a, "tg", a.n, "T")),
        "results": results, "membw": membw,
    }
    if a.json:
        print(json.dumps(summary, indent=2))
    else:
        print_md(summary)


def print_md(summary):
    """The markdown report of a summary (also: `peer_bench.py --render FILE.json`)."""
    results, membw = summary["results"], summary["membw"]
    wb = summary["weight_bytes_per_token"] or 0
    print(f"{summary['started']} to {summary['finished']}; {summary['cpu']}, "
          f"{summary['logical_cpus']} CPUs, SIMD: {' '.join(summary['cpu_simd'] or [])}; "
          f"load average {summary['load_avg_min']:.1f} to {summary['load_avg_max']:.1f} "
          f"(the machine is shared)")
    print(f"model: {summary['model']} ({summary['model_type']}); KV {summary['cache_type']}, "
          f"depth {summary.get('depth', 0)}; "
          f"{summary['reps']} interleaved repetitions each, "
          f"warm-up {'on' if summary.get('warmup', True) else 'off'}; "
          f"minfer {summary['minfer_commit']}, llama.cpp {summary['llama_cpp_commit']}")
    print()
    print("| threads | test | minfer t/s (median) | llama.cpp t/s (median) | minfer / llama.cpp "
          "| minfer min-max | llama.cpp min-max | minfer weights GB/s | llama.cpp weights GB/s |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        tg = r["test"].startswith("tg")
        gb = (lambda ts: f"{wb * ts / 1e9:.2f}") if tg else (lambda ts: "-")
        print(f"| {r['threads']} | {r['test']} | {r['minfer_median_ts']:.2f} "
              f"| {r['llama_median_ts']:.2f} | {r['ratio']:.3f} "
              f"| {min(r['minfer_samples_ts']):.2f}-{max(r['minfer_samples_ts']):.2f} "
              f"| {min(r['llama_samples_ts']):.2f}-{max(r['llama_samples_ts']):.2f} "
              f"| {gb(r['minfer_median_ts'])} | {gb(r['llama_median_ts'])} |")
    if membw:
        print()
        for b in membw:
            print(f"memory bandwidth ({b['threads']} thread(s), {b['bytes'] >> 20} MiB buffers, "
                  f"best of {b['rounds']}): copy {b['copy_gbps']:.2f} GB/s, "
                  f"read {b['read_gbps']:.2f} GB/s")


if __name__ == "__main__":
    main()
