#!/usr/bin/env bash
# Knock-out timing, run ON the H200 with .gpu/dsc-runtime and .gpu/knock/ (llama3-8b.plan,
# smollm2-135m.plan) carried: the engine's decode step with whole kernel families left out
# (DSC_SKIP_KERNELS, a measurement-only runtime knob: the tokens are wrong), so that the step
# time without them bounds what fusing them away can gain. One `bench` per variant.
# KNOCK_8B / KNOCK_SMOL: ';'-separated variants (each a DSC_SKIP_KERNELS value; "-" = none).
set -uo pipefail
out=${OUT:-.gpu/out}
mkdir -p "$out"
dir=${1:-.gpu/knock}
k8=${KNOCK_8B:-"-;rms_norm;splitk_reduce;splitk_reduce2;to_bf16;qkv_rope_cache;silu_mul;paged_attention;rms_norm,splitk_reduce,to_bf16,qkv_rope_cache,silu_mul;matmul"}
ks=${KNOCK_SMOL:-"-;paged_attention;matmul"}
run() { # plan batches label skip
  local skip=$3; [ "$skip" = "-" ] && skip=""
  local line
  line=$(DSC_SKIP_KERNELS="$skip" .gpu/dsc-runtime bench "$1" --batches "$2" --prefill 16 --new-tokens 64 2>&1 | tee -a "$out/knock.log" | grep "^decode b" | tr '\n' ' ')
  printf '%-14s %-70s %s\n' "$(basename "$1" .plan)" "${3}" "$line" | tee -a "$out/knock.txt"
}
IFS=';' read -ra V8 <<< "$k8"
IFS=';' read -ra VS <<< "$ks"
for v in "${V8[@]}"; do run "$dir/llama3-8b.plan" "${B8:-32}" "$v"; done
for v in "${VS[@]}"; do run "$dir/smollm2-135m.plan" "${BSMOL:-1}" "$v"; done
echo; cat "$out/knock.txt"
