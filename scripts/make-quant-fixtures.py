#!/usr/bin/env python3
"""Writes the GGML quantization fixtures that crates/gguf/tests/quants.rs checks against.

The oracle is gguf-py (`gguf.quants`, pinned in scripts/requirements.txt): minfer's
dequantization must be bit-identical to `gguf.quants.dequantize`, and its quantization
byte-identical to `gguf.quants.quantize` for every type gguf-py can quantize.

Run with the project venv:  "$(scripts/venv)" scripts/make-quant-fixtures.py

Output (crates/gguf/tests/fixtures/quants/):
  MANIFEST                   one line per fixture: kind, type, counts, FNV-1a 64 of the expected output
  dequant/<TYPE>.blocks      seeded random blocks (scales: random finite f16 bit patterns + edge values)
  dequant/<TYPE>.f32         gguf-py's dequantization, little-endian f32: all of it for types with
                             blocks of <= 32 elements, the first HEAD_BLOCKS blocks for 256-element
                             types (the rest is covered by the hash, to keep the fixtures small)
  quant/input.f32            f32 rows with edge cases (zeros, -0.0, one huge value, negative max,
                             ties, constant blocks, tiny values) followed by random rows
  quant/special.f32          extra float edge values (inf, f16 overflow/subnormal ties, bf16 ties),
                             appended to input.f32 for the F16 and BF16 cases only
  quant/<TYPE>.blocks        gguf-py's quantization of the input
"""

from __future__ import annotations

import sys
from importlib.metadata import version
from pathlib import Path

import numpy as np
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "crates" / "gguf" / "tests" / "fixtures" / "quants"
SEED = 0x6D696E66  # "minf"
N_BLOCKS = 1000
N_FLOAT_ELEMS = 32768
HEAD_BLOCKS = 16
N_QUANT_ROWS = 512  # rows of 32 elements

# Byte offsets of the f16 scale fields (d, dmin/m) inside each block. Everything else in a
# block is bit-packed quants or sub-scales where every bit pattern is valid.
SCALE_OFFSETS = {
    T.Q4_0: [0],
    T.Q4_1: [0, 2],
    T.Q5_0: [0],
    T.Q5_1: [0, 2],
    T.Q8_0: [0],
    T.Q2_K: [80, 82],
    T.Q3_K: [108],
    T.Q4_K: [0, 2],
    T.Q5_K: [0, 2],
    T.Q6_K: [208],
    T.IQ4_NL: [0],
    T.IQ4_XS: [0],
}

# f16 scale values forced into the first blocks: +0, -0, smallest subnormal, largest
# subnormal, smallest normal, 1.0, largest finite, its negative.
EDGE_F16 = [0x0000, 0x8000, 0x0001, 0x03FF, 0x0400, 0x3C00, 0x7BFF, 0xFBFF]


def fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def finite_f16_bits(rng: np.random.Generator, n: int) -> np.ndarray:
    bits = rng.integers(0, 0x10000, size=n, dtype=np.uint32).astype(np.uint16)
    inf_or_nan = (bits & 0x7C00) == 0x7C00
    # Clear the exponent's top bit: still random, now finite.
    bits[inf_or_nan] &= np.uint16(0xBFFF)
    return bits


def dequant_blocks(qtype: T, rng: np.random.Generator) -> np.ndarray:
    _, type_size = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(N_BLOCKS, type_size), dtype=np.uint8)
    for off in SCALE_OFFSETS[qtype]:
        scales = finite_f16_bits(rng, N_BLOCKS)
        scales[: len(EDGE_F16)] = EDGE_F16
        blocks[:, off : off + 2] = scales.view(np.uint8).reshape(N_BLOCKS, 2)
    return blocks


def quant_input(rng: np.random.Generator) -> np.ndarray:
    rows = []
    rows.append(np.zeros(32, np.float32))                       # all zeros
    rows.append(np.full(32, -0.0, np.float32))                  # all negative zeros
    r = rng.standard_normal(32).astype(np.float32); r[7] = 1e30; rows.append(r)    # one huge value
    r = rng.standard_normal(32).astype(np.float32) * 1e-3; r[3] = 6e4; rows.append(r)
    r = rng.uniform(-1, 1, 32).astype(np.float32); r[10] = -5.0; rows.append(r)    # negative max
    r = rng.uniform(-1, 1, 32).astype(np.float32); r[2] = 3.0; r[20] = -3.0; rows.append(r)  # tie: + first
    r = rng.uniform(-1, 1, 32).astype(np.float32); r[2] = -3.0; r[20] = 3.0; rows.append(r)  # tie: - first
    rows.append(np.full(32, 0.37, np.float32))                  # constant: max == min
    rows.append(np.full(32, -2.5, np.float32))
    # Rounding ties: amax 127 gives d == 1 for Q8_0, so x.5 values hit roundf's tie rule.
    r = np.array([127.0] + [(k - 15) + 0.5 for k in range(31)], np.float32); rows.append(r)
    # max -8 gives d == 1 for Q4_0 (and -16 ... for Q5_0 below): trunc(x + 8.5) ties.
    r = np.array([-8.0] + [((k % 16) - 8) + 0.5 for k in range(31)], np.float32); rows.append(r)
    r = np.array([-16.0] + [((k % 32) - 16) + 0.5 for k in range(31)], np.float32); rows.append(r)
    r = np.arange(32, dtype=np.float32) / 2; rows.append(r)    # Q4_1/Q5_1 grid points
    r = np.arange(32, dtype=np.float32) - 16; rows.append(r)
    rows.append((rng.standard_normal(32) * 1e-30).astype(np.float32))   # tiny: f16 scale underflows
    rows.append((rng.standard_normal(32) * 1e-6).astype(np.float32))    # f16 scale subnormal
    r = np.zeros(32, np.float32); r[31] = -1.0; rows.append(r)          # single value, last
    r = np.zeros(32, np.float32); r[0] = 1e-3; rows.append(r)
    while len(rows) < N_QUANT_ROWS:
        kind = len(rows) % 4
        scale = np.float32(10.0 ** rng.uniform(-4, 4))
        if kind == 0:
            r = rng.standard_normal(32) * scale
        elif kind == 1:
            r = rng.uniform(-1, 1, 32) * scale
        elif kind == 2:
            r = rng.uniform(0, 1, 32) * scale + rng.uniform(-1, 1) * scale  # shifted: exercises min
        else:
            r = rng.standard_normal(32) * scale
            r[rng.integers(0, 32)] *= 50  # outlier
        rows.append(r.astype(np.float32))
    return np.stack(rows).astype(np.float32)


def special_floats(rng: np.random.Generator) -> np.ndarray:
    vals = [
        0.0, -0.0, np.inf, -np.inf, 65504.0, -65504.0, 65519.0, 65520.0, 1e5, -1e5,
        2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -26, 2.0 ** -26, 2.0 ** -14, 2.0 ** -14 - 2.0 ** -25,
        1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11, 1e-45, -1e-45, 3.4028234663852886e38,
    ]
    arr = np.array(vals, dtype=np.float32)
    # bf16 ties (exactly half an ulp, even and odd) and near-ties.
    tie_bits = np.array([0x3F808000, 0x3F818000, 0x3F808001, 0x3F817FFF, 0xBF808000, 0x00008000],
                        dtype=np.uint32)
    # Random finite f32 bit patterns over the whole range.
    rnd = rng.integers(0, 2 ** 32, size=2048 - len(arr) - len(tie_bits), dtype=np.uint64).astype(np.uint32)
    rnd = rnd[(rnd & 0x7F800000) != 0x7F800000]
    out = np.concatenate([arr.view(np.uint32), tie_bits, rnd]).view(np.float32)
    pad = (-len(out)) % 32
    return np.concatenate([out, np.zeros(pad, np.float32)])


def main() -> int:
    rng = np.random.default_rng(SEED)
    (OUT / "dequant").mkdir(parents=True, exist_ok=True)
    (OUT / "quant").mkdir(parents=True, exist_ok=True)
    manifest = []

    # ---- dequantization -------------------------------------------------------------
    float_cases = {
        T.F16: finite_f16_bits(rng, N_FLOAT_ELEMS).view(np.uint8),
        T.BF16: rng.integers(0, 0x10000, size=N_FLOAT_ELEMS, dtype=np.uint32).astype(np.uint16).view(np.uint8),
    }
    for qtype, raw in float_cases.items():
        out = quants.dequantize(raw, qtype).astype(np.float32, copy=False)
        (OUT / "dequant" / f"{qtype.name}.blocks").write_bytes(raw.tobytes())
        (OUT / "dequant" / f"{qtype.name}.f32").write_bytes(out.tobytes())
        manifest.append(f"dequant {qtype.name} blocks={N_FLOAT_ELEMS} head_blocks={N_FLOAT_ELEMS} "
                        f"fnv1a64={fnv1a64(out.tobytes()):016x}")

    for qtype in SCALE_OFFSETS:
        block_size, _ = GGML_QUANT_SIZES[qtype]
        blocks = dequant_blocks(qtype, rng)
        out = quants.dequantize(blocks, qtype).astype(np.float32, copy=False).reshape(-1)
        assert out.size == N_BLOCKS * block_size
        head = N_BLOCKS if block_size <= 32 else HEAD_BLOCKS
        (OUT / "dequant" / f"{qtype.name}.blocks").write_bytes(blocks.tobytes())
        (OUT / "dequant" / f"{qtype.name}.f32").write_bytes(out[: head * block_size].tobytes())
        manifest.append(f"dequant {qtype.name} blocks={N_BLOCKS} head_blocks={head} "
                        f"fnv1a64={fnv1a64(out.tobytes()):016x}")

    # ---- quantization ----------------------------------------------------------------
    inp = quant_input(rng)
    special = special_floats(rng)
    (OUT / "quant" / "input.f32").write_bytes(inp.tobytes())
    (OUT / "quant" / "special.f32").write_bytes(special.tobytes())
    for qtype in [T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]:
        data = inp
        if qtype in (T.F16, T.BF16):
            data = np.concatenate([inp.reshape(-1), special]).reshape(-1, 32)
        with np.errstate(over="ignore"):
            q = quants.quantize(data, qtype)
        q = np.ascontiguousarray(q).view(np.uint8).reshape(-1)
        (OUT / "quant" / f"{qtype.name}.blocks").write_bytes(q.tobytes())
        manifest.append(f"quant {qtype.name} rows={data.shape[0]} bytes={q.size} "
                        f"fnv1a64={fnv1a64(q.tobytes()):016x}")

    (OUT / "MANIFEST").write_text(
        f"# generated by scripts/make-quant-fixtures.py (gguf-py {version('gguf')}, numpy {np.__version__})\n"
        + "\n".join(manifest) + "\n"
    )
    total = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file())
    print(f"wrote {len(manifest)} fixtures, {total} bytes, under {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
