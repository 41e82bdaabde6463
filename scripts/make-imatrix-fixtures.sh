#!/usr/bin/env bash
# Writes the importance matrices of crates/cli/tests/fixtures/imatrix/ with llama-imatrix
# (the peer build): synth-imatrix.gguf and synth-imatrix.dat (GGUF and legacy formats) for
# the `minfer synth` model of crates/cli/tests/quantize.rs, and demo-imatrix.dat for the demo
# model. The text is a fixed pseudo-random word list; llama-imatrix records its file name
# ("text.txt") as the dataset, so it runs from a scratch directory with that name.
#
# Usage: scripts/make-imatrix-fixtures.sh [path/to/minfer]
# After running it, regenerate the sha256 fixture:
#   MINFER_REGEN_QUANT_FIXTURE=1 cargo test --release -p minfer-cli --test quantize_imatrix -- --test-threads=1
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
minfer=${1:-${CARGO_TARGET_DIR:-$root/target}/release/minfer}
peer=${MINFER_PEER:-$HOME/.cache/minfer/peer}
imatrix=$peer/build/bin/llama-imatrix
demo=$HOME/.cache/minfer/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
out=$root/crates/cli/tests/fixtures/imatrix
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
python3 -c "
import random
random.seed(1)
w = 'the quick brown fox jumps over lazy dog model quantize matrix weight layer token'.split()
print(' '.join(random.choice(w) for _ in range(3000)))" > text.txt
"$minfer" synth --arch qwen2 --layers 8 --embd 256 --heads 4 --kv-heads 1 --ffn 288 \
  --type f16 --seed 7 -o synth.gguf
common=(-f text.txt -c 128 --no-ppl --process-output -t 2)
"$imatrix" -m synth.gguf "${common[@]}" --chunks 4 -o synth-imatrix.gguf >log 2>&1
"$imatrix" -m synth.gguf "${common[@]}" --chunks 4 -o synth-imatrix.dat --output-format dat >log 2>&1
"$imatrix" -m "$demo" "${common[@]}" --chunks 2 -o demo-imatrix.dat --output-format dat >log 2>&1
mkdir -p "$out"
cp synth-imatrix.gguf synth-imatrix.dat demo-imatrix.dat "$out/"
sha256sum "$out"/*
