"""Driver of scripts/peer-batched-bench: interleaved `minfer bench --parallel` and
`llama-batched-bench` rounds, and the summary table (S_TG per N, ratios, scaling).

Standard library only (runs on the system python3)."""

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys

# The targets the batched decode is held to (minfer's S_TG at N=8 over its N=1; minfer /
# llama.cpp S_TG per N).
SCALING_N, SCALING_MIN = 8, 2.2
RATIO_MIN = {1: 1.0, 2: 1.0, 4: 1.3, 8: 1.3, 16: 1.3}


def sh(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(r.stderr[-4000:])
        raise SystemExit(f"failed ({r.returncode}): {' '.join(cmd)}")
    return r.stdout


def load_avg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def cpu_model():
    for line in sh(["lscpu"]).splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def n_ctx(a):
    return max(int(n) for n in a.parallel.split(",")) * (a.p + a.n)


def minfer_cmd(a):
    return [a.minfer, "bench", "-m", a.model, "--parallel", a.parallel, "-p", str(a.p),
            "-n", str(a.n), "-r", "1", "-t", str(a.threads), "--cache-type", a.cache_type,
            "-b", "512", "-o", "json"] + ([] if a.warmup else ["--no-warmup"])


def llama_cmd(a):
    return [a.batched_bench, "-m", a.model, "-c", str(n_ctx(a)), "-b", "2048", "-ub", "512",
            "-npp", str(a.p), "-ntg", str(a.n), "-npl", a.parallel, "-t", str(a.threads),
            "-ctk", a.cache_type, "-ctv", a.cache_type, "-fa", "on", "-no-kvu",
            "--output-format", "jsonl"]


def minfer_round(a):
    doc = json.loads(sh(minfer_cmd(a)))
    rows = {}
    for r in doc["results"]:
        rows[r["n_parallel"]] = {"s_pp": r["s_pp_ts"], "s_tg": r["s_tg_ts"], "s": r["s_ts"],
                                 "t_pp": r["t_pp_s"], "t_tg": r["t_tg_s"]}
    return rows, doc


def llama_round(a):
    rows, info = {}, None
    for line in sh(llama_cmd(a)).splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        info = info or r
        rows[r["pl"]] = {"s_pp": r["speed_pp"], "s_tg": r["speed_tg"], "s": r["speed"],
                         "t_pp": r["t_pp"], "t_tg": r["t_tg"]}
    return rows, info


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--render":
        with open(sys.argv[2]) as f:
            print_md(json.load(f))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--minfer", required=True)
    ap.add_argument("--batched-bench", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--parallel", default="1,2,4,8,16")
    ap.add_argument("-p", type=int, default=128)
    ap.add_argument("-n", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cache-type", default="f16")
    ap.add_argument("--out", required=True)
    ap.add_argument("--warmup", type=int, default=1)
    a = ap.parse_args()

    started = datetime.datetime.now(datetime.timezone.utc)
    loads = [load_avg()]
    minfer_rev = sh(["git", "rev-parse", "--short", "HEAD"]).strip()
    if sh(["git", "status", "--porcelain", "--untracked-files=no"]).strip():
        minfer_rev += "-dirty"
    ns = [int(n) for n in a.parallel.split(",")]
    samples = {n: {"minfer": [], "llama": []} for n in ns}
    minfer_doc = llama_info = None
    for rep in range(a.reps):
        for tool in ("minfer", "llama"):
            print(f"peer-batched-bench: round {rep + 1}/{a.reps}: {tool}", file=sys.stderr)
            rows, info = minfer_round(a) if tool == "minfer" else llama_round(a)
            if tool == "minfer":
                minfer_doc = minfer_doc or info
            else:
                llama_info = llama_info or info
            for n in ns:
                if n not in rows:
                    raise SystemExit(f"{tool} gave no row for N={n}")
                samples[n][tool].append(rows[n])
            loads.append(load_avg())
            # Every sample on stderr too, so an interrupted run still leaves its data.
            print("peer-batched-bench: " + tool + " S_TG " +
                  " ".join(f"N={n}:{rows[n]['s_tg']:.2f}" for n in ns) +
                  f" t/s, load {loads[-1]:.2f}", file=sys.stderr)
    finished = datetime.datetime.now(datetime.timezone.utc)
    results = []
    for n in ns:
        r = {"n_parallel": n}
        for tool in ("minfer", "llama"):
            for key in ("s_pp", "s_tg", "s", "t_pp", "t_tg"):
                r[f"{tool}_{key}"] = statistics.median(x[key] for x in samples[n][tool])
            r[f"{tool}_samples"] = samples[n][tool]
        for key in ("s_pp", "s_tg", "s"):
            r[f"ratio_{key}"] = r[f"minfer_{key}"] / r[f"llama_{key}"]
        results.append(r)
    base = {r["n_parallel"]: r for r in results}.get(1)
    for r in results:
        for tool in ("minfer", "llama"):
            r[f"{tool}_s_tg_vs_n1"] = r[f"{tool}_s_tg"] / base[f"{tool}_s_tg"] if base else None
    facts = minfer_doc["model"] if minfer_doc else {}
    summary = {
        "started": started.isoformat(timespec="seconds"),
        "finished": finished.isoformat(timespec="seconds"),
        "cpu": cpu_model(), "logical_cpus": os.cpu_count(),
        "cpu_simd": minfer_doc["system"]["cpu_simd"] if minfer_doc else None,
        "load_avg_min": min(loads), "load_avg_max": max(loads),
        "model": a.model, "model_type": facts.get("model_type"),
        "cache_type": a.cache_type, "reps": a.reps, "n_prompt": a.p, "n_gen": a.n,
        "threads": a.threads, "n_ctx": n_ctx(a), "minfer_warmup": bool(a.warmup),
        "minfer_commit": minfer_rev,
        "minfer_kv_layout": (minfer_doc["results"][0]["kv_layout"] if minfer_doc else None),
        "llama_n_kv_max": llama_info.get("n_kv_max") if llama_info else None,
        "minfer_command": " ".join(minfer_cmd(a)), "llama_command": " ".join(llama_cmd(a)),
        "results": results,
    }
    with open(a.out, "w") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")
    print_md(summary)
    print(f"\n(JSON: {a.out})")


def fmt(x, spec=".2f"):
    return "-" if x is None else format(x, spec)


def print_md(s):
    """The markdown report of a summary (also: `peer_batched_bench.py --render FILE.json`)."""
    print(f"{s['started']} to {s['finished']}; {s['cpu']}, {s['logical_cpus']} CPUs, SIMD: "
          f"{' '.join(s['cpu_simd'] or [])}; load average {s['load_avg_min']:.1f} to "
          f"{s['load_avg_max']:.1f} (the machine is shared)")
    print(f"model: {s['model']} ({s['model_type']}); P={s['n_prompt']} T={s['n_gen']} "
          f"-t {s['threads']}; KV {s['cache_type']}, {s['n_ctx']} cells; {s['reps']} "
          f"interleaved rounds, medians; minfer {s['minfer_commit']} (KV layout "
          f"{s['minfer_kv_layout']}, warm-up {'on' if s['minfer_warmup'] else 'off'})")
    print(f"minfer:    {s['minfer_command']}")
    print(f"llama.cpp: {s['llama_command']}")
    print()
    print("| N | minfer S_TG t/s | llama.cpp S_TG t/s | S_TG minfer / llama.cpp | target "
          "| minfer S_TG vs N=1 | llama.cpp S_TG vs N=1 | minfer S_PP t/s | llama.cpp S_PP t/s "
          "| S_PP ratio | minfer S t/s | llama.cpp S t/s |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in s["results"]:
        n = r["n_parallel"]
        want = RATIO_MIN.get(n)
        verdict = "-" if want is None else (
            f"≥ {want:.1f}: {'met' if r['ratio_s_tg'] >= want else 'NOT met'}")
        print(f"| {n} | {r['minfer_s_tg']:.2f} | {r['llama_s_tg']:.2f} | {r['ratio_s_tg']:.3f} "
              f"| {verdict} | {fmt(r['minfer_s_tg_vs_n1'])}x | {fmt(r['llama_s_tg_vs_n1'])}x "
              f"| {r['minfer_s_pp']:.2f} | {r['llama_s_pp']:.2f} | {r['ratio_s_pp']:.3f} "
              f"| {r['minfer_s']:.2f} | {r['llama_s']:.2f} |")
    by_n = {r["n_parallel"]: r for r in s["results"]}
    if SCALING_N in by_n and by_n[SCALING_N]["minfer_s_tg_vs_n1"] is not None:
        x = by_n[SCALING_N]["minfer_s_tg_vs_n1"]
        print(f"\nminfer S_TG at N={SCALING_N} is {x:.2f}x its N=1 (target ≥ {SCALING_MIN}x: "
              f"{'met' if x >= SCALING_MIN else 'NOT met'})")


if __name__ == "__main__":
    main()
