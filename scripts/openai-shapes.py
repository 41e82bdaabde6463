#!/usr/bin/env python3
"""Validates server bodies with the official `openai` package's response types (issue 37).

Input on stdin: one JSON object a line, {"kind": K, "body": B}, K one of "chat" (a whole
chat reply), "chat.chunk" (one streamed chat chunk), "completion" (a whole completion
reply; streamed completion chunks are not fed: the package reads them with its `Completion`
type unvalidated, whose `finish_reason` is not nullable though every chunk but the last has
null there). Each body is parsed with
the package's pydantic model (`ChatCompletion`, `ChatCompletionChunk`, `Completion`), which
checks every field it declares: types, required fields, the `finish_reason` and `role`
literals, tool-call entries. Extra fields are allowed, as the package allows them.

Prints `ok N` and exits 0 when every body parses; otherwise prints each failure (line
number, kind, the first errors) and exits 1. Used by crates/server/tests/openai_shapes.rs
beside its own schema (tests/fixtures/openai-shapes.json), as a second, independent reading
of the same API.
"""
import json
import sys

from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

MODELS = {"chat": ChatCompletion, "chat.chunk": ChatCompletionChunk, "completion": Completion}


def main() -> int:
    n, bad = 0, 0
    for i, line in enumerate(sys.stdin, 1):
        if not line.strip():
            continue
        item = json.loads(line)
        model = MODELS[item["kind"]]
        n += 1
        try:
            model.model_validate(item["body"], strict=False)
        except Exception as e:  # pydantic.ValidationError, reported as text
            bad += 1
            print(f"line {i} ({item['kind']}): {str(e).splitlines()[:6]}")
    if bad:
        print(f"{bad} of {n} bodies do not parse")
        return 1
    print(f"ok {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
