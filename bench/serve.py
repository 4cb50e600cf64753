"""Serving benchmark for `dsc serve` (or any OpenAI-compatible server), in the spirit of vLLM's
benchmark_serving: requests arrive open-loop (Poisson at --rate requests/s, or all at once with
--rate inf), optionally capped at --max-concurrency in flight, each a streaming
/v1/completions call whose prompt is --input-len random token ids and which generates exactly
--output-len tokens (ignore_eos). Lengths may vary uniformly by --range-ratio around the set
values, as vLLM's random dataset does.

Per request it records the time to the first token (TTFT), the gaps between streamed chunks
(ITL), the time per output token after the first (TPOT = (e2e - TTFT) / (tokens - 1)) and the
end-to-end latency; it reports output and total tokens/s, requests/s, p50/p90/p99 of each
latency, goodput (requests/s meeting every --goodput SLO) and, with --priority-mix, TTFT per
priority class. --sweep runs several rates in turn and, with --png, draws output tokens/s
against TTFT / TPOT p50 and p99 (matplotlib). Standard library only otherwise, so it runs
wherever python3 does.

usage: python3 bench/serve.py --base http://127.0.0.1:8000 --model NAME [--api-key KEY]
         [--num-prompts 200] [--input-len 128] [--output-len 128] [--range-ratio 0]
         [--rate 8 | --sweep 2,4,8,inf] [--max-concurrency N] [--vocab 49152]
         [--priority-mix high=0.1,normal=0.6,low=0.3] [--goodput ttft=500,tpot=50]
         [--seed 0] [--json out.json] [--png curve.png]
"""
import argparse
import asyncio
import json
import math
import random
import sys
import time
import urllib.parse
import urllib.request

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--base", required=True, help="server URL, e.g. http://127.0.0.1:8000")
ap.add_argument("--model", required=True)
ap.add_argument("--api-key", default="")
ap.add_argument("--num-prompts", type=int, default=200)
ap.add_argument("--input-len", type=int, default=128)
ap.add_argument("--output-len", type=int, default=128)
ap.add_argument("--range-ratio", type=float, default=0.0, help="lengths uniform in [len·(1-r), len·(1+r)]")
ap.add_argument("--rate", default="inf", help="requests/s (Poisson arrivals), or inf: all at once")
ap.add_argument("--sweep", help="comma-separated rates run in turn (overrides --rate)")
ap.add_argument("--max-concurrency", type=int, default=0, help="at most this many requests in flight (0: no cap)")
ap.add_argument("--vocab", type=int, default=32000, help="prompt token ids are drawn from [100, vocab) (32000: inside every supported vocabulary)")
ap.add_argument("--priority-mix", default="", help="e.g. high=0.1,normal=0.6,low=0.3 (dsc's `priority` field)")
ap.add_argument("--goodput", default="", help="SLOs in ms, e.g. ttft=500,tpot=50,e2e=10000")
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--timeout", type=float, default=600.0, help="seconds one request may take")
ap.add_argument("--json")
ap.add_argument("--png")
a = ap.parse_args()

u = urllib.parse.urlparse(a.base)
HOST, PORT = u.hostname, u.port or 80
HEADERS = {"Content-Type": "application/json"}
if a.api_key:
    HEADERS["Authorization"] = f"Bearer {a.api_key}"


def parse_kv(s, what):
    out = {}
    for part in filter(None, s.split(",")):
        k, _, v = part.partition("=")
        try:
            out[k.strip()] = float(v)
        except ValueError:
            sys.exit(f"--{what}: `{part}` is not NAME=NUMBER")
    return out


MIX = parse_kv(a.priority_mix, "priority-mix")
for k in MIX:
    if k not in ("high", "normal", "low"):
        sys.exit(f"--priority-mix: `{k}` is not high, normal or low")
SLO = parse_kv(a.goodput, "goodput")
for k in SLO:
    if k not in ("ttft", "tpot", "e2e"):
        sys.exit(f"--goodput: `{k}` is not ttft, tpot or e2e")


def pct(v, p):
    v = sorted(x for x in v if x is not None)
    if not v:
        return None
    # nearest rank, as numpy's "higher" would (p99 of 100 values is the 99th)
    return v[min(len(v) - 1, max(0, math.ceil(p / 100 * len(v)) - 1))]


def stats(v):
    v = [x for x in v if x is not None]
    return {"mean": sum(v) / len(v) if v else None, "p50": pct(v, 50), "p90": pct(v, 90), "p99": pct(v, 99)}


def requests(rng):
    """The requests of one run: (input ids, output length, priority)."""
    def length(n):
        lo, hi = max(1, int(n * (1 - a.range_ratio))), max(1, int(n * (1 + a.range_ratio)))
        return rng.randint(lo, hi)

    vocab = a.vocab
    names = list(MIX) or ["normal"]
    weights = [MIX[n] for n in names] if MIX else [1.0]
    out = []
    for _ in range(a.num_prompts):
        ids = [rng.randrange(100, vocab) for _ in range(length(a.input_len))]
        out.append((ids, length(a.output_len), rng.choices(names, weights)[0]))
    return out


async def one(ids, max_tokens, priority):
    """One streaming request; returns its timings (HTTP/1.0: the body is not chunked)."""
    body = {"model": a.model, "prompt": ids, "max_tokens": max_tokens, "temperature": 0, "stream": True, "ignore_eos": True, "stream_options": {"include_usage": True}}
    if MIX:
        body["priority"] = priority
    b = json.dumps(body).encode()
    t0 = time.perf_counter()
    r = {"priority": priority, "input_tokens": len(ids), "output_tokens": 0, "ttft": None, "itl": [], "e2e": None, "error": None}
    try:
        rd, wr = await asyncio.open_connection(HOST, PORT)
        head = "".join(f"{k}: {v}\r\n" for k, v in HEADERS.items())
        wr.write(f"POST /v1/completions HTTP/1.0\r\nHost: {HOST}\r\n{head}Content-Length: {len(b)}\r\nConnection: close\r\n\r\n".encode() + b)
        await wr.drain()
        status = (await rd.readline()).decode().split()
        if len(status) < 2 or status[1] != "200":
            rest = (await rd.read()).decode(errors="replace")
            r["error"] = f"HTTP {' '.join(status[1:])}: {rest[-300:]}"
            return r
        last = None
        while True:
            line = await rd.readline()
            if not line:
                break
            line = line.decode().strip()
            if not line.startswith("data: "):
                continue
            d = line[6:]
            if d == "[DONE]":
                break
            msg = json.loads(d)
            if msg.get("usage"):
                r["output_tokens"] = msg["usage"]["completion_tokens"]
            if msg.get("choices"):
                now = time.perf_counter()
                if r["ttft"] is None:
                    r["ttft"] = now - t0
                elif last is not None:
                    r["itl"].append(now - last)
                last = now
        wr.close()
        r["e2e"] = time.perf_counter() - t0
        if r["output_tokens"] != max_tokens:
            r["error"] = f"{r['output_tokens']} tokens of {max_tokens}"
    except Exception as e:  # a refused or cut connection is a failed request, not a crash
        r["error"] = f"{type(e).__name__}: {e}"
    return r


async def run(rate):
    rng = random.Random(a.seed)
    reqs = requests(rng)
    arrivals = random.Random(a.seed + 1)
    sem = asyncio.Semaphore(a.max_concurrency) if a.max_concurrency > 0 else None

    async def guarded(req):
        if sem is None:
            return await asyncio.wait_for(one(*req), a.timeout)
        async with sem:
            return await asyncio.wait_for(one(*req), a.timeout)

    t0 = time.perf_counter()
    tasks = []
    for req in reqs:
        tasks.append(asyncio.create_task(guarded(req)))
        if rate != math.inf:
            await asyncio.sleep(arrivals.expovariate(rate))
    res = await asyncio.gather(*tasks, return_exceptions=True)
    wall = time.perf_counter() - t0
    res = [x if isinstance(x, dict) else {"error": repr(x), "output_tokens": 0, "input_tokens": 0, "ttft": None, "itl": [], "e2e": None, "priority": "?"} for x in res]
    ok = [x for x in res if not x["error"]]
    for x in ok:
        x["tpot"] = (x["e2e"] - x["ttft"]) / (x["output_tokens"] - 1) if x["output_tokens"] > 1 else None
    out_tok = sum(x["output_tokens"] for x in ok)
    in_tok = sum(x["input_tokens"] for x in ok)

    def meets(x):
        return all((x.get(k) or 0) * 1000 <= v for k, v in SLO.items())

    rep = {
        "rate": "inf" if rate == math.inf else rate,
        "requests": len(res),
        "completed": len(ok),
        "failed": len(res) - len(ok),
        "errors": sorted({x["error"] for x in res if x["error"]})[:5],
        "wall_s": wall,
        "request_throughput": len(ok) / wall,
        "output_tok_s": out_tok / wall,
        "total_tok_s": (in_tok + out_tok) / wall,
        "input_tokens": in_tok,
        "output_tokens": out_tok,
        "ttft_s": stats([x["ttft"] for x in ok]),
        "tpot_s": stats([x["tpot"] for x in ok]),
        "itl_s": stats([g for x in ok for g in x["itl"]]),
        "e2e_s": stats([x["e2e"] for x in ok]),
    }
    if SLO:
        rep["goodput"] = {"slo_ms": SLO, "requests_s": sum(meets(x) for x in ok) / wall, "share": sum(meets(x) for x in ok) / max(1, len(res))}
    if MIX:
        rep["by_priority"] = {p: {"completed": sum(x["priority"] == p for x in ok), "ttft_s": stats([x["ttft"] for x in ok if x["priority"] == p]), "e2e_s": stats([x["e2e"] for x in ok if x["priority"] == p])} for p in MIX}
    return rep


def line(r):
    ms = lambda s: "-" if s is None else f"{s * 1000:.1f}"
    return (
        f"rate {r['rate']:>5}  {r['completed']}/{r['requests']} done  {r['output_tok_s']:9.1f} out tok/s  {r['total_tok_s']:9.1f} tok/s  {r['request_throughput']:6.2f} req/s  "
        f"TTFT p50/p99 {ms(r['ttft_s']['p50'])}/{ms(r['ttft_s']['p99'])} ms  TPOT p50/p99 {ms(r['tpot_s']['p50'])}/{ms(r['tpot_s']['p99'])} ms  "
        f"ITL p99 {ms(r['itl_s']['p99'])} ms  e2e p99 {ms(r['e2e_s']['p99'])} ms"
        + (f"  goodput {r['goodput']['requests_s']:.2f} req/s" if "goodput" in r else "")
    )


def main():
    rates = [float(x) for x in (a.sweep or a.rate).split(",")]
    runs = []
    for rate in rates:
        r = asyncio.run(run(rate))
        runs.append(r)
        print(line(r), flush=True)
        for p, v in r.get("by_priority", {}).items():
            t = v["ttft_s"]
            print(f"    {p:>6}: {v['completed']} done, TTFT p50/p99 {1000 * (t['p50'] or 0):.1f}/{1000 * (t['p99'] or 0):.1f} ms")
    out = {
        "base": a.base,
        "model": a.model,
        "num_prompts": a.num_prompts,
        "input_len": a.input_len,
        "output_len": a.output_len,
        "range_ratio": a.range_ratio,
        "max_concurrency": a.max_concurrency,
        "priority_mix": MIX,
        "runs": runs,
    }
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    if a.png:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            sys.exit("--png needs matplotlib (pip install matplotlib)")
        fig, ax = plt.subplots(1, 2, figsize=(11, 4))
        x = [r["output_tok_s"] for r in runs]
        for i, (key, name) in enumerate([("ttft_s", "TTFT"), ("tpot_s", "TPOT")]):
            for p, style in [("p50", "o-"), ("p99", "s--")]:
                ax[i].plot(x, [1000 * (r[key][p] or 0) for r in runs], style, label=f"{name} {p}")
            for r, xi in zip(runs, x):
                ax[i].annotate(str(r["rate"]), (xi, 1000 * (r[key]["p99"] or 0)), fontsize=7)
            ax[i].set_xlabel("output tokens/s")
            ax[i].set_ylabel(f"{name} (ms)")
            ax[i].legend()
            ax[i].grid(alpha=0.3)
        fig.suptitle(f"{a.model}: {a.input_len} in / {a.output_len} out, request rates {', '.join(str(r['rate']) for r in runs)}")
        fig.tight_layout()
        fig.savefig(a.png, dpi=120)
    bad = sum(r["failed"] for r in runs)
    if bad:
        sys.exit(f"FAILED: {bad} requests failed: {runs[-1]['errors']}")


main()
