#!/usr/bin/env python3
"""llama.cpp (llama-cpp-python) on the same GGUF and the same token ids as `dsc bench-cpu`:
prefill of N tokens in one eval (median of 3) and greedy decode of D tokens after a 16-token
prompt, with the same thread count. Prints JSON.

usage: cpu_peer.py MODEL.gguf --threads 2 --prefill 500 --decode 128
"""
import argparse, json, statistics, sys, time

import numpy as np
from llama_cpp import Llama


def bench_ids(n, vocab):
    # the ids of dsc's runtime/src/cli.rs `bench_ids`
    span = max(vocab - 1000, 1)
    base = min(500, vocab - 1)
    return [(i * 7919) % span + base for i in range(n)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prefill", type=int, default=500)
    ap.add_argument("--decode", type=int, default=128)
    a = ap.parse_args()
    llm = Llama(model_path=a.gguf, n_ctx=2048, n_batch=max(512, a.prefill), n_ubatch=max(512, a.prefill),
                n_threads=a.threads, n_threads_batch=a.threads, logits_all=False, verbose=False)
    vocab = llm.n_vocab()
    times = []
    for _ in range(3):
        llm.reset()
        ids = bench_ids(a.prefill, vocab)
        t0 = time.perf_counter()
        llm.eval(ids)
        times.append(time.perf_counter() - t0)
    prefill = statistics.median(times)
    llm.reset()
    llm.eval(bench_ids(16, vocab))
    last = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    t0 = time.perf_counter()
    for _ in range(a.decode):
        llm.eval([last])
        last = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    decode = time.perf_counter() - t0
    import llama_cpp
    print(json.dumps({
        "peer": f"llama-cpp-python {llama_cpp.__version__}",
        "threads": a.threads,
        "prefill_tokens": a.prefill,
        "prefill_tokens_per_s": a.prefill / prefill,
        "decode_tokens": a.decode,
        "decode_tokens_per_s": a.decode / decode,
        "decode_ms_per_token": decode * 1e3 / a.decode,
    }, indent=2))


if __name__ == "__main__":
    sys.exit(main())
