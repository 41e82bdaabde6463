#!/usr/bin/env python3
"""Checks constrained replies against their JSON Schemas with the `jsonschema` package
(Draft 2020-12, formats checked). Input: JSON lines {"schema": path, "text": reply,
"expect": "valid" | "invalid"} on stdin. Prints one line per case that disagrees and a
summary; exits 1 when any case disagrees."""

import json
import sys

import jsonschema

bad = 0
n = 0
for line in sys.stdin:
    case = json.loads(line)
    n += 1
    with open(case["schema"]) as fh:
        schema = json.load(fh)
    why = None
    try:
        value = json.loads(case["text"])
        jsonschema.validate(value, schema, cls=jsonschema.Draft202012Validator,
                            format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    except json.JSONDecodeError as e:
        why = "not JSON: %s" % e
    except jsonschema.ValidationError as e:
        why = "invalid: %s" % e.message
    got = "valid" if why is None else "invalid"
    if got != case["expect"]:
        bad += 1
        print("MISMATCH %s (expected %s, got %s%s): %r" % (
            case["schema"], case["expect"], got, "" if why is None else ": " + why, case["text"]))
print("%d passed, %d failed" % (n - bad, bad))
sys.exit(1 if bad else 0)
