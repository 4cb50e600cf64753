#!/usr/bin/env bash
# The performance harness (issue 6). Run ON the H200 from the repo root with .gpu/ carried:
#   here:  bash scripts/gpu-prepare.sh      (builds .gpu/dsc-runtime and .gpu/bench/)
#   there: carry [".gpu/dsc-runtime", ".gpu/bench"]: bash bench/run.sh
# Measures dsc (decode tokens/s at batch 1/8/32/128 through the serving engine, prefill at
# 512/4096 tokens, GEMM TFLOP/s of its tensor-core kernels: dsc-runtime bench-gemm, its
# attention kernel alone: dsc-runtime bench-attention; each kernel's cost inside a decode step's
# graph: scripts/gpu-timeline.sh) on the Llama-3-8B and SmolLM2-135M shapes (bf16 seeded weights), the
# kernel-level PyTorch peers (cuBLAS GEMM, SDPA, GEMV: ../shared/bench/torch_kernels.py),
# and with PEERS=1 also the end-to-end peers (gpt-fast style torch.compile and HF static cache:
# ../shared/bench/torch_compiled.py, ~10 min); then writes $OUT/perf.json and $OUT/perf.png
# (dsc vs peers vs roofline). Without PEERS=1 the end-to-end peer numbers are the ones
# ../shared/docs/GPU.md records for this H200 (marked so in the JSON).
set -uo pipefail
out=${OUT:-.gpu/out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee "$out/gpu.txt"
# (SmolLM2's context is 2048 tokens: its long prefill is 2048)
for spec in llama3-8b:512,4096 smollm2-135m:512,2048; do
  m=${spec%%:*}
  .gpu/dsc-runtime bench .gpu/bench/$m.plan --batches 1,8,32,128 --prefill "${spec#*:}" --json "$out/dsc-$m.json" 2>&1 | tee "$out/dsc-$m.log" | grep -v "^decode\|^prefill"
done
# GEMM TFLOP/s of dsc's own tensor-core kernels at the 8B model's prefill shapes (M = 512,
# 4096; M = N = K = 4096 is the q/o projection), beside torch.matmul in torch_kernels.py
.gpu/dsc-runtime bench-gemm .gpu/bench/llama3-8b.plan --m 512,4096 --json "$out/gemm.json" 2>&1 | tee "$out/gemm.log"
# dsc's paged attention kernel alone: causal prefill (beside torch SDPA in torch_kernels.py)
# and decode at long contexts
.gpu/dsc-runtime bench-attention .gpu/bench/llama3-8b.plan --prefill 512,4096 --decode-context 1024,8192 --json "$out/attention.json" 2>&1 | tee "$out/attention.log"
# where a decode step's time goes, kernel by kernel, inside its CUDA graph (CUPTI injection,
# bench/kernel_timeline.cpp + timeline.py): SmolLM2 shape b1 (its steps start with the first
# layer's q/k/v GEMV, the embedding gather folded in) and the 8B shape b32
OUT=$out/tl-smol bash scripts/gpu-timeline.sh .gpu/dsc-runtime .gpu/bench/smollm2-135m.plan rms_matmul_k576_n960_bf16_parts_192_576_192_gx_zero576 --batches 1 --prefill 16 --new-tokens 64 > "$out/timeline.log" 2>&1
OUT=$out/tl-8b bash scripts/gpu-timeline.sh .gpu/dsc-runtime .gpu/bench/llama3-8b.plan gather_d4096_bf16 --batches 32 --prefill 16 --new-tokens 48 >> "$out/timeline.log" 2>&1
python3 .gpu/bench/torch_kernels.py > "$out/torch_kernels.log" 2>&1; tail -3 "$out/torch_kernels.log"
if [ "${PEERS:-0}" = 1 ]; then
  python3 .gpu/bench/torch_compiled.py 2>&1 | tee "$out/torch_compiled.log" | tail -8
fi
python3 .gpu/bench/chart.py "$out"
# the device returns only ~8 files: perf.json holds the JSONs, one log holds the logs
cat "$out"/*.log > /tmp/all.log 2>/dev/null; rm -f "$out"/*.log "$out"/torch_kernels.json "$out"/gemm.json "$out"/attention.json; rm -rf "$out"/tl-smol "$out"/tl-8b; mv /tmp/all.log "$out/run.log"
