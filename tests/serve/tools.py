"""Tool calling with the official `openai` client against `dsc serve` (SmolLM2): a named or
required tool_choice holds the output to a call (Hermes format, by grammar) that comes back as
`tool_calls` with arguments valid under the tool's parameters, whole and streamed; a history with
an assistant's tool call and the tool's result is accepted; tool_choice none answers in text;
bad choices are 400s naming the field.

usage: python3 tools.py BASE_URL MODEL API_KEY
"""
import json
import sys

import openai

base, model, key = sys.argv[1], sys.argv[2], sys.argv[3]
client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
checks = 0


def check(cond, what):
    global checks
    if not cond:
        raise SystemExit(f"FAILED: {what}")
    checks += 1


weather = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city", "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["C", "F"]}}, "required": ["city", "unit"], "additionalProperties": False}}}
clock = {"type": "function", "function": {"name": "now", "description": "The time", "parameters": {"type": "object", "properties": {}, "additionalProperties": False}}}
msgs = [{"role": "user", "content": "What is the weather in Paris?"}]


def args_ok(call):
    a = json.loads(call.function.arguments)
    return call.function.name == "get_weather" and set(a) == {"city", "unit"} and isinstance(a["city"], str) and a["unit"] in ("C", "F")


r = client.chat.completions.create(model=model, messages=msgs, max_tokens=60, temperature=0, tools=[weather, clock], tool_choice={"type": "function", "function": {"name": "get_weather"}})
ch = r.choices[0]
check(ch.finish_reason == "tool_calls" and ch.message.content is None and len(ch.message.tool_calls) == 1 and args_ok(ch.message.tool_calls[0]), f"named tool call: {ch}")
call = ch.message.tool_calls[0]
check(call.id and call.type == "function", f"call id/type: {call}")

# required, streamed: the call comes as a tool_calls delta, then finish_reason tool_calls
deltas, reasons = [], []
for c in client.chat.completions.create(model=model, messages=msgs, max_tokens=60, temperature=0, tools=[weather], tool_choice="required", stream=True):
    if c.choices:
        deltas.extend(c.choices[0].delta.tool_calls or [])
        reasons.append(c.choices[0].finish_reason)
check(len(deltas) == 1 and deltas[0].function.name == "get_weather" and deltas[0].index == 0 and reasons[-1] == "tool_calls", f"streamed required call: {deltas} {reasons}")
check(args_ok(deltas[0]), f"streamed arguments {deltas[0].function.arguments!r}")

# the call and its result in the history
hist = msgs + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]}, {"role": "tool", "tool_call_id": call.id, "content": "18 C and sunny"}]
r = client.chat.completions.create(model=model, messages=hist, max_tokens=8, temperature=0, tools=[weather])
check(r.choices[0].finish_reason in ("stop", "length", "tool_calls"), f"history with a tool result: {r.choices[0]}")

# none: text
r = client.chat.completions.create(model=model, messages=msgs, max_tokens=6, temperature=0, tools=[weather], tool_choice="none")
check(r.choices[0].message.content and not r.choices[0].message.tool_calls, f"tool_choice none: {r.choices[0]}")


def status_of(fn):
    try:
        fn()
    except openai.APIStatusError as e:
        return e.status_code, e.body
    return 200, None


code, body = status_of(lambda: client.chat.completions.create(model=model, messages=msgs, max_tokens=4, tools=[weather], tool_choice={"type": "function", "function": {"name": "fly"}}))
check(code == 400 and body["param"] == "tool_choice", f"unknown tool -> {code} {body}")
code, body = status_of(lambda: client.chat.completions.create(model=model, messages=msgs, max_tokens=4, tools=[{"type": "function"}]))
check(code == 400 and body["param"] == "tools", f"a tool without a function -> {code} {body}")
code, body = status_of(lambda: client.completions.create(model=model, prompt="hi", max_tokens=2, extra_body={"tools": [weather]}))
check(code == 400 and body["param"] == "tools", f"tools on completions -> {code} {body}")
print(f"tools: {checks} checks passed")
