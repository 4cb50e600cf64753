"""Merge dsc's and the peers' numbers into perf.json and draw perf.png (dsc vs peers vs the
roofline). usage: python3 chart.py OUT_DIR"""
import json, os, sys

out = sys.argv[1]
def load(name):
    p = os.path.join(out, name)
    return json.load(open(p)) if os.path.exists(p) else {}

gpu = open(os.path.join(out, "gpu.txt")).read().strip() if os.path.exists(os.path.join(out, "gpu.txt")) else "?"
dsc = {m: load(f"dsc-{m}.json") for m in ("llama3-8b", "smollm2-135m")}
tk = load("torch_kernels.json")
tc = load("torch_compiled.json")
# end-to-end peers measured on this H200 (../shared/docs/GPU.md) when not re-run here
gpu_md = {
    ("smollm2-135m", 1): {"gptfast": 800, "hf_static": 367}, ("smollm2-135m", 32): {"gptfast": 23796, "hf_static": 10496},
    ("llama3-8b", 1): {"gptfast": 188, "hf_static": 143}, ("llama3-8b", 32): {"gptfast": 5430, "hf_static": 2884},
}
def peer(model, b, kind):
    k = f"{'gptfast-compiled' if kind == 'gptfast' else 'hf-static'} {model} b{b} tok/s"
    if k in tc:
        return tc[k], "measured in this run"
    v = gpu_md.get((model, b), {}).get(kind)
    return (v, "../shared/docs/GPU.md (same H200)") if v else (None, None)

weights = {"llama3-8b": 16.06e9, "smollm2-135m": 0.2691e9}  # bf16 bytes read per decode step
rows = []
for m, d in dsc.items():
    for x in d.get("decode", []):
        b = x["batch"]
        g, gsrc = peer(m, b, "gptfast")
        h, _ = peer(m, b, "hf_static")
        roof = b * 4.62e12 / weights[m]  # weights streamed once per step at 4.62 TB/s
        rows.append({"model": m, "workload": f"decode b{b}", "dsc_tok_s": round(x["decode_tokens_per_s"], 1), "dsc_ms_per_step": round(x["ms_per_step"], 2),
                     "gptfast_tok_s": g, "hf_static_tok_s": h, "peer_source": gsrc, "read_roofline_tok_s": round(roof, 1),
                     "vs_gptfast": round(x["decode_tokens_per_s"] / g, 2) if g else None, "of_roofline": round(x["decode_tokens_per_s"] / roof, 3)})
    for x in d.get("prefill", []):
        rows.append({"model": m, "workload": f"prefill {x['tokens']}", "dsc_tok_s": round(x["tokens_per_s"], 1), "dsc_ms": round(x["ms"], 1),
                     "dsc_tflop_s_matmul": round(2 * weights[m] / 2 * x["tokens_per_s"] / 1e12, 1)})
# dsc's own tensor-core GEMMs (dsc-runtime bench-gemm) beside torch.matmul (cuBLAS)
gemm = load("gemm.json")
if isinstance(gemm, list):
    for g in gemm:
        key = f"gemm bf16 {g['m']}x{g['n']}x{g['k']} TFLOP/s"
        g["cublas_tflop_s"] = tk.get(key)
        g["of_cublas"] = round(g["tflop_s"] / tk[key], 3) if tk.get(key) else None
# dsc's attention kernel alone (dsc-runtime bench-attention) beside torch SDPA (same FLOP count)
attn = load("attention.json")
if isinstance(attn, list):
    for a in attn:
        key = f"sdpa causal gqa32/8 T={a['tokens']} TFLOP/s"
        a["sdpa_tflop_s"] = tk.get(key) if a["kind"] == "prefill" else None
        a["of_sdpa"] = round(a["tflop_s"] / tk[key], 3) if a["kind"] == "prefill" and tk.get(key) else None
# each kernel's cost inside a decode step's graph (scripts/gpu-timeline.sh), when run
timelines = {k: v for k, v in (("smollm2-135m b1", load("tl-smol/timeline.json")), ("llama3-8b b32", load("tl-8b/timeline.json"))) if v}
res = {"gpu": gpu, "rows": rows, "dsc_gemm": gemm or "not measured", "dsc_attention": attn or "not measured", "timelines": timelines or "not measured", "torch_kernels": tk, "torch_compiled": tc or "not re-run (PEERS=0): see peer_source"}
json.dump(res, open(os.path.join(out, "perf.json"), "w"), indent=1)
for r in rows:
    print(r)
try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    for ax, m in zip(axes, ("llama3-8b", "smollm2-135m")):
        rs = [r for r in rows if r["model"] == m and r["workload"].startswith("decode")]
        bs = [int(r["workload"].split("b")[1]) for r in rs]
        ax.plot(bs, [r["dsc_tok_s"] for r in rs], "o-", label="dsc")
        ax.plot(bs, [r["read_roofline_tok_s"] for r in rs], "k--", label="weight-read roofline (4.62 TB/s)")
        pb = [b for b, r in zip(bs, rs) if r["gptfast_tok_s"]]
        ax.plot(pb, [r["gptfast_tok_s"] for r in rs if r["gptfast_tok_s"]], "s-", label="gpt-fast (torch.compile)")
        ax.plot(pb, [r["hf_static_tok_s"] for r in rs if r["hf_static_tok_s"]], "^-", label="HF static cache")
        ax.set_xscale("log", base=2); ax.set_yscale("log"); ax.set_xlabel("batch"); ax.set_ylabel("decode tokens/s")
        ax.set_title(f"{m} shape, bf16, H200"); ax.grid(True, which="both", alpha=0.3); ax.legend(fontsize=8)
    fig.tight_layout(); fig.savefig(os.path.join(out, "perf.png"), dpi=110)
    print("wrote perf.png")
except Exception as e:
    print(f"no chart: {e}")
