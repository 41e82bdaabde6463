#!/usr/bin/env python3
"""Builds a small Hugging Face-style checkpoint for `minfer convert`'s tests (issue 17).

    make-hf-checkpoint.py OUT_DIR --arch qwen2|qwen3|llama --vocab-from MODEL.gguf
                          [--hidden 64] [--layers 2] [--shards 1] [--dtype bf16|f16|f32]
                          [--untied] [--seed 0]

Writes config.json, generation_config.json, tokenizer.json (made with the `tokenizers`
package from the vocabulary and merges of a GGUF with a qwen2 BPE tokenizer, so the
pre-tokenizer hash is a real one), tokenizer_config.json (with the GGUF's chat template),
model.safetensors or model-0000k-of-0000n.safetensors with model.safetensors.index.json
(random weights from a seeded numpy generator), and reference.json: the greedy
continuation of a fixed prompt computed by the plain numpy forward below, which follows
the Hugging Face modelling code (rotate-half RoPE on the checkpoint's own q/k layout), not
llama.cpp's, so a converter that lays out weights wrongly cannot agree with it.
No torch, no network.
"""

import argparse
import json
import os

import numpy as np
from gguf import GGUFReader
from safetensors.numpy import save_file
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

# The Qwen2 tokenizer's split pattern (as its tokenizer.json has it).
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")

ARCHES = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM"}
PROMPT = "def fib(n):\n    return"


def field(reader, key):
    f = reader.fields[key]
    if f.types[0].name == "ARRAY":
        return [f.contents(i) for i in range(len(f.data))]
    return f.contents()


def build_tokenizer(gguf_path, out):
    r = GGUFReader(gguf_path)
    if field(r, "tokenizer.ggml.pre") != "qwen2":
        raise SystemExit("--vocab-from needs a GGUF whose tokenizer.ggml.pre is qwen2")
    tokens = field(r, "tokenizer.ggml.tokens")
    types = field(r, "tokenizer.ggml.token_type")
    merges = field(r, "tokenizer.ggml.merges")
    template = field(r, "tokenizer.chat_template")
    normal = {t: i for i, (t, ty) in enumerate(zip(tokens, types)) if ty == 1}
    n_normal = len(normal)
    assert sorted(normal.values()) == list(range(n_normal)), "normal tokens must come first"
    bpe = models.BPE(vocab=normal, merges=[tuple(m.split(" ")) for m in merges])
    tk = Tokenizer(bpe)
    tk.normalizer = normalizers.NFC()
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tk.decoder = decoders.ByteLevel()
    added = []
    for i in range(n_normal, len(tokens)):
        if types[i] not in (3, 4):  # CONTROL, USER_DEFINED; padding entries stay out
            continue
        special = types[i] == 3
        tk.add_tokens([AddedToken(tokens[i], special=special, normalized=False)])
        assert tk.token_to_id(tokens[i]) == i, (tokens[i], i)
        added.append((i, tokens[i], special))
    tk.save(os.path.join(out, "tokenizer.json"))
    eos = tokens[int(field(r, "tokenizer.ggml.eos_token_id"))]
    pad = tokens[int(field(r, "tokenizer.ggml.padding_token_id"))]
    config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "bos_token": None,
        "eos_token": eos,
        "pad_token": pad,
        "chat_template": template,
        "model_max_length": 32768,
        "tokenizer_class": "Qwen2Tokenizer",
        "added_tokens_decoder": {str(i): {"content": t, "special": s, "normalized": False,
                                          "lstrip": False, "rstrip": False, "single_word": False}
                                 for i, t, s in added},
    }
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
    return tk, len(tokens), tokens.index(eos), tokens.index(pad)


def bf16_round(a):
    """float32 -> nearest bfloat16 (ties to even), as float32 values."""
    u = a.astype(np.float32).view(np.uint32)
    u = ((u + (0x7FFF + ((u >> 16) & 1))) >> 16) << 16
    return u.astype(np.uint32).view(np.float32)


def store(a, dtype):
    """The array as it is saved, and the float32 values the checkpoint really holds."""
    if dtype == "f32":
        return a.astype(np.float32), a.astype(np.float32)
    if dtype == "f16":
        h = a.astype(np.float16)
        return h, h.astype(np.float32)
    r = bf16_round(a)
    # safetensors.numpy has no bfloat16: write the raw bits and relabel the dtype after.
    return (r.view(np.uint32) >> 16).astype(np.uint16), r


def make_weights(args, n_vocab, rng):
    h, L = args.hidden, args.layers
    n_head, n_kv = 4, 2
    head_dim = h // n_head if args.arch != "qwen3" else 32
    ff = 3 * h
    w = {}

    def mat(name, rows, cols, scale=None):
        s = scale if scale is not None else 2.0 / np.sqrt(cols)
        w[name] = rng.standard_normal((rows, cols)).astype(np.float32) * s

    def vec(name, n, base=1.0, jitter=0.1):
        w[name] = (base + jitter * rng.standard_normal(n)).astype(np.float32)

    # Rows of equal norm, so the greedy choice depends on direction (what the layers
    # computed), not on which rows happen to be long.
    e = rng.standard_normal((n_vocab, h)).astype(np.float32)
    w["model.embed_tokens.weight"] = e / np.linalg.norm(e, axis=1, keepdims=True) * 4.0
    for i in range(L):
        p = f"model.layers.{i}."
        vec(p + "input_layernorm.weight", h)
        vec(p + "post_attention_layernorm.weight", h)
        mat(p + "self_attn.q_proj.weight", n_head * head_dim, h)
        mat(p + "self_attn.k_proj.weight", n_kv * head_dim, h)
        mat(p + "self_attn.v_proj.weight", n_kv * head_dim, h)
        mat(p + "self_attn.o_proj.weight", h, n_head * head_dim)
        if args.arch == "qwen2":
            for t, n in (("q", n_head), ("k", n_kv), ("v", n_kv)):
                vec(p + f"self_attn.{t}_proj.bias", n * head_dim, 0.0, 0.5)
        if args.arch == "qwen3":
            vec(p + "self_attn.q_norm.weight", head_dim)
            vec(p + "self_attn.k_norm.weight", head_dim)
        mat(p + "mlp.gate_proj.weight", ff, h)
        mat(p + "mlp.up_proj.weight", ff, h)
        mat(p + "mlp.down_proj.weight", h, ff)
    vec("model.norm.weight", h)
    if args.untied:
        mat("lm_head.weight", n_vocab, h)
    hp = dict(hidden=h, layers=L, n_head=n_head, n_kv=n_kv, head_dim=head_dim, ff=ff)
    return w, hp


def rms(x, g, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g


def rope_half(x, pos, theta):
    """Hugging Face rotate_half RoPE: (n_tok, n_head, d), pairs (i, i + d/2)."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    ang = pos[:, None] * inv[None, :]
    cos = np.concatenate([np.cos(ang)] * 2, -1)[:, None, :]
    sin = np.concatenate([np.sin(ang)] * 2, -1)[:, None, :]
    rot = np.concatenate([-x[..., d // 2:], x[..., : d // 2]], -1)
    return x * cos + rot * sin


def forward(w, hp, arch, ids, theta, eps, untied):
    """Logits of the last position, in float64, following the Hugging Face modelling code."""
    x = w["model.embed_tokens.weight"][ids].astype(np.float64)
    n = len(ids)
    pos = np.arange(n, dtype=np.float64)
    nh, nkv, hd = hp["n_head"], hp["n_kv"], hp["head_dim"]
    mask = np.triu(np.full((n, n), -np.inf), 1)
    for i in range(hp["layers"]):
        p = f"model.layers.{i}."
        g = lambda k: w[p + k].astype(np.float64)  # noqa: E731
        h = rms(x, g("input_layernorm.weight"), eps)
        q = h @ g("self_attn.q_proj.weight").T
        k = h @ g("self_attn.k_proj.weight").T
        v = h @ g("self_attn.v_proj.weight").T
        if arch == "qwen2":
            q += g("self_attn.q_proj.bias")
            k += g("self_attn.k_proj.bias")
            v += g("self_attn.v_proj.bias")
        q, k, v = q.reshape(n, nh, hd), k.reshape(n, nkv, hd), v.reshape(n, nkv, hd)
        if arch == "qwen3":
            q = rms(q, g("self_attn.q_norm.weight"), eps)
            k = rms(k, g("self_attn.k_norm.weight"), eps)
        q, k = rope_half(q, pos, theta), rope_half(k, pos, theta)
        rep = nh // nkv
        k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
        att = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd) + mask
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        o = np.einsum("hqk,khd->qhd", att, v).reshape(n, nh * hd)
        x = x + o @ g("self_attn.o_proj.weight").T
        h = rms(x, g("post_attention_layernorm.weight"), eps)
        gate, up = h @ g("mlp.gate_proj.weight").T, h @ g("mlp.up_proj.weight").T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ g("mlp.down_proj.weight").T
    x = rms(x, w["model.norm.weight"].astype(np.float64), eps)
    out = w["lm_head.weight" if untied else "model.embed_tokens.weight"].astype(np.float64)
    return x[-1] @ out.T


def relabel_bf16(path):
    """Rewrites the header's U16 dtypes as BF16 (same bytes, same header length)."""
    with open(path, "r+b") as f:
        n = int.from_bytes(f.read(8), "little")
        header = f.read(n).decode()
        new = header.replace('"U16"', '"BF16"')
        new = new + " " * (n - len(new.encode())) if len(new.encode()) <= n else None
        if new is None:
            # BF16 is one byte longer than U16: rebuild with a padded header.
            hdr = json.loads(header)
            for v in hdr.values():
                if isinstance(v, dict) and v.get("dtype") == "U16":
                    v["dtype"] = "BF16"
            data = f.read()
            text = json.dumps(hdr, separators=(",", ":"))
            text += " " * (-(8 + len(text)) % 8)
            f.seek(0)
            f.truncate()
            f.write(len(text).to_bytes(8, "little") + text.encode() + data)
        else:
            f.seek(8)
            f.write(new.encode())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--arch", choices=sorted(ARCHES), required=True)
    ap.add_argument("--vocab-from", required=True)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--dtype", choices=["bf16", "f16", "f32"], default="bf16")
    ap.add_argument("--untied", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=8)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    tk, n_vocab, eos, pad = build_tokenizer(args.vocab_from, args.out)
    rng = np.random.default_rng(args.seed)
    w, hp = make_weights(args, n_vocab, rng)
    theta, eps = 1000000.0, 1e-6
    config = {
        "architectures": [ARCHES[args.arch]],
        "model_type": args.arch,
        "hidden_size": hp["hidden"],
        "intermediate_size": hp["ff"],
        "num_hidden_layers": hp["layers"],
        "num_attention_heads": hp["n_head"],
        "num_key_value_heads": hp["n_kv"],
        "max_position_embeddings": 4096,
        "rms_norm_eps": eps,
        "rope_theta": theta,
        "vocab_size": n_vocab,
        "tie_word_embeddings": not args.untied,
        "torch_dtype": {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}[args.dtype],
        "eos_token_id": eos,
        "hidden_act": "silu",
    }
    if args.arch == "qwen3":
        config["head_dim"] = hp["head_dim"]
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(args.out, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": [eos], "pad_token_id": pad, "do_sample": True,
                   "temperature": 0.7, "top_p": 0.8, "top_k": 20}, f, indent=2)
    stored, real = {}, {}
    for k, a in w.items():
        stored[k], real[k] = store(a, args.dtype)
    names = list(stored)
    chunks = [names[i::args.shards] for i in range(args.shards)]
    if args.shards == 1:
        files = {"model.safetensors": names}
    else:
        files = {f"model-{i + 1:05d}-of-{args.shards:05d}.safetensors": c for i, c in enumerate(chunks)}
    for fname, keys in files.items():
        path = os.path.join(args.out, fname)
        save_file({k: stored[k] for k in keys}, path, metadata={"format": "pt"})
        if args.dtype == "bf16":
            relabel_bf16(path)
    if args.shards > 1:
        index = {"metadata": {"total_size": int(sum(a.nbytes for a in stored.values()))},
                 "weight_map": {k: f for f, ks in files.items() for k in ks}}
        with open(os.path.join(args.out, "model.safetensors.index.json"), "w") as f:
            json.dump(index, f, indent=2)
    ids = tk.encode(PROMPT).ids
    out = []
    for _ in range(args.steps):
        logits = forward(real, hp, args.arch, ids + out, theta, eps, args.untied)
        out.append(int(np.argmax(logits)))
    with open(os.path.join(args.out, "reference.json"), "w") as f:
        json.dump({"prompt": PROMPT, "prompt_ids": ids, "greedy": out}, f)


if __name__ == "__main__":
    main()
