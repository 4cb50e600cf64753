"""Draw issue 34/35's results from their committed JSON: SmolLM2 perplexity for 8-bit activations and the
e4m3 KV cache against the targets, 2:4 / 4:8 sparsity beside dense, and the Llama-3-8B-shape FP8 decode speed
against bf16 on the H200.
usage: python3 bench/fp8_chart.py PPL_JSON FP8_DECODE_JSON OUT_PNG"""
import json, sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

ppl, dec, out = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3]
rows = {r["name"]: r for r in ppl["rows"]}
fig, (a, s, b) = plt.subplots(1, 3, figsize=(17, 4.8), gridspec_kw={"width_ratios": [1.5, 0.8, 1]})

eight = [
    ("fp8 W8A16 (policy default)", "FP8 W8A16", None),
    ("fp8 W8A8, activations fp8-g128", "FP8 W8A8 (1x128 acts)", 1.0),
    ("fp8 W8A8, activations fp8 per token", "FP8 W8A8 (per-token acts)", 1.0),
    ("fp8 W8A8 every linear layer", "FP8 W8A8 incl. Q/K/V", None),
    ("int8 W8A8, activations int8-g128", "INT8 W8A8 (1x128 acts)", None),
    ("int8 W8A8, activations int8 per token", "INT8 W8A8 (per-token acts)", None),
    ("W4A8: the shipped Q4_1 weights, activations fp8-g128", "W4A8 (shipped Q4_1, fp8 acts)", 5.0),
    ("W4A8: the shipped Q4_1 weights, activations int8 per token", "W4A8 (int8 per-token acts)", 5.0),
    ("KV cache e4m3, Hadamard-rotated rows, scale per token and head", "KV e4m3, rotated", 0.5),
]
names = [n for _, n, _ in eight]
vals = [rows[k]["vs_shipped_pct"] for k, _, _ in eight]
a.barh(names, vals, color="#3a7")
for i, (k, _, t) in enumerate(eight):
    if t is not None:
        a.plot([t, t], [i - 0.4, i + 0.4], color="#c33", lw=2)
    a.text(vals[i] + 0.03, i, f'{rows[k]["ppl"]:.2f} ({vals[i]:+.2f}%)', va="center", fontsize=8)
a.invert_yaxis()
a.set_xlabel("perplexity increase over the shipped GGUF (40.249), % (red: issue 34's target)")
a.set_title("SmolLM2-135M, CPU executor, data/coriolanus-act1.txt", fontsize=9)

sp = [("dense", 40.249), ("2:4 magnitude", rows["2:4 magnitude"]["ppl"]), ("2:4 Wanda", rows["2:4 Wanda"]["ppl"]), ("4:8 Wanda", rows["4:8 Wanda"]["ppl"])]
s.bar([n for n, _ in sp], [v for _, v in sp], color=["#888", "#c83", "#3a7", "#37a"])
s.set_yscale("log")
for i, (_, v) in enumerate(sp):
    s.text(i, v * 1.08, f"{v:.1f}", ha="center", fontsize=8)
s.set_ylabel("perplexity (log)")
s.set_title("2:4 / 4:8 one-shot pruning, MLP + W_o\n(Llama-2-7B published: 5.12 -> 11.02 Wanda)", fontsize=9)
s.tick_params(axis="x", labelsize=7)

t = dec["llama3_8b_tok_s"]
batches = ["b1", "b8", "b32", "prefill512"]
w = 0.27
for j, p in enumerate(["bf16", "f8g128", "i4g128"]):
    xs = [i + (j - 1) * w for i in range(len(batches))]
    ys = [max(t[p][bb]) / max(t["bf16"][bb]) for bb in batches]
    b.bar(xs, ys, w, label={"bf16": "bf16", "f8g128": "FP8 W8A16 (f8g128)", "i4g128": "int4 (i4g128)"}[p])
    for x, y, bb in zip(xs, ys, batches):
        b.text(x, y + 0.03, f"{max(t[p][bb]):,.0f}", ha="center", fontsize=6, rotation=90)
for bb, tgt in [(0, 1.8), (2, 1.6)]:
    b.plot([bb - 0.45, bb + 0.45], [tgt, tgt], color="#c33", ls="--", lw=1)
b.set_xticks(range(len(batches)))
b.set_xticklabels(batches)
b.set_ylabel("tok/s relative to bf16 (labels: tok/s)")
b.set_title("Llama-3-8B shape on the H200 (red: FP8 targets b1 1.8x, b32 1.6x)", fontsize=9)
b.legend(fontsize=7)
fig.tight_layout()
fig.savefig(out, dpi=110)
print(f"wrote {out}")
