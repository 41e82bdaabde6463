#!/usr/bin/env python3
"""The oracle for `minfer convert`'s tests (issue 17): converts a Qwen2 / Qwen3 / LLaMA
checkpoint with a GPT-2-style BPE tokenizer to GGUF with the `gguf` package, following the
rules of llama.cpp's convert_hf_to_gguf.py (conversion/base.py, qwen.py, llama.py).

    convert-reference.py HF_DIR OUT.gguf --outtype f32|f16|bf16|q8_0 [--llama-cpp DIR]

Why not convert_hf_to_gguf.py itself: it imports torch (and transformers' AutoTokenizer),
which are far too heavy for the test venv. What this script takes from the `gguf` package
rather than restating: the tensor-name map (gguf.get_tensor_name_map), the special-token,
merges and chat-template rules (gguf.SpecialVocab), the key names and types
(GGUFWriter.add_*), the f16/bf16/q8_0 encodings (gguf.quants.quantize) and the file layout.
The pre-tokenizer name comes from the `tokenizers` package's encoding of llama.cpp's check
text, hashed and looked up in the table of conversion/base.py (read from the llama.cpp
source given by --llama-cpp). Descriptive general.* keys (size label, basename, ...) come
from model-card heuristics and are not written; general.name is the directory's name, the
fallback convert_hf_to_gguf.py uses.
"""

import argparse
import ast
import json
import os
import re
from hashlib import sha256
from pathlib import Path

import gguf
import numpy as np
from safetensors import safe_open
from tokenizers import Tokenizer

ARCHES = {"Qwen2ForCausalLM": gguf.MODEL_ARCH.QWEN2, "Qwen3ForCausalLM": gguf.MODEL_ARCH.QWEN3,
          "LlamaForCausalLM": gguf.MODEL_ARCH.LLAMA}
FTYPES = {"f32": (gguf.LlamaFileType.ALL_F32, gguf.GGMLQuantizationType.F32),
          "f16": (gguf.LlamaFileType.MOSTLY_F16, gguf.GGMLQuantizationType.F16),
          "bf16": (gguf.LlamaFileType.MOSTLY_BF16, gguf.GGMLQuantizationType.BF16),
          "q8_0": (gguf.LlamaFileType.MOSTLY_Q8_0, gguf.GGMLQuantizationType.Q8_0)}


def pre_table(llama_cpp):
    src = (Path(llama_cpp) / "conversion" / "base.py").read_text()
    chktxt = ast.literal_eval(re.search(r"chktxt = ('.*')\n", src).group(1))
    table = dict(re.findall(r'if chkhsh == "([0-9a-f]{64})":\n(?:\s*#.*\n)*\s*res = "([^"]+)"', src))
    return chktxt, table


def tensors(d):
    index = d / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() \
        else ["model.safetensors"]
    for f in files:
        with safe_open(d / f, framework="numpy") as st:
            for k in st.keys():
                yield k, d / f


def load_tensor(path, name):
    """numpy has no bfloat16: read raw and widen bf16 to float32 (what the converter does)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        hdr = json.loads(f.read(n))
        meta = hdr[name]
        a, b = meta["data_offsets"]
        f.seek(8 + n + a)
        raw = f.read(b - a)
    dt = meta["dtype"]
    if dt == "BF16":
        arr = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
    else:
        arr = np.frombuffer(raw, {"F16": np.float16, "F32": np.float32}[dt])
    return arr.reshape(meta["shape"])


def permute(w, n_head, n_head_kv):
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def looks_special(t):
    return t in ("<pad>", "<mask>", "<2mass>", "[@BOS@]") or (t.startswith("<|") and t.endswith("|>")) \
        or (t.startswith("<｜") and t.endswith("｜>")) or (t.startswith("<unused") and t.endswith(">"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("out")
    ap.add_argument("--outtype", choices=sorted(FTYPES), default="f16")
    ap.add_argument("--llama-cpp", required=True)
    args = ap.parse_args()
    d = Path(args.dir)
    hp = json.loads((d / "config.json").read_text())
    arch = ARCHES[hp["architectures"][0]]
    ftype, qtype = FTYPES[args.outtype]
    w = gguf.GGUFWriter(args.out, gguf.MODEL_ARCH_NAMES[arch])

    # TextModel.prepare_metadata: type, name, parameters, quantization version, vocab.
    w.add_type(gguf.GGUFType.MODEL)
    md = gguf.Metadata()
    md.name = d.name
    gen = gguf.Metadata.load_generation_config(d)
    for field, key in (("sampling_sequence", "sequence"), ("sampling_top_k", "top_k"),
                       ("sampling_top_p", "top_p"), ("sampling_min_p", "min_p"),
                       ("sampling_xtc_probability", "xtc_probability"),
                       ("sampling_xtc_threshold", "xtc_threshold"), ("sampling_temp", "temperature"),
                       ("sampling_penalty_last_n", "penalty_last_n"),
                       ("sampling_penalty_repeat", "repetition_penalty"), ("sampling_mirostat", "mirostat"),
                       ("sampling_mirostat_tau", "mirostat_tau"), ("sampling_mirostat_eta", "mirostat_eta")):
        if key in gen:
            setattr(md, field, gen[key])
    md.set_gguf_meta_model(w)
    n_layer = hp["num_hidden_layers"]
    w.add_block_count(n_layer)
    w.add_context_length(hp["max_position_embeddings"])
    w.add_embedding_length(hp["hidden_size"])
    w.add_feed_forward_length(hp["intermediate_size"])
    w.add_head_count(hp["num_attention_heads"])
    w.add_head_count_kv(hp["num_key_value_heads"])
    if "rope_theta" in hp:
        w.add_rope_freq_base(hp["rope_theta"])
    w.add_layer_norm_rms_eps(hp["rms_norm_eps"])
    if "head_dim" in hp:
        w.add_key_length(hp["head_dim"])
        w.add_value_length(hp["head_dim"])
    w.add_file_type(ftype)
    if arch == gguf.MODEL_ARCH.LLAMA:
        w.add_vocab_size(hp["vocab_size"])
        w.add_rope_dimension_count(hp.get("head_dim") or hp["hidden_size"] // hp["num_attention_heads"])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    # _set_vocab_gpt2 / get_vocab_base, with the `tokenizers` package in place of
    # transformers' AutoTokenizer (same vocabulary, added tokens and encoding).
    tk = Tokenizer.from_file(str(d / "tokenizer.json"))
    tj = json.loads((d / "tokenizer.json").read_text())
    tc = json.loads((d / "tokenizer_config.json").read_text())
    if arch == gguf.MODEL_ARCH.LLAMA and (aps := tc.get("add_prefix_space")) is not None:
        w.add_add_space_prefix(aps)
    vocab = tk.get_vocab(with_added_tokens=True)
    n_vocab = hp.get("vocab_size", len(vocab))
    reverse = {i: t for t, i in vocab.items()}
    added = {a["content"]: a for a in tj["added_tokens"]}
    chktxt, table = pre_table(args.llama_cpp)
    chkhsh = sha256(str(tk.encode(chktxt).ids).encode()).hexdigest()
    if chkhsh not in table:
        raise SystemExit(f"pre-tokenizer hash {chkhsh} is not in llama.cpp's table")
    toks, types = [], []
    for i in range(n_vocab):
        if i not in reverse:
            toks.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
            continue
        t = reverse[i]
        if t in added:
            if added[t]["special"] or looks_special(t):
                types.append(gguf.TokenType.CONTROL)
            else:
                types.append(gguf.TokenType.USER_DEFINED)
        else:
            types.append(gguf.TokenType.NORMAL)
        toks.append(t)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(table[chkhsh])
    w.add_token_list(toks)
    w.add_token_types(types)
    gguf.SpecialVocab(d, load_merges=True, n_vocab=len(toks)).add_to_gguf(w, quiet=True)
    if arch == gguf.MODEL_ARCH.LLAMA and hp.get("vocab_size", 32000) == 49152:
        w.add_add_bos_token(False)

    # prepare_tensors: names from the gguf map, q/k permuted for LLaMA, types by the rules.
    tmap = gguf.get_tensor_name_map(arch, n_layer)
    for name, path in tensors(d):
        if name.endswith((".attention.masked_bias", ".attention.bias", ".rotary_emb.inv_freq")):
            continue
        data = load_tensor(path, name)
        if data.dtype not in (np.float16, np.float32):
            data = data.astype(np.float32)
        if arch == gguf.MODEL_ARCH.LLAMA:
            if name.endswith("q_proj.weight"):
                data = permute(data, hp["num_attention_heads"], hp["num_attention_heads"])
            elif name.endswith("k_proj.weight"):
                data = permute(data, hp["num_attention_heads"], hp["num_key_value_heads"])
        new = tmap.get_name(name, try_suffixes=(".weight", ".bias"))
        if new is None:
            raise SystemExit(f"cannot map tensor {name!r}")
        t = qtype
        if data.ndim <= 1 or new.endswith("_norm.weight") or new[-7:] != ".weight":
            t = gguf.GGMLQuantizationType.F32
        try:
            q = gguf.quants.quantize(np.ascontiguousarray(data), t)
        except gguf.QuantError:
            t = gguf.GGMLQuantizationType.F16
            q = gguf.quants.quantize(np.ascontiguousarray(data), t)
        w.add_tensor(new, q, raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
