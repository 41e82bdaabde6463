"""Tables of `scripts/gpu-calls c`'s results (standard library only): medians over the
rounds of llama.cpp's and minfer's figures, written by that call into one folder.

    python3 scripts/gpu_calls_c.py DIR
"""

import glob
import json
import os
import re
import statistics
import sys


def load(path):
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    text = text.strip()
    if not text:
        return None
    if text.startswith("{") and "\n{" in text:  # JSON lines (llama-batched-bench)
        return [json.loads(l) for l in text.splitlines() if l.strip().startswith("{")]
    try:
        return json.loads(text)
    except ValueError:
        return None


def bench_rows(doc):
    """(test name, t/s) of llama-bench's list or minfer bench's {"results": [...]}."""
    if isinstance(doc, dict):
        doc = doc.get("results", [])
    out = []
    for d in doc or []:
        p, n, dep = d.get("n_prompt", 0), d.get("n_gen", 0), d.get("n_depth", 0)
        ts = d.get("avg_ts")
        if ts is None:
            continue
        out.append((("pp%d" % p if p else "tg%d" % n) + ("@d%d" % dep if dep else ""), ts))
    return out


def parallel_rows(doc):
    """{N: S_TG} of llama-batched-bench's JSON lines or minfer bench --parallel's JSON."""
    rows = {}
    if isinstance(doc, dict):
        for r in doc.get("results", []):
            rows[r["n_parallel"]] = r["s_tg_ts"]
    elif isinstance(doc, list):
        for r in doc:
            if "pl" in r:
                rows[r["pl"]] = r["speed_tg"]
    return rows


def med(v):
    return statistics.median(v) if v else float("nan")


def ratio(a, b):
    return a / b if a == a and b == b and b else float("nan")


def main(d):
    runs = {}
    for f in sorted(glob.glob(os.path.join(d, "*"))):
        name = os.path.basename(f)
        if name.endswith(".err") or name.endswith(".log"):
            continue
        m = re.match(r"(.+?)(?:-(\d+))?$", name)
        runs.setdefault(m.group(1), []).append(load(f))

    print("| test | llama.cpp t/s | minfer t/s | ratio |")
    print("|---|---:|---:|---:|")
    for key, lk, mk in [
        ("7B tg128", "llama-tg", "minfer-tg"),
        ("7B tg128, the binary before (minfer-base)", "llama-tg", "minfer-tg-base"),
        ("0.5B tg128", "llama05-tg", "minfer05-tg"),
        ("0.5B tg128, the binary before (minfer-base)", "llama05-tg", "minfer05-tg-base"),
        ("7B pp512, q8_0 KV, prompt attention on the generation kernels", "llama-q8pp", "minfer-q8pp-rows"),
        ("7B pp512, q8_0 KV, fa-q8 tensor-core attention", "llama-q8pp", "minfer-q8pp-fa"),
    ]:
        lv = [t for doc in runs.get(lk, []) for _, t in bench_rows(doc)]
        mv = [t for doc in runs.get(mk, []) for _, t in bench_rows(doc)]
        print("| %s | %.1f | %.1f | %.3f |" % (key, med(lv), med(mv), ratio(med(mv), med(lv))))

    print()
    print("| 7B, -p 128 -n 32 S_TG t/s | N | llama.cpp | minfer (multi-row kernels) | minfer MVN=0 | ratio | ratio MVN=0 | ms/forward minfer | ms/forward MVN=0 |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    ns = sorted({n for doc in runs.get("llama-par", []) + runs.get("minfer-par", []) for n in parallel_rows(doc)})
    for n in ns:
        l = med([parallel_rows(doc).get(n) for doc in runs.get("llama-par", []) if parallel_rows(doc).get(n)])
        m = med([parallel_rows(doc).get(n) for doc in runs.get("minfer-par", []) if parallel_rows(doc).get(n)])
        z = med([parallel_rows(doc).get(n) for doc in runs.get("minfer-par-mvn0", []) if parallel_rows(doc).get(n)])
        print("| | %d | %.1f | %.1f | %.1f | %.3f | %.3f | %.2f | %.2f |" % (
            n, l, m, z, ratio(m, l), ratio(z, l), 1000.0 * n / m if m == m and m else float("nan"),
            1000.0 * n / z if z == z and z else float("nan")))

    variants = sorted({k.split("-", 2)[2] for k in runs
                       if k.startswith(("minfer-tg-", "minfer-par-")) and k != "minfer-par-mvn0"})
    if variants:
        print()
        print("| variant (VARIANTS, LAYOUTS) | 7B tg128 t/s | / llama.cpp | S_TG at N = " +
              ", ".join(str(n) for n in ns) + " |")
        print("|---|---:|---:|---|")
        lt = med([t for doc in runs.get("llama-tg", []) for _, t in bench_rows(doc)])
        for v in variants:
            tg = med([t for doc in runs.get("minfer-tg-" + v, []) for _, t in bench_rows(doc)])
            par = [med([parallel_rows(doc).get(n) for doc in runs.get("minfer-par-" + v, [])
                        if parallel_rows(doc).get(n)]) for n in ns]
            print("| %s | %.1f | %.3f | %s |" % (v, tg, ratio(tg, lt),
                                                 ", ".join("%.1f" % x for x in par)))

    print()
    print("| 7B offload (-ngl) | test | llama.cpp t/s | minfer t/s | ratio |")
    print("|---|---|---:|---:|---:|")
    for ngl in (28, 14, 0):
        l = dict(bench_rows((runs.get("llama-ngl%d" % ngl) or [None])[0]))
        m = dict(bench_rows((runs.get("minfer-ngl%d" % ngl) or [None])[0]))
        for t in sorted(set(l) | set(m)):
            a, b = l.get(t, float("nan")), m.get(t, float("nan"))
            print("| %d blocks | %s | %.1f | %.1f | %.3f |" % (ngl, t, a, b, ratio(b, a)))


if __name__ == "__main__":
    main(sys.argv[1])
