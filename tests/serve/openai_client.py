"""The official `openai` client against `dsc serve`: completions, chat, streaming, logprobs,
n > 1, stop strings, and OpenAI-style 4xx errors for bad requests (the server keeps serving).

usage: python3 openai_client.py BASE_URL MODEL API_KEY
"""
import json
import sys
import urllib.error
import urllib.request

import openai

base, model, key = sys.argv[1], sys.argv[2], sys.argv[3]
client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
checks = 0


def check(cond, what):
    global checks
    if not cond:
        raise SystemExit(f"FAILED: {what}")
    checks += 1


# models
ids = [m.id for m in client.models.list().data]
check(ids == [model], f"models list {ids}")

# completion, greedy, deterministic
c = client.completions.create(model=model, prompt="The capital of France is", max_tokens=8, temperature=0)
check(c.object == "text_completion" and len(c.choices) == 1, "completion shape")
check("Paris" in c.choices[0].text, f"completion text {c.choices[0].text!r}")
check(c.usage.completion_tokens == 8 and c.choices[0].finish_reason == "length", f"usage {c.usage}")
c2 = client.completions.create(model=model, prompt="The capital of France is", max_tokens=8, temperature=0)
check(c2.choices[0].text == c.choices[0].text, "greedy is deterministic")

# streaming completion reassembles to the same text
parts = []
for ev in client.completions.create(model=model, prompt="The capital of France is", max_tokens=8, temperature=0, stream=True):
    parts.append(ev.choices[0].text)
check("".join(parts) == c.choices[0].text, f"stream {''.join(parts)!r} vs {c.choices[0].text!r}")

# chat, and chat streaming
r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "What is 2+2?"}], max_tokens=24, temperature=0)
text = r.choices[0].message.content
check(r.object == "chat.completion" and r.choices[0].message.role == "assistant" and "4" in text, f"chat {text!r}")
check(r.choices[0].finish_reason in ("stop", "length"), "chat finish reason")
chunks = list(client.chat.completions.create(model=model, messages=[{"role": "user", "content": "What is 2+2?"}], max_tokens=24, temperature=0, stream=True, stream_options={"include_usage": True}))
streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
check(streamed == text, f"chat stream {streamed!r} vs {text!r}")
check(chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0, "stream usage chunk")

# logprobs, n > 1 with a seed, stop strings
r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Say hello."}], max_tokens=5, temperature=0, logprobs=True, top_logprobs=3)
lp = r.choices[0].logprobs.content
check(len(lp) == 5 and all(len(t.top_logprobs) == 3 and t.logprob <= 0 for t in lp), "chat logprobs")
check(all(abs(t.logprob - t.top_logprobs[0].logprob) < 1e-4 for t in lp), "greedy token is the top logprob")
c = client.completions.create(model=model, prompt="Once upon a time", max_tokens=12, temperature=0.9, n=3, seed=7)
check(len(c.choices) == 3 and sorted(ch.index for ch in c.choices) == [0, 1, 2], "n = 3")
c_again = client.completions.create(model=model, prompt="Once upon a time", max_tokens=12, temperature=0.9, n=3, seed=7)
check([ch.text for ch in c.choices] == [ch.text for ch in c_again.choices], "a seed reproduces sampling")
base_text = client.completions.create(model=model, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0).choices[0].text
stop_at = base_text.strip().split(",")[1] if "," in base_text else None
if stop_at:
    s = client.completions.create(model=model, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0, stop=[stop_at.strip()])
    check(s.choices[0].finish_reason == "stop" and stop_at.strip() not in s.choices[0].text, f"stop string {stop_at!r}: {s.choices[0].text!r}")

# a client that disconnects mid-stream is cancelled and its KV blocks freed
import time

stream = client.completions.create(model=model, prompt="Tell me a long story about a dragon.", max_tokens=400, temperature=0, stream=True, extra_body={"ignore_eos": True})
next(iter(stream))
stream.close()
for _ in range(100):
    m = urllib.request.urlopen(base + "/metrics").read().decode()
    if 'dsc_requests_total{reason="cancelled"} 1' in m and "dsc_running_sequences 0" in m:
        break
    time.sleep(0.1)
check('dsc_requests_total{reason="cancelled"} 1' in m and 'dsc_kv_blocks{state="used"} 0' in m, "disconnect cancels and frees blocks: " + "\n".join(l for l in m.splitlines() if l.startswith(("dsc_requests", "dsc_running", "dsc_kv"))))

# bad requests: OpenAI-style errors, right status codes
def status_of(fn):
    try:
        fn()
    except openai.APIStatusError as e:
        return e.status_code, e.body
    return 200, None


code, body = status_of(lambda: client.completions.create(model="no-such-model", prompt="hi", max_tokens=2))
check(code == 404 and body["code"] == "model_not_found", f"unknown model -> {code} {body}")
code, body = status_of(lambda: client.completions.create(model=model, prompt="hi " * 3000, max_tokens=2))
check(code == 400 and body["code"] == "context_length_exceeded", f"long prompt -> {code} {body}")
code, _ = status_of(lambda: client.completions.create(model=model, prompt="hi", max_tokens=10**7))
check(code == 400, "max_tokens too large")
code, _ = status_of(lambda: client.completions.create(model=model, prompt="hi", max_tokens=2, temperature=5))
check(code == 400, "temperature out of range")
code, _ = status_of(lambda: client.completions.create(model=model, prompt="hi", max_tokens=2, top_p=0))
check(code == 400, "top_p = 0")
code, _ = status_of(lambda: openai.OpenAI(base_url=base + "/v1", api_key="wrong", max_retries=0).completions.create(model=model, prompt="hi", max_tokens=2))
check(code == 401, "wrong API key")
def raw(path, data=None):
    req = urllib.request.Request(base + path, data=data, headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


# vLLM's endpoints: the model card with max_model_len, /version, /tokenize and /detokenize
card = client.models.retrieve(model)
check(card.id == model and card.model_extra.get("max_model_len") == 2048, f"models/{model}: {card}")
check(raw("/v1/models/no-such-model")[0] == 404, "an unknown model id is a 404")
code, text = raw("/version")
check(code == 200 and json.loads(text)["version"], f"/version {code} {text}")
code, text = raw("/tokenize", json.dumps({"model": model, "prompt": "The capital of France is"}).encode())
tok = json.loads(text)
check(code == 200 and tok["count"] == len(tok["tokens"]) > 3 and tok["max_model_len"] == 2048, f"/tokenize {code} {text}")
code, text = raw("/detokenize", json.dumps({"model": model, "tokens": tok["tokens"]}).encode())
check(code == 200 and json.loads(text)["prompt"] == "The capital of France is", f"/detokenize {code} {text}")
code, text = raw("/tokenize", json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode())
check(code == 200 and json.loads(text)["count"] > 3, f"/tokenize of messages {code} {text}")
code, text = raw("/detokenize", json.dumps({"tokens": [10**9]}).encode())
check(code == 400 and "vocabulary" in text, f"/detokenize of a bad id {code} {text}")
# logit_bias is honoured: banning the greedy first token changes it; a tokenized prompt is the same prompt
g = client.completions.create(model=model, prompt=tok["tokens"], max_tokens=1, temperature=0, logprobs=1)
first = g.choices[0].text
ids = json.loads(raw("/tokenize", json.dumps({"prompt": first, "add_special_tokens": False}).encode())[1])["tokens"]
b = client.completions.create(model=model, prompt="The capital of France is", max_tokens=1, temperature=0, logit_bias={str(ids[0]): -100})
check(b.choices[0].text != first, f"logit_bias -100 on {ids} ({first!r}) -> {b.choices[0].text!r}")
code, body = status_of(lambda: client.completions.create(model=model, prompt="hi", max_tokens=1, logit_bias={"3": 500}))
check(code == 400 and body["param"] == "logit_bias", f"logit_bias out of range -> {code} {body}")
# what dsc does not do yet is refused by name, never ignored
for what, call in [
    ("best_of", lambda: client.completions.create(model=model, prompt="hi", max_tokens=1, best_of=3)),
    ("echo", lambda: client.completions.create(model=model, prompt="hi", max_tokens=1, echo=True)),
]:
    code, body = status_of(call)
    check(code == 400 and body["param"] == what and "not supported" in body["message"], f"{what} -> {code} {body}")
c = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=2, response_format={"type": "text"}, tools=[], temperature=0)
check(c.choices[0].finish_reason == "length", "a text response_format and no tools are fine")

# structured output: every sample is what the schema says, whole and streamed; a regex on completions
person = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 120}}, "required": ["name", "age"], "additionalProperties": False}


def valid(text):
    try:
        d = json.loads(text)
    except ValueError:
        return False
    return isinstance(d, dict) and set(d) == {"name", "age"} and isinstance(d["name"], str) and len(d["name"]) <= 12 and type(d["age"]) is int and 0 <= d["age"] <= 120


msgs = [{"role": "user", "content": "Describe a person as JSON with a name and an age."}]
r = client.chat.completions.create(model=model, messages=msgs, max_tokens=60, temperature=0.9, n=3, seed=5, response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": person}})
for ch in r.choices:
    check(ch.finish_reason == "stop" and valid(ch.message.content), f"json_schema sample {ch.message.content!r} ({ch.finish_reason})")
parts = [ch.choices[0].delta.content or "" for ch in client.chat.completions.create(model=model, messages=msgs, max_tokens=60, temperature=0, stream=True, response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": person}}) if ch.choices]
check(valid("".join(parts)), f"streamed json_schema {''.join(parts)!r}")
r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "List three colours."}], max_tokens=40, temperature=0, response_format={"type": "json_object"})
obj = r.choices[0].message.content
check(r.choices[0].finish_reason == "stop" and isinstance(json.loads(obj), dict), f"json_object {obj!r}")
code, text = raw("/v1/completions", json.dumps({"model": model, "prompt": "My phone number is", "max_tokens": 12, "temperature": 0, "guided_regex": " [0-9]{3}-[0-9]{4}"}).encode())
import re
t = json.loads(text)["choices"][0]["text"] if code == 200 else text
check(code == 200 and re.fullmatch(r" [0-9]{3}-[0-9]{4}", t), f"guided_regex -> {code} {t!r}")
code, body = status_of(lambda: client.completions.create(model=model, prompt="hi", max_tokens=2, extra_body={"guided_regex": "(["}))
check(code == 400 and body["param"] == "guided_regex", f"a bad regex -> {code} {body}")
code, body = status_of(lambda: client.chat.completions.create(model=model, messages=msgs, max_tokens=2, response_format={"type": "json_schema", "json_schema": {"name": "x"}}))
check(code == 400 and body["param"] == "response_format", f"json_schema without a schema -> {code} {body}")

code, text = raw("/v1/completions", b"{not json")
check(code == 400 and json.loads(text)["error"]["type"] == "invalid_request_error", f"malformed JSON -> {code} {text}")
code, _ = raw("/v1/completions", b"x" * (2 << 20))
check(code == 413, f"oversized body -> {code}")
# still serving
c = client.completions.create(model=model, prompt="The capital of France is", max_tokens=3, temperature=0)
check(c.choices[0].finish_reason == "length", "serves after the bad requests")
check(raw("/health")[0] == 200 and raw("/ready")[0] == 200, "health and ready")
metrics = raw("/metrics")[1]
check("dsc_time_to_first_token_seconds_bucket" in metrics and 'dsc_errors_total{reason="model_not_found"}' in metrics, "metrics")
print(f"openai client: {checks} checks passed")
