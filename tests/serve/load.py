"""Load test: N concurrent streaming clients against `dsc serve` (standard library only, so it
runs where no packages can be installed). Every response must complete and equal the solo
(one-at-a-time) greedy run of the same prompt; afterwards the KV pool must hold no sequence's
blocks. Prints throughput and latency percentiles and writes them as JSON.

usage: python3 load.py BASE_URL MODEL API_KEY [--clients 64] [--max-tokens 24] [--json out.json]
"""
import argparse
import asyncio
import json
import time
import urllib.request

ap = argparse.ArgumentParser()
ap.add_argument("base")
ap.add_argument("model")
ap.add_argument("key")
ap.add_argument("--clients", type=int, default=64)
ap.add_argument("--max-tokens", type=int, default=24)
ap.add_argument("--json")
ap.add_argument("--allow-mismatch", action="store_true", help="report, do not fail on, outputs that differ from the solo run (GPU: batched steps take the bf16 tensor-core path, solo decode the f32 GEMV, so near-ties may flip)")
a = ap.parse_args()
host, port = a.base.split("//")[1].split(":")
port = int(port)
WORDS = "river stone light quiet paper garden engine window silver morning cloud music".split()


def prompt(i):
    # distinct prompts, some sharing a prefix (the prefix cache sees them)
    return f"Story {i % 8}: the {WORDS[i % 12]} and the {WORDS[(i * 7) % 12]} met by the {WORDS[(i * 5) % 12]} and"


def body(i, stream):
    return json.dumps({"model": a.model, "prompt": prompt(i), "max_tokens": a.max_tokens, "temperature": 0, "stream": stream, "ignore_eos": True, "priority": ["high", "normal", "low"][i % 3]}).encode()


def solo(i):
    req = urllib.request.Request(a.base + "/v1/completions", data=body(i, False), headers={"Content-Type": "application/json", "Authorization": f"Bearer {a.key}"})
    with urllib.request.urlopen(req) as r:
        return json.loads(r.read())["choices"][0]["text"]


async def ttft_probe(i):
    """One streaming client (HTTP/1.0: the body is not chunked, SSE lines arrive whole)."""
    t0 = time.perf_counter()
    rd, wr = await asyncio.open_connection(host, port)
    b = body(i, True)
    wr.write(f"POST /v1/completions HTTP/1.0\r\nHost: {host}\r\nContent-Type: application/json\r\nAuthorization: Bearer {a.key}\r\nContent-Length: {len(b)}\r\nConnection: close\r\n\r\n".encode() + b)
    await wr.drain()
    first = None
    text, reason, done = "", None, False
    while True:
        line = await rd.readline()
        if not line:
            break
        line = line.decode().strip()
        if line.startswith("data: "):
            d = line[6:]
            if d == "[DONE]":
                done = True
                continue
            ch = json.loads(d)["choices"][0]
            if first is None and ch["text"]:
                first = time.perf_counter() - t0
            text += ch["text"]
            reason = ch["finish_reason"] or reason
    wr.close()
    return {"i": i, "text": text, "reason": reason, "done": done, "ttft": first, "e2e": time.perf_counter() - t0}


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(p / 100 * len(v)))] if v else None


async def main():
    want = [solo(i) for i in range(a.clients)]
    t0 = time.perf_counter()
    res = await asyncio.gather(*(ttft_probe(i) for i in range(a.clients)))
    wall = time.perf_counter() - t0
    incomplete = [r["i"] for r in res if not r["done"] or r["reason"] != "length"]
    differ = [r["i"] for r in res if r["text"] != want[r["i"]]]
    bad = sorted(set(incomplete + ([] if a.allow_mismatch else differ)))
    # the engine sends a stream's last event before it refreshes its gauges at the end of that
    # step: read them until they settle (for up to 3 s; a leaked block or sequence stays)
    for _ in range(30):
        metrics = urllib.request.urlopen(a.base + "/metrics").read().decode()
        used = [l for l in metrics.splitlines() if l.startswith('dsc_kv_blocks{state="used"}')]
        running = [l for l in metrics.splitlines() if l.startswith("dsc_running_sequences")]
        if used == ['dsc_kv_blocks{state="used"} 0'] and running == ["dsc_running_sequences 0"]:
            break
        await asyncio.sleep(0.1)
    counter = lambda name: sum(float(l.split()[-1]) for l in metrics.splitlines() if l.startswith(name + " ") or l.startswith(name + "{"))
    out = {
        "clients": a.clients,
        "max_tokens": a.max_tokens,
        "wall_s": wall,
        "generated_tokens_per_s": a.clients * a.max_tokens / wall,
        "ttft_s": {"p50": pct([r["ttft"] for r in res if r["ttft"]], 50), "p90": pct([r["ttft"] for r in res if r["ttft"]], 90), "p99": pct([r["ttft"] for r in res if r["ttft"]], 99)},
        "e2e_s": {"p50": pct([r["e2e"] for r in res], 50), "p90": pct([r["e2e"] for r in res], 90), "p99": pct([r["e2e"] for r in res], 99)},
        "complete": a.clients - len(incomplete),
        "equal_to_solo": a.clients - len(differ),
        "kv_used_after": used,
        "running_after": running,
        "preemptions": counter("dsc_preemptions_total"),
        "prefix_cache_hit_tokens": counter("dsc_prefix_cache_hit_tokens_total"),
    }
    print(json.dumps(out, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    if bad:
        for i in bad[:5]:
            r = res[i]
            print(f"client {i}: done={r['done']} reason={r['reason']} text={r['text']!r} solo={want[i]!r}")
        raise SystemExit(f"FAILED: {len(bad)} of {a.clients} responses incomplete or different from the solo run")
    if used != ['dsc_kv_blocks{state="used"} 0'] or running != ["dsc_running_sequences 0"]:
        raise SystemExit(f"FAILED: KV pool not empty after the load: {used} {running}")
    print(f"load: {a.clients} concurrent streams complete, {a.clients - len(differ)} equal to solo runs, KV pool empty")


asyncio.run(main())
