"""Drives a running `minfer serve` with the official `openai` package.

Run by crates/cli/tests/serve_openai.rs:

    openai_client.py BASE_URL [--model-kind smol|qwen] [--only tools]

BASE_URL is the server's root (http://127.0.0.1:PORT). Each check prints `ok <name>`; the
first failed assertion ends the script with a traceback and a non-zero status.
"""

import argparse
import json
import sys
import urllib.request

import openai
from openai import OpenAI

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city name."}},
            "required": ["city"],
        },
    },
}
TOOL_MESSAGES = [
    {"role": "user", "content": "What is the weather in Paris right now? Use the tool."}
]
GREEDY = {"temperature": 0, "seed": 1}


def ok(name):
    print(f"ok {name}", flush=True)


def check_usage(u, prompt=None, completion=None):
    assert u is not None, "no usage"
    assert u.prompt_tokens > 0, u
    assert u.completion_tokens >= 0, u
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens, u
    if prompt is not None:
        assert u.prompt_tokens == prompt, (u, prompt)
    if completion is not None:
        assert u.completion_tokens == completion, (u, completion)


def tokenize(base, text):
    req = urllib.request.Request(
        base + "/tokenize",
        data=json.dumps({"content": text, "add_special": True}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)["tokens"]


def collect_stream(stream, n=1):
    """Text, finish reasons, tool calls and usage of a streamed chat, per choice."""
    text = [""] * n
    finish = [None] * n
    roles = [None] * n
    calls = [{} for _ in range(n)]
    usage = None
    logprobs = [[] for _ in range(n)]
    for chunk in stream:
        assert chunk.object == "chat.completion.chunk", chunk
        if chunk.usage is not None:
            assert chunk.choices == [], "the usage chunk has no choices"
            assert usage is None, "one usage chunk"
            usage = chunk.usage
            continue
        for c in chunk.choices:
            i = c.index
            assert finish[i] is None, f"choice {i}: a chunk after its finish"
            d = c.delta
            if roles[i] is None:
                assert d.role == "assistant", f"choice {i}: the first delta is the role: {d}"
                roles[i] = d.role
            if d.content:
                text[i] += d.content
            for tc in d.tool_calls or []:
                acc = calls[i].setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                if tc.id:
                    acc["id"] = tc.id
                if tc.function is not None:
                    acc["name"] += tc.function.name or ""
                    acc["arguments"] += tc.function.arguments or ""
            if c.logprobs is not None and c.logprobs.content:
                logprobs[i].extend(c.logprobs.content)
            if c.finish_reason is not None:
                finish[i] = c.finish_reason
    assert all(r == "assistant" for r in roles), roles
    assert all(f is not None for f in finish), finish
    return {
        "text": text,
        "finish": finish,
        "calls": [[calls[i][k] for k in sorted(calls[i])] for i in range(n)],
        "usage": usage,
        "logprobs": logprobs,
    }


def chat_basic(client):
    req = dict(
        model="minfer",
        messages=[{"role": "user", "content": "Name three colours."}],
        max_tokens=16,
        **GREEDY,
    )
    r = client.chat.completions.create(**req)
    assert r.object == "chat.completion", r
    assert len(r.choices) == 1
    c = r.choices[0]
    assert c.index == 0
    assert c.message.role == "assistant"
    assert isinstance(c.message.content, str) and c.message.content, c
    assert c.finish_reason in ("stop", "length"), c.finish_reason
    check_usage(r.usage)
    assert r.usage.completion_tokens <= 16
    if c.finish_reason == "length":
        assert r.usage.completion_tokens == 16, r.usage
    ok("chat")

    s = collect_stream(
        client.chat.completions.create(
            stream=True, stream_options={"include_usage": True}, **req
        )
    )
    assert s["text"][0] == c.message.content, (s["text"][0], c.message.content)
    assert s["finish"][0] == c.finish_reason, (s["finish"], c.finish_reason)
    check_usage(s["usage"], r.usage.prompt_tokens, r.usage.completion_tokens)
    ok("chat stream == non-stream (greedy), include_usage")

    # Without include_usage no usage chunk is sent.
    s = collect_stream(client.chat.completions.create(stream=True, **req))
    assert s["usage"] is None
    assert s["text"][0] == c.message.content
    ok("chat stream without usage")


def chat_logprobs(client):
    r = client.chat.completions.create(
        model="minfer",
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=6,
        logprobs=True,
        top_logprobs=3,
        **GREEDY,
    )
    c = r.choices[0]
    content = c.logprobs.content
    assert len(content) == r.usage.completion_tokens, (len(content), r.usage)
    for e in content:
        assert isinstance(e.token, str)
        assert e.logprob <= 0.0, e
        assert isinstance(e.bytes, list)
        assert len(e.top_logprobs) == 3, e
        lps = [t.logprob for t in e.top_logprobs]
        assert lps == sorted(lps, reverse=True), lps
        # Greedy: the token taken is the most likely one.
        assert e.top_logprobs[0].token == e.token, e
        assert abs(e.top_logprobs[0].logprob - e.logprob) < 1e-4, e
    ok("chat logprobs + top_logprobs")

    # Streamed, the same entries arrive across the chunks.
    s = collect_stream(
        client.chat.completions.create(
            model="minfer",
            messages=[{"role": "user", "content": "Say hello."}],
            max_tokens=6,
            logprobs=True,
            top_logprobs=3,
            stream=True,
            **GREEDY,
        )
    )
    got = [(e.token, round(e.logprob, 3)) for e in s["logprobs"][0]]
    want = [(e.token, round(e.logprob, 3)) for e in content]
    assert got == want, (got, want)
    ok("chat logprobs streamed")


def chat_n(client):
    r = client.chat.completions.create(
        model="minfer",
        messages=[{"role": "user", "content": "Tell me a word."}],
        max_tokens=8,
        n=3,
        temperature=0.9,
        seed=5,
    )
    assert sorted(c.index for c in r.choices) == [0, 1, 2], r.choices
    for c in r.choices:
        assert isinstance(c.message.content, str)
        assert c.finish_reason in ("stop", "length")
    check_usage(r.usage)
    assert r.usage.completion_tokens <= 24
    ok("chat n=3")

    s = collect_stream(
        client.chat.completions.create(
            model="minfer",
            messages=[{"role": "user", "content": "Tell me a word."}],
            max_tokens=8,
            n=3,
            temperature=0.9,
            seed=5,
            stream=True,
            stream_options={"include_usage": True},
        ),
        n=3,
    )
    check_usage(s["usage"], r.usage.prompt_tokens)
    # Same seed, same choices: each choice is reproducible.
    assert s["text"] == [c.message.content for c in sorted(r.choices, key=lambda c: c.index)], (
        s["text"],
        [c.message.content for c in r.choices],
    )
    ok("chat n=3 streamed")


def completions(client, base):
    req = dict(model="minfer", max_tokens=8, **GREEDY)
    r = client.completions.create(prompt="The capital of France is", **req)
    assert r.object == "text_completion"
    assert len(r.choices) == 1 and isinstance(r.choices[0].text, str)
    assert r.choices[0].finish_reason in ("stop", "length")
    check_usage(r.usage)
    one = r
    ok("completions: string prompt")

    r = client.completions.create(prompt=["The capital of France is", "1, 2, 3,"], **req)
    assert [c.index for c in r.choices] == [0, 1], r.choices
    assert r.choices[0].text == one.choices[0].text, (r.choices[0].text, one.choices[0].text)
    check_usage(r.usage)
    assert r.usage.prompt_tokens > one.usage.prompt_tokens
    ok("completions: list of prompts")

    ids = tokenize(base, "The capital of France is")
    r = client.completions.create(prompt=ids, **req)
    assert r.choices[0].text == one.choices[0].text, (r.choices[0].text, one.choices[0].text)
    check_usage(r.usage, prompt=len(ids))
    ok("completions: token ids")

    r = client.completions.create(prompt=[ids, ids[:-1]], **req)
    assert len(r.choices) == 2 and r.choices[0].text == one.choices[0].text
    ok("completions: lists of token ids")

    r = client.completions.create(prompt="The capital of France is", logprobs=2, **req)
    lp = r.choices[0].logprobs
    k = r.usage.completion_tokens
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == k, lp
    assert len(lp.text_offset) == k
    assert all(x <= 0.0 for x in lp.token_logprobs), lp.token_logprobs
    assert all(1 <= len(t) <= 2 for t in lp.top_logprobs), lp.top_logprobs
    assert lp.text_offset == sorted(lp.text_offset)
    assert "".join(lp.tokens) == r.choices[0].text, (lp.tokens, r.choices[0].text)
    ok("completions: logprobs")

    chunks = list(
        client.completions.create(
            prompt="The capital of France is",
            stream=True,
            stream_options={"include_usage": True},
            **req,
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == one.choices[0].text, (text, one.choices[0].text)
    assert chunks[-1].usage is not None and chunks[-1].choices == []
    check_usage(chunks[-1].usage, one.usage.prompt_tokens, one.usage.completion_tokens)
    ok("completions: stream == non-stream, include_usage")


def errors(client):
    try:
        client.chat.completions.create(
            model="minfer",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=2,
            top_p=7,
        )
    except openai.BadRequestError as e:
        assert e.status_code == 400, e.status_code
        assert e.param == "top_p", (e.param, e.body)
        assert e.type == "invalid_request_error", e.type
        assert "top_p" in str(e), str(e)
    else:
        raise AssertionError("top_p 7 was accepted")
    try:
        client.completions.create(model="minfer", prompt="hi", max_tokens=2, logprobs=21)
    except openai.BadRequestError as e:
        assert e.param == "logprobs", e.body
    else:
        raise AssertionError("logprobs 21 was accepted")
    ok("errors: BadRequestError naming the field")


def check_call(call, names):
    assert call["id"], call
    assert call["name"] in names, call
    args = json.loads(call["arguments"])
    assert isinstance(args, dict), call
    return args


def message_calls(m):
    out = []
    for tc in m.tool_calls or []:
        assert tc.type == "function", tc
        out.append({"id": tc.id, "name": tc.function.name, "arguments": tc.function.arguments})
    return out


def tools(client, kind):
    req = dict(model="minfer", messages=TOOL_MESSAGES, tools=[WEATHER], max_tokens=64, **GREEDY)
    names = {"get_weather"}
    if kind == "smol":
        # SmolLM2's template renders no tools: every form is refused, naming the field.
        for choice in ("auto", "required"):
            for stream in (False, True):
                try:
                    r = client.chat.completions.create(tool_choice=choice, stream=stream, **req)
                    if stream:
                        list(r)
                except openai.BadRequestError as e:
                    assert e.param in ("tools", "tool_choice"), (e.param, e.body)
                else:
                    raise AssertionError(f"tools with tool_choice {choice} were accepted")
        ok("tools refused on a template without tools (auto, required; stream and not)")
        return

    for choice in ("auto", "required"):
        r = client.chat.completions.create(tool_choice=choice, **req)
        c = r.choices[0]
        calls = message_calls(c.message)
        for call in calls:
            check_call(call, names)
        if calls:
            assert c.finish_reason == "tool_calls", c.finish_reason
        else:
            assert isinstance(c.message.content, str), c.message
        if choice == "required":
            assert calls, f"tool_choice required gave no call: {c.message}"
            args = check_call(calls[0], names)
            assert "city" in args, args
        check_usage(r.usage)
        ok(f"tools: tool_choice {choice} ({len(calls)} calls)")

        s = collect_stream(client.chat.completions.create(tool_choice=choice, stream=True, **req))
        for call in s["calls"][0]:
            check_call(call, names)
        if s["calls"][0]:
            assert s["finish"][0] == "tool_calls", s["finish"]
        if choice == "required":
            assert s["calls"][0], s
        # Greedy: the stream makes the same calls.
        assert [(x["name"], json.loads(x["arguments"])) for x in s["calls"][0]] == [
            (x["name"], json.loads(x["arguments"])) for x in calls
        ], (s["calls"], calls)
        ok(f"tools: tool_choice {choice} streamed")

    named = {"type": "function", "function": {"name": "get_weather"}}
    r = client.chat.completions.create(tool_choice=named, **req)
    calls = message_calls(r.choices[0].message)
    assert calls and calls[0]["name"] == "get_weather", r.choices[0].message
    check_call(calls[0], names)
    ok("tools: named tool_choice")

    # The call goes back as an assistant message with a tool result; the reply is text.
    follow = TOOL_MESSAGES + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": calls[0]["id"],
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": calls[0]["arguments"]},
                }
            ],
        },
        {"role": "tool", "tool_call_id": calls[0]["id"], "content": '{"temp_c": 18}'},
    ]
    r = client.chat.completions.create(
        model="minfer", messages=follow, tools=[WEATHER], max_tokens=24, **GREEDY
    )
    assert r.choices[0].message.role == "assistant"
    ok("tools: a tool result goes back")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("base")
    p.add_argument("--model-kind", default="smol", choices=["smol", "qwen"])
    p.add_argument("--only", choices=["tools"])
    a = p.parse_args()
    base = a.base.rstrip("/")
    client = OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=300)
    print(f"openai {openai.__version__} against {base} ({a.model_kind})", flush=True)
    if a.only != "tools":
        models = client.models.list()
        assert len(models.data) == 1 and models.data[0].id, models
        ok("models")
        chat_basic(client)
        chat_logprobs(client)
        chat_n(client)
        completions(client, base)
        errors(client)
    tools(client, a.model_kind)
    print("all ok", flush=True)


if __name__ == "__main__":
    sys.exit(main())
