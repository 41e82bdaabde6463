#!/usr/bin/env python3
"""Helpers for scripts/tokenizer-bench.

  corpus OUT                 write the deterministic 1 MB mixed corpus (English, code, CJK, emoji)
  hf MODEL CORPUS REPS TJSON time HF `tokenizers` (one thread) on CORPUS, print one JSON line;
                             the tokenizer is built from the GGUF metadata (cached as TJSON)
  summary RESULTS            medians per side, speed-up, and the ids check
"""
import json
import random
import statistics
import sys
import time
import unicodedata

QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

WORDS = ("the of and to in is was for on that with as by at from his her it an were which are this be "
         "have or had not but what all when we there can been one would their more if will about "
         "tokenizer model inference quantized memory bandwidth kernel latency throughput cache "
         "weights matrix vector attention layer sequence prompt sampling temperature engine").split()
CONTRACTIONS = ["don't", "it's", "we'll", "they're", "I've", "she'd", "can't", "I'M", "YOU'RE"]
CJK = ("的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后"
       "小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长")
KANA = "あいうえおかきくけこさしすせそたちつてとなにぬねのはひふへほまみむめもやゆよらりるれろわをんアイウエオカキクケコ"
HANGUL = "한국어로된문장입니다가나다라마바사아자차카타파하"
EMOJI = ["😀", "🚀", "👍🏽", "👨‍👩‍👧", "🇫🇷", "❤️", "🎉", "🤖", "🔥", "✨"]
CODE = [
    "def {f}(x, y=None):\n    if y is None:\n        y = {n}\n    return [i * y for i in range(x)]\n\n",
    "fn {f}(v: &[f32]) -> f32 {{\n    v.iter().map(|x| x * {n}.0).sum::<f32>()\n}}\n\n",
    "for (int i = 0; i < {n}; ++i) {{ {f}[i] = {f}[i - 1] + i; }}\n",
    "{{\"name\": \"{f}\", \"size\": {n}, \"tags\": [\"a\", \"b\"], \"ok\": true}}\n",
    "SELECT {f}, COUNT(*) FROM t WHERE id > {n} GROUP BY {f};\n",
    "<div class=\"{f}\"><a href=\"https://example.com/{f}?id={n}\">{f}</a></div>\n",
]


def make_corpus(size=1_000_000):
    rng = random.Random(20261129)
    parts = []
    total = 0
    while total < size:
        kind = rng.randrange(5)
        if kind <= 1:
            sent = []
            for _ in range(rng.randrange(3, 8)):
                ws = [rng.choice(WORDS) for _ in range(rng.randrange(5, 15))]
                if rng.random() < 0.3:
                    ws.insert(rng.randrange(len(ws)), rng.choice(CONTRACTIONS))
                if rng.random() < 0.3:
                    ws.insert(rng.randrange(len(ws)), str(rng.randrange(100000)))
                sent.append(" ".join(ws).capitalize() + rng.choice([".", ".", "!", "?", ","]))
            p = " ".join(sent) + "\n\n"
        elif kind == 2:
            f = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz_") for _ in range(rng.randrange(3, 12)))
            p = rng.choice(CODE).format(f=f, n=rng.randrange(1000))
        elif kind == 3:
            pool = rng.choice([CJK, CJK + KANA, HANGUL])
            p = "".join(rng.choice(pool) for _ in range(rng.randrange(20, 80))) + rng.choice(["。", "，", "！\n"])
        else:
            ws = [rng.choice(WORDS + EMOJI) for _ in range(rng.randrange(5, 20))]
            p = " ".join(ws) + " " + "".join(rng.choice(EMOJI) for _ in range(3)) + "\n"
        parts.append(p)
        total += len(p.encode())
    text = "".join(parts).encode()[:size].decode("utf-8", errors="ignore")
    assert unicodedata.normalize("NFC", text) == text
    return text


def build_hf(model_path):
    import gguf
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    r = gguf.GGUFReader(model_path)
    f = r.fields
    tokens = f["tokenizer.ggml.tokens"].contents()
    types = f["tokenizer.ggml.token_type"].contents()
    merges = [tuple(m.split(" ", 1)) for m in f["tokenizer.ggml.merges"].contents()]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_REGEX), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True)
                            for t, ty in zip(tokens, types) if ty == 3])
    tok.add_tokens([AddedToken(t, normalized=False) for t, ty in zip(tokens, types) if ty == 4])
    return tok


def hf(model_path, corpus_path, reps, cache_path):
    import os
    from tokenizers import Tokenizer
    if os.path.exists(cache_path):
        tok = Tokenizer.from_file(cache_path)
    else:
        tok = build_hf(model_path)
        tok.save(cache_path)
    text = open(corpus_path, encoding="utf-8").read()
    ids = tok.encode(text, add_special_tokens=False).ids
    colds = []
    for _ in range(reps):
        tok.model._clear_cache()
        t = time.perf_counter()
        tok.encode(text, add_special_tokens=False)
        colds.append((time.perf_counter() - t) * 1e3)
    cold = statistics.median(colds)
    times, cpu = [], []
    for _ in range(reps):
        t, c = time.perf_counter(), time.thread_time()
        tok.encode(text, add_special_tokens=False)
        times.append((time.perf_counter() - t) * 1e3)
        cpu.append((time.thread_time() - c) * 1e3)
    h = 0
    for i in ids:
        h = (h * 1_000_003 + i) % (1 << 64)
    print(json.dumps({"side": "hf-tokenizers", "bytes": len(text.encode()), "n_tokens": len(ids),
                      "checksum": h, "encode_cold_ms": round(cold, 2),
                      "encode_ms": round(statistics.median(times), 2),
                      "encode_cpu_ms": round(statistics.median(cpu), 2)}))


def summary(path):
    rows = [json.loads(l) for l in open(path) if l.strip()]
    ours = [r for r in rows if r["side"] == "minfer"]
    theirs = [r for r in rows if r["side"] == "hf-tokenizers"]
    mb = ours[0]["bytes"] / 1e6
    m = statistics.median(r["encode_ms"] for r in ours)
    mr = statistics.median(r["encode_raw_ms"] for r in ours)
    h = statistics.median(r["encode_ms"] for r in theirs)
    mc = statistics.median(r["encode_cpu_ms"] for r in ours)
    hc = statistics.median(r["encode_cpu_ms"] for r in theirs)
    same = {(r["n_tokens"], r["checksum"]) for r in rows}
    print(f"corpus: {ours[0]['bytes']} bytes, {ours[0]['n_tokens']} tokens; ids identical on both sides: {len(same) == 1}")
    print(f"minfer encode (NFC, 1 thread): median {m:.1f} ms = {mb / (m / 1e3):.2f} MB/s over {len(ours)} runs"
          f" (without NFC: {mr:.1f} ms; with an empty word cache: "
          f"{statistics.median(r['encode_cold_ms'] for r in ours):.1f} ms)")
    print(f"HF tokenizers encode (1 thread): median {h:.1f} ms = {mb / (h / 1e3):.2f} MB/s over {len(theirs)} runs"
          f" (with an empty BPE cache: {statistics.median(r['encode_cold_ms'] for r in theirs):.1f} ms)")
    mcold = statistics.median(r["encode_cold_ms"] for r in ours)
    hcold = statistics.median(r["encode_cold_ms"] for r in theirs)
    print(f"speed-up, warm caches: {h / m:.2f}x wall, {hc / mc:.2f}x thread CPU time ({mc:.1f} vs {hc:.1f} ms)")
    print(f"speed-up, empty caches: {hcold / mcold:.2f}x wall")
    print(f"vocabulary load: GgufFile::open median {statistics.median(r['open_ms'] for r in ours):.1f} ms,"
          f" Tokenizer::from_metadata median {statistics.median(r['build_ms'] for r in ours):.1f} ms"
          f" ({statistics.median(r['build_cpu_ms'] for r in ours):.1f} ms CPU time, all threads)")
    if len(same) != 1:
        sys.exit("token ids differ between the two sides")


def main():
    cmd = sys.argv[1]
    if cmd == "corpus":
        with open(sys.argv[2], "w", encoding="utf-8") as f:
            f.write(make_corpus())
    elif cmd == "hf":
        hf(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
    elif cmd == "summary":
        summary(sys.argv[2])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
