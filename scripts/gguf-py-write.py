#!/usr/bin/env python3
"""Write a GGUF file with the reference writer (gguf-py's GGUFWriter) and print, as JSON in
the format of gguf-py-dump.py (without offsets), what it was asked to write.

Used by crates/gguf/tests/python.rs: minfer's reader must read back exactly this.
"""
import hashlib
import json
import struct
import sys

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter

T = GGUFValueType


def enc(t, x):
    """The dump's JSON form of a value of type t."""
    if t == T.ARRAY:
        et, items = x
        return {"t": int(T.ARRAY), "et": int(et), "v": [enc(et, i) for i in items]}
    if t == T.FLOAT32:
        return {"t": int(t), "v": "f32:" + struct.pack("<f", x)[::-1].hex()}
    if t == T.FLOAT64:
        return {"t": int(t), "v": "f64:" + struct.pack("<d", x)[::-1].hex()}
    return {"t": int(t), "v": x}


def main(path):
    w = GGUFWriter(path, "llama")  # adds general.architecture first
    kv = [("general.architecture", T.STRING, "llama")]

    def add(key, t, x, sub=None):
        if t == T.ARRAY:
            w.add_key_value(key, x[1], T.ARRAY, sub_type=x[0])
        else:
            w.add_key_value(key, x, t)
        kv.append((key, t, x))

    w.add_custom_alignment(64)
    kv.append(("general.alignment", T.UINT32, 64))
    add("py.u8", T.UINT8, 255)
    add("py.i8", T.INT8, -128)
    add("py.u16", T.UINT16, 65535)
    add("py.i16", T.INT16, -32768)
    add("py.u32", T.UINT32, 4294967295)
    add("py.i32", T.INT32, -2147483648)
    add("py.f32", T.FLOAT32, 0.1)
    add("py.bool", T.BOOL, False)
    add("py.string", T.STRING, "naïve 日本語 🦀")
    add("py.u64", T.UINT64, 18446744073709551615)
    add("py.i64", T.INT64, -9223372036854775808)
    add("py.f64", T.FLOAT64, -1e-300)
    add("py.arr.str", T.ARRAY, (T.STRING, ["", "ä", "\u0000x", "end"]))
    add("py.arr.f32", T.ARRAY, (T.FLOAT32, [1.5, -0.0, 3.4028234663852886e38]))
    add("py.arr.bool", T.ARRAY, (T.BOOL, [True, False]))
    add("py.arr.i64", T.ARRAY, (T.INT64, [-1, 1 << 62]))

    rng = np.random.default_rng(7)
    tensors = []

    def tensor(name, arr, dims, ty, raw_dtype=None):
        w.add_tensor(name, arr, raw_dtype=raw_dtype)
        tensors.append(
            {
                "name": name,
                "dims": dims,
                "type": ty,
                "n_bytes": arr.nbytes,
                "sha256": hashlib.sha256(arr.tobytes()).hexdigest(),
            }
        )

    tensor("a.f32", rng.standard_normal((3, 5)).astype(np.float32), [5, 3], 0)
    tensor("b.f16", rng.standard_normal((7,)).astype(np.float16), [7], 1)
    q8 = rng.integers(0, 256, size=(2, 34), dtype=np.uint8)  # two Q8_0 rows of 32
    tensor("c.q8_0", q8, [32, 2], 8, raw_dtype=GGMLQuantizationType.Q8_0)
    tensor("d.i32", np.arange(-3, 3, dtype=np.int32).reshape(1, 2, 3), [3, 2, 1], 26)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    out = {
        "version": 3,
        "alignment": 64,
        "kv": [{"key": k, "value": enc(t, x)} for k, t, x in kv],
        "tensors": tensors,
    }
    json.dump(out, sys.stdout, ensure_ascii=False, indent=1)
    print()


if __name__ == "__main__":
    main(sys.argv[1])
