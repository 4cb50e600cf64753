"""Expert failover through `dsc serve`'s admin endpoint (standard library only).

usage: python3 failover.py BASE_URL MODEL API_KEY LAYER EXPERT PROMPT MAX_TOKENS

The server runs with `--disable-expert LAYER:EXPERT`. Prints one JSON object: the greedy
completions with the expert disabled (at start), re-enabled and disabled again, the answers of
the admin endpoint (with and without the key), and the MoE metrics after.
"""
import json
import sys
import urllib.error
import urllib.request

base, model, key, layer, expert, prompt, max_tokens = sys.argv[1:8]
layer, expert, max_tokens = int(layer), int(expert), int(max_tokens)


def call(method, path, body=None, auth=True):
    h = {"Content-Type": "application/json"}
    if auth:
        h["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(base + path, data=None if body is None else json.dumps(body).encode(), headers=h, method=method)
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def complete():
    st, txt = call("POST", "/v1/completions", {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True})
    assert st == 200, (st, txt)
    return json.loads(txt)["choices"][0]["text"]


out = {}
out["unauthorized"] = call("GET", "/admin/experts", auth=False)[0]
st, txt = call("GET", "/admin/experts")
out["at_start"] = [st, json.loads(txt)]
out["masked"] = complete()
st, txt = call("POST", "/admin/experts", {"layer": layer, "expert": expert, "enabled": True})
out["enable"] = [st, json.loads(txt)]
out["restored"] = complete()
st, txt = call("POST", "/admin/experts", {"layer": layer, "expert": expert, "enabled": False})
out["disable"] = [st, json.loads(txt)]
out["masked_again"] = complete()
out["bad_layer"] = call("POST", "/admin/experts", {"layer": 0, "expert": expert, "enabled": False})
out["bad_body"] = call("POST", "/admin/experts", {"layer": layer, "expert": "x", "enabled": False})[0]
st, metrics = call("GET", "/metrics")
out["metrics"] = [l for l in metrics.splitlines() if l.startswith("dsc_moe_")]
print(json.dumps(out))
