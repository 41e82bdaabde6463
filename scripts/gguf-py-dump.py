#!/usr/bin/env python3
"""Dump a GGUF file as JSON using the reference reader (gguf-py's GGUFReader).

Used by crates/gguf/tests/python.rs to cross-check minfer's reader. Output:
  {"version", "alignment", "data_offset",
   "kv": [{"key", "value": V}],                      # file order
   "tensors": [{"name", "dims", "type", "offset", "n_bytes", "sha256"}]}
where V is {"t": value type id, "v": scalar} for scalars and
{"t": 9, "et": element type id, "v": [V, ...]} for arrays (nested arrays keep their
structure). Floats are written as the hex of their little-endian IEEE bits ("f32:3fc00000")
so that no decimal round trip can blur a comparison. "offset" is relative to the data section.
"""
import hashlib
import json
import struct
import sys

from gguf import GGUFReader, GGUFValueType

FLOATS = {GGUFValueType.FLOAT32: ("<f", "f32"), GGUFValueType.FLOAT64: ("<d", "f64")}


def scalar(t, part):
    x = part.tolist()[0]
    if t in FLOATS:
        fmt, tag = FLOATS[t]
        return f"{tag}:{struct.pack(fmt, x)[::-1].hex()}"
    if t == GGUFValueType.BOOL:
        return bool(x)
    return int(x)


def decode(parts, i, t):
    """Decodes one value of type t starting at parts[i]; returns (json, next index)."""
    t = GGUFValueType(t)
    if t == GGUFValueType.STRING:
        # parts[i] is the length, parts[i + 1] the bytes.
        return {"t": int(t), "v": bytes(parts[i + 1]).decode("utf-8")}, i + 2
    if t == GGUFValueType.ARRAY:
        et = GGUFValueType(int(parts[i][0]))
        n = int(parts[i + 1][0])
        i += 2
        items = []
        for _ in range(n):
            item, i = decode(parts, i, et)
            items.append(item)
        return {"t": int(t), "et": int(et), "v": items}, i
    return {"t": int(t), "v": scalar(t, parts[i])}, i + 1


def main(path):
    r = GGUFReader(path)
    fields = list(r.fields.values())
    # The first three fields are the reader's pseudo-fields: version, tensor and kv counts.
    version = int(fields[0].parts[0][0])
    kv = []
    for f in fields[3:]:
        # parts: key length, key bytes, value type, then the value's parts.
        value, end = decode(f.parts, 3, int(f.parts[2][0]))
        assert end == len(f.parts), f"{f.name}: {end} of {len(f.parts)} parts decoded"
        kv.append({"key": f.name, "value": value})
    tensors = []
    for t in r.tensors:
        raw = bytes(r.data[t.data_offset : t.data_offset + t.n_bytes])
        tensors.append(
            {
                "name": t.name,
                "dims": [int(d) for d in t.shape],
                "type": int(t.tensor_type),
                "offset": int(t.data_offset - r.data_offset),
                "n_bytes": int(t.n_bytes),
                "sha256": hashlib.sha256(raw).hexdigest(),
            }
        )
    out = {
        "version": version,
        "alignment": int(r.alignment),
        "data_offset": int(r.data_offset),
        "kv": kv,
        "tensors": tensors,
    }
    json.dump(out, sys.stdout, ensure_ascii=False, indent=1)
    print()


if __name__ == "__main__":
    main(sys.argv[1])
