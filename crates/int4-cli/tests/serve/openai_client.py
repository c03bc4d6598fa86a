"""Drives `int4 serve` with the real `openai` client; run by tests/serve/main.rs in a throwaway virtualenv.

    openai_client.py BASE_URL MODEL api        chat and completions, streaming and not, a stop string,
                                               max_tokens, logprobs in both shapes, errors
    openai_client.py BASE_URL MODEL kill PID   streams, kills the server (PID) after the first chunk, and
                                               checks that the client sees an error, never a finished stream

Prints one line per check and `ALL OK` at the end; any failure raises (exit status 1).
"""

import os
import signal
import sys

import openai

base, model, mode = sys.argv[1], sys.argv[2], sys.argv[3]
client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=120)
user = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]


def check(name, cond, detail=""):
    if not cond:
        raise AssertionError(f"{name}: {detail}")
    print(f"ok {name}")


def api():
    models = client.models.list()
    check("models", [m.id for m in models.data] == [model], models)

    r = client.chat.completions.create(model=model, messages=user, max_tokens=16, temperature=0)
    c = r.choices[0]
    check("chat answer", "Paris" in c.message.content and c.message.role == "assistant", r)
    check("chat finish", c.finish_reason in ("stop", "length"), c.finish_reason)
    check("chat usage", r.usage.prompt_tokens > 5 and 0 < r.usage.completion_tokens <= 16, r.usage)
    greedy = c.message.content

    chunks = list(
        client.chat.completions.create(
            model=model, messages=user, max_tokens=16, temperature=0, stream=True, stream_options={"include_usage": True}
        )
    )
    deltas = [ch.choices[0].delta for ch in chunks if ch.choices]
    check("chat stream role first", deltas[0].role == "assistant", deltas[0])
    text = "".join(d.content or "" for d in deltas)
    check("chat stream text equals the non-streamed", text == greedy, (text, greedy))
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    check("chat stream one finish reason, last", len(finishes) == 1 and chunks[-2].choices[0].finish_reason, chunks[-2])
    check("chat stream usage chunk", chunks[-1].usage is not None and chunks[-1].choices == [], chunks[-1])
    check("chat stream usage counts", chunks[-1].usage.completion_tokens == r.usage.completion_tokens, chunks[-1].usage)

    r = client.chat.completions.create(model=model, messages=user, max_tokens=3, temperature=0)
    check("max_tokens", r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 3, r)
    r = client.chat.completions.create(model=model, messages=user, max_completion_tokens=2, temperature=0)
    check("max_completion_tokens", r.usage.completion_tokens == 2, r.usage)

    stop = greedy[2:5]
    r = client.chat.completions.create(model=model, messages=user, max_tokens=16, temperature=0, stop=[stop])
    check("stop string", r.choices[0].finish_reason == "stop" and r.choices[0].message.content == greedy[: greedy.index(stop)], r)

    r = client.chat.completions.create(model=model, messages=user, max_tokens=4, temperature=0, logprobs=True, top_logprobs=3)
    lp = r.choices[0].logprobs.content
    check("chat logprobs", len(lp) == 4 and all(len(t.top_logprobs) == 3 and t.logprob <= 0 for t in lp), lp)
    check("chat logprobs greedy is the top", all(t.top_logprobs[0].logprob == t.logprob for t in lp), lp)

    r = client.chat.completions.create(
        model=model, messages=user, max_tokens=8, temperature=0.8, top_p=0.9, seed=5,
        extra_body={"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1},
    )
    r2 = client.chat.completions.create(
        model=model, messages=user, max_tokens=8, temperature=0.8, top_p=0.9, seed=5,
        extra_body={"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1},
    )
    check("seeded sampling repeats", r.choices[0].message.content == r2.choices[0].message.content, (r, r2))

    r = client.completions.create(model=model, prompt="The capital of France is", max_tokens=5, temperature=0, logprobs=2)
    c = r.choices[0]
    check("completion", r.object == "text_completion" and len(c.text) > 0, r)
    check("completion logprobs", len(c.logprobs.tokens) == 5 and all(len(t) == 2 for t in c.logprobs.top_logprobs), c.logprobs)
    check("completion text offsets", c.logprobs.text_offset[0] == 0 and c.logprobs.text_offset == sorted(c.logprobs.text_offset), c.logprobs)
    text = "".join(
        ch.choices[0].text
        for ch in client.completions.create(model=model, prompt="The capital of France is", max_tokens=5, temperature=0, stream=True)
        if ch.choices
    )
    check("completion stream text equals the non-streamed", text == c.text, (text, c.text))
    r = client.completions.create(model=model, prompt=["One, two,", "Red, green,"], max_tokens=3, temperature=0)
    check("two prompts, two choices", sorted(ch.index for ch in r.choices) == [0, 1] and r.usage.completion_tokens == 6, r)
    ids = client.completions.create(model=model, prompt=[504, 3458, 282], max_tokens=2, temperature=0)
    check("token-id prompt", ids.usage.prompt_tokens == 3, ids.usage)

    for name, call, status, param in [
        ("n > 1", lambda: client.chat.completions.create(model=model, messages=user, n=2), 400, "n"),
        ("json schema", lambda: client.chat.completions.create(model=model, messages=user, response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}), 400, "response_format"),
        ("negative temperature", lambda: client.chat.completions.create(model=model, messages=user, temperature=-1), 400, "temperature"),
        ("empty messages", lambda: client.chat.completions.create(model=model, messages=[]), 400, "messages"),
        ("context exceeded", lambda: client.chat.completions.create(model=model, messages=user, max_tokens=10_000_000), 400, "max_tokens"),
        ("unknown model", lambda: client.chat.completions.create(model="nope", messages=user), 404, "model"),
    ]:
        try:
            call()
            raise AssertionError(f"{name}: no error")
        except openai.APIStatusError as e:
            check(f"error: {name}", e.status_code == status and e.body.get("param") == param and e.body.get("message"), (e.status_code, e.body))
    print("ALL OK")


def kill(pid):
    stream = client.completions.create(
        model=model, prompt="Once upon a time", max_tokens=2000, temperature=0, stream=True, extra_body={"ignore_eos": True}
    )
    seen = 0
    try:
        for chunk in stream:
            seen += 1
            if seen == 1:
                os.kill(pid, signal.SIGKILL)
        raise AssertionError(f"the stream ended as if finished after {seen} chunks")
    except (openai.APIError, Exception) as e:  # httpx's protocol errors surface as they are
        if isinstance(e, AssertionError):
            raise
        check("killed mid-stream: the client sees an error", seen >= 1, f"{type(e).__name__}: {e}")
    print("ALL OK")


if mode == "api":
    api()
elif mode == "kill":
    kill(int(sys.argv[4]))
else:
    raise SystemExit(f"unknown mode {mode}")
