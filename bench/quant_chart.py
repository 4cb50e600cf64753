"""Draw the quantization results (issue 33) from their committed JSON: SmolLM2 perplexity per weight
format against its target, and Llama-3-8B-shape decode tok/s per batch for bf16, Q4_1 and i4g128.
usage: python3 bench/quant_chart.py PPL_JSON DECODE_JSON OUT_PNG"""
import json, sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

ppl, dec, out = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3]
fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4.8))

rows = [r for r in ppl["rows"] if r["backend"] == "cpu"]
base = rows[0]["ppl"]
targets = {"int8": 1.0, "int4-g128 RTN policy default": 8.0, "int4-g128 AWQ policy default": 4.0}
names = [r["weights"].replace(" policy default", "").replace(" (MLP + W_o)", "") for r in rows]
vals = [100 * (r["ppl"] / base - 1) for r in rows]
a.barh(names, vals, color=["#888"] + ["#3a7"] * (len(vals) - 1))
for i, r in enumerate(rows):
    t = next((v for k, v in targets.items() if r["weights"].startswith(k)), None)
    if t is not None:
        a.plot([t, t], [i - 0.4, i + 0.4], color="#c33", lw=2)
    a.text(vals[i] + 0.5, i, f'{r["ppl"]:.2f} ({vals[i]:+.1f}%)', va="center", fontsize=8)
a.invert_yaxis()
a.set_xlabel("perplexity increase over the shipped GGUF, % (red: issue 33's target)")
a.set_title("SmolLM2-135M perplexity on data/coriolanus-act1.txt (CPU executor)\nthe shipped Q4_1 GGUF re-quantized: no bf16 checkpoint here", fontsize=9)

s = dec["summary_tok_s"]
plans = [("llama3-8b-seeded", "bf16"), ("llama3-8b-q4_1-seeded", "Q4_1 (int4 before)"), ("llama3-8b-i4g128-seeded", "i4g128 (int4 GEMV)")]
batches = ["b1", "b8", "b32"]
w = 0.27
for j, (p, label) in enumerate(plans):
    xs = [i + (j - 1) * w for i in range(len(batches))]
    ys = [s[p][bb] / s["llama3-8b-seeded"][bb] for bb in batches]
    a2 = b.bar(xs, ys, w, label=label)
    for x, y, bb in zip(xs, ys, batches):
        b.text(x, y + 0.03, f"{s[p][bb]:,.0f}", ha="center", fontsize=7)
b.axhline(3.3, color="#c33", ls="--", lw=1)
b.text(-0.45, 3.35, "b1 target 3.3x", color="#c33", fontsize=8)
b.axhline(1.6, color="#c33", ls=":", lw=1)
b.text(1.6, 1.65, "b32 target 1.6x", color="#c33", fontsize=8)
b.set_xticks(range(len(batches)), batches)
b.set_ylabel("decode tok/s relative to bf16 (labels: tok/s)")
b.set_title(f"Llama-3-8B shape decode, seeded weights, H200\n{dec['date']}, commit {dec['commit']}, one run", fontsize=9)
b.legend(fontsize=8)
fig.tight_layout()
fig.savefig(out, dpi=110)
print("wrote", out)
