"""`dsc serve --reasoning-parser deepseek_r1` with the official `openai` client: chat output
goes to `reasoning_content` until `</think>` (SmolLM2 never writes one, so all of it), in the
whole response and in the stream alike; completions are not split.

usage: python3 reasoning.py BASE_URL MODEL API_KEY
"""
import sys

import openai

base, model, key = sys.argv[1], sys.argv[2], sys.argv[3]
client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
msgs = [{"role": "user", "content": "What is 2 + 2?"}]
r = client.chat.completions.create(model=model, messages=msgs, max_tokens=6, temperature=0)
m = r.choices[0].message
reasoning = (m.model_extra or {}).get("reasoning_content")
if not (m.content is None and reasoning):
    raise SystemExit(f"FAILED: no </think>: all reasoning, no content; got content={m.content!r} reasoning={reasoning!r}")
parts, content = [], []
for ch in client.chat.completions.create(model=model, messages=msgs, max_tokens=6, temperature=0, stream=True):
    if ch.choices:
        d = ch.choices[0].delta
        parts.append((d.model_extra or {}).get("reasoning_content") or "")
        content.append(d.content or "")
if "".join(parts) != reasoning or "".join(content):
    raise SystemExit(f"FAILED: the stream's reasoning {''.join(parts)!r} (content {''.join(content)!r}) vs {reasoning!r}")
c = client.completions.create(model=model, prompt="The capital of France is", max_tokens=3, temperature=0)
if not c.choices[0].text:
    raise SystemExit("FAILED: completions keep their text")
print("reasoning parser: 3 checks passed")
