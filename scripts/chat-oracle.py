#!/usr/bin/env python3
"""Writes crates/tokenizer/tests/fixtures/chat/hf-compat.jsonl: small chat templates that
exercise whitespace control and HF's Jinja additions, rendered by HF transformers itself
(`transformers.utils.chat_template_utils.render_jinja_template`), so minfer's renderer is
checked against HF's, not against itself.

Needs transformers==5.24.0 and jinja2==3.1.6 (the versions of /work/shared/oracle/chat);
they are not in scripts/requirements.txt because nothing else needs them. Example:
    python3 -m venv /tmp/oracle && /tmp/oracle/bin/pip install -r scripts/requirements-chat-oracle.txt
    /tmp/oracle/bin/python scripts/chat-oracle.py
"""
import json
import pathlib

import jinja2
import transformers
from transformers.utils.chat_template_utils import render_jinja_template

OUT = pathlib.Path(__file__).resolve().parent.parent / "crates/tokenizer/tests/fixtures/chat/hf-compat.jsonl"

# Block tags on their own, indented lines and no `-` markers: the output depends on
# trim_blocks (newline after a tag) and lstrip_blocks (indent before a tag).
WHITESPACE = """{% for message in messages %}
  {% if message['role'] == 'system' %}
<<SYS>>
{{ message['content'] }}
<</SYS>>
  {% elif message['role'] == 'user' %}
[INST] {{ message['content'] | trim }} [/INST]
  {% else %}
 {{ message['content'] }}{{ eos_token }}
  {% endif %}
{% endfor %}
{% if add_generation_prompt %}
ASSISTANT:
{% endif %}
"""

# HF additions and Python behaviour: namespace, loop controls and loop fields, dict methods,
# str methods, `is none`, Python str() of values, tojson variants, reasoning-field aliasing.
COMPAT = """{%- set ns = namespace(last_user=-1) %}
{%- for m in messages %}
{%- if m.role == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}
{%- endfor %}
{%- for m in messages %}
{%- if loop.index0 > 6 %}{% break %}{% endif %}
{%- if m.role == 'skip' %}{% continue %}{% endif %}
<{{ m.role }}|{{ loop.index }}/{{ loop.length }}|{{ loop.first }}|{{ loop.last }}>
{{ m.content }}|{{ m.content is none }}|{{ m.get('name', 'anon') }}|{{ m.thinking }}|{{ m.reasoning_content }}
{%- if m.tool_calls %}{% for tc in m.tool_calls %}
call {{ tc.function.name }} {{ tc.function.arguments | tojson }}
{{ tc.function.arguments | tojson(indent=2) }}
{{ tc.function.arguments | tojson(sort_keys=true, separators=(',', ':')) }}
{{ tc.function.arguments | tojson(ensure_ascii=true) }}
{{ tc.function.arguments }}
{%- endfor %}{% endif %}
{%- if m.content is string %}
{{ m.content.strip().title() }} {{ m.content.split(' ') }} {{ m.content.startswith('He') }} {{ m.content | length }} {{ m.content | tojson }}
{%- endif %}
{%- endfor %}
tools={{ tools | tojson }}
{{ tools }}
docs={% if documents %}{% for d in documents %}[{{ d.title }}: {{ d.text }}]{% endfor %}{% endif %}

{{ 1.5 }} {{ 10 / 4 }} {{ 7 // 2 }} {{ 2 ** 10 }} {{ [1, 'a', none, true, 1.0] }} {{ {'k': 'v'} }} {{ 'x' ~ 1 }}
{{ dict(a=1, b=[2]) | tojson }} {{ none }} {{ true }} {{ undefined_name }}|{{ bos_token }}
{{ {'f': 1e20, 'g': 0.1, 'h': -0.0, 'i': 12345678901234567890, 'j': 1e-7, 'k': 100.0} | tojson }}
{%- for k, v in {'b': 1, 'a': 2}.items() %} {{ k }}={{ v }}{% endfor %}
last_user={{ ns.last_user }}
{%- if add_generation_prompt %}
GEN{% endif %}"""

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather <now> & 'later' é",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "maximum": 1.5e3}},
                    "required": ["city"]}}},
]

CONV = [
    {"role": "system", "content": "You are   terse.\n"},
    {"role": "user", "content": " hello world "},
    {"role": "assistant", "content": "Hi.", "reasoning_content": "be nice"},
    {"role": "skip", "content": "never shown"},
    {"role": "user", "content": "Hello <&>'\"\\\n\t\u0001 é 😀 \u2028", "name": "bob"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather",
         "arguments": {"city": "Zürich", "days": 3, "ratio": 0.25, "flags": [True, None], "nested": {"z": 1, "a": []}}}}]},
    {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": "{\"t\": 18}", "extra_field": [1, 2]},
    {"role": "user", "content": "after the break"},
]

CASES = [
    dict(name="whitespace_gen", template=WHITESPACE,
         messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "  Hi  "},
                   {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}],
         tools=None, documents=None, add_generation_prompt=True, kwargs={"eos_token": "</s>"}),
    dict(name="whitespace_nogen", template=WHITESPACE,
         messages=[{"role": "user", "content": "one"}, {"role": "assistant", "content": "two"}],
         tools=None, documents=None, add_generation_prompt=False, kwargs={"eos_token": "</s>"}),
    dict(name="compat_tools_docs_gen", template=COMPAT, messages=CONV, tools=TOOLS,
         documents=[{"title": "A", "text": "alpha"}, {"title": "B", "text": "beta"}],
         add_generation_prompt=True, kwargs={"bos_token": "<s>"}),
    dict(name="compat_plain_nogen", template=COMPAT, messages=CONV[:3], tools=None, documents=None,
         add_generation_prompt=False, kwargs={}),
]


def main():
    lines = []
    for case in CASES:
        rendered = render_jinja_template(
            conversations=[case["messages"]], tools=case["tools"], documents=case["documents"],
            chat_template=case["template"], add_generation_prompt=case["add_generation_prompt"], **case["kwargs"],
        )[0][0]
        lines.append(json.dumps({**case, "rendered": rendered,
                                 "generator": f"transformers {transformers.__version__}, jinja2 {jinja2.__version__}"}))
    OUT.write_text("\n".join(lines) + "\n")
    print(f"wrote {len(lines)} cases to {OUT}")


if __name__ == "__main__":
    main()
