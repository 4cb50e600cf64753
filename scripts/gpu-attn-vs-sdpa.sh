#!/usr/bin/env bash
# Prefill attention against torch SDPA on one machine, alternating (issue 6: "attention prefill
# >= torch SDPA at 4k tokens"; the lent H200s differ by a few % between calls, so compare
# within one): dsc's kernel alone (dsc-runtime bench-attention, the 8B shape's heads: 32 query /
# 8 KV heads, head dim 128, causal) and F.scaled_dot_product_attention on the same shape, as
# ../shared/bench/torch_kernels.py times it (median of 20 after 5 warm-up runs, CUDA events),
# ROUNDS times each. Run ON the H200 with [".gpu/bench", ".gpu/dsc-runtime"] carried
# (scripts/gpu-prepare.sh builds both). T (default 4096), ROUNDS (default 5).
set -uo pipefail
T=${T:-4096}
for r in $(seq "${ROUNDS:-5}"); do
  .gpu/dsc-runtime bench-attention .gpu/bench/llama3-8b.plan --prefill "$T" --decode-context 1024 2>&1 | grep -m1 -E "^prefill" | sed "s/^/dsc  $r /"
  python3 - "$T" <<'PY' | sed "s/^/sdpa $r /"
import sys, torch, torch.nn.functional as F
T = int(sys.argv[1])
q = torch.randn(1, 32, T, 128, device="cuda", dtype=torch.bfloat16); k = torch.randn(1, 8, T, 128, device="cuda", dtype=torch.bfloat16); v = torch.randn_like(k)
fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
for _ in range(5): fn()
torch.cuda.synchronize(); ts = []
for _ in range(20):
    s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
    s.record(); fn(); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
ts.sort(); t = ts[len(ts) // 2] / 1e3
print(f"prefill T {T}: {t * 1e6:.1f} us {4 * 32 * T * T * 128 / 2 / t / 1e12:.1f} TFLOP/s")
PY
done
