#!/usr/bin/env bash
# The DeepSeek one-token fusions that are written and CPU-checked but not yet run on a GPU
# (issue 32; all off by default until this run measures them), A/B on the V2-Lite shape:
#   DSC_MOE_PREFETCH=1   the shared experts' gate/up weights prefetched into L2 by the
#                        attention's query and value kernels, the shared slots first
#                        (`prefetch_shared_experts`, `MoeGateUp/MoeDown { shared_first }`)
#   DSC_MLA_CACHE_ATTN=1 the latent cache row written inside the attention (`MlaCacheAttention`)
#   DSC_MOE_ROUTER=1     the router in its GEMV's last block, the MoE layer's RMSNorm folded into
#                        it and the gate/up (`MoeRouteGemv`, `fold_moe_norm`)
# Here:  bash scripts/gpu-deepseek-b1.sh --prepare    (fills .gpu/dsb1, ~45 MB)
# There: carry [".gpu/dsb1"], run `bash scripts/gpu-deepseek-b1.sh [--short]` (~4 min; --short:
# b1 of base, all and the variants only, no timeline): their kernel
# checks (both slot orders, the norm-folded kernels, the cache-writing attention, the folded
# router), the 2-layer V2-Lite plan and v3-tiny (bf16 weights) with all three on decoding
# against the CPU executor, then b1 decode of the V2-Lite shape for each plan (two rounds of
# base and all) and the CUPTI timeline of `all`. A fusion that wins turns on by default in
# codegen/src/options.rs; one that loses is deleted.
set -uo pipefail
cd "$(dirname "$0")/.."
D=.gpu/dsb1
ALL="DSC_MOE_PREFETCH=1 DSC_MLA_CACHE_ATTN=1 DSC_MOE_ROUTER=1"
if [ "${1:-}" = "--prepare" ]; then
  set -e
  cargo build --release -p dsc-compiler -p dsc-runtime
  rm -rf $D && mkdir -p $D/check .cache
  xz -T2 -6 -c target/release/dsc-runtime > $D/dsc-runtime.xz
  ./target/release/dsc gpu-bundle --dir $D/check --only moe_gate_up,moe_down,_w_l512,moe_route
  rm -f $D/check/kernels.ll $D/check/kernels.mlir $D/check/kernels.sm_80.ptx
  xz -T2 -6 -f $D/check/data.bin
  c() { local m=$1 name=$2; shift 2; env "$@" ./target/release/dsc compile "$m" -o $D/$name.plan > /dev/null; xz -T2 -6 -f $D/$name.plan; }
  m=models/deepseek-v2-lite-seeded.toml
  c $m base
  c $m pf DSC_MOE_PREFETCH=1
  c $m ca DSC_MLA_CACHE_ATTN=1
  c $m rt DSC_MOE_ROUTER=1
  c $m all $ALL
  c models/deepseek-v2-lite-2layer-seeded.toml l2all $ALL
  printf '[model]\nname = "v3-tiny"\narchitecture = "deepseek"\n\n[weights]\nformat = "safetensors"\npath = "%s"\n\n[limits]\nmax_seq_len = 64\nkv_block_size = 4\nmax_batch = 4\n\n[precision]\nweights = "bf16"\nactivations = "f32"\n' \
    "$PWD/tests/fixtures/deepseek/v3-tiny" > .cache/ds-v3-tiny-bf16w.toml
  c .cache/ds-v3-tiny-bf16w.toml v3tall $ALL
  du -sh $D
  exit 0
fi
out=${OUT:-/tmp/out}
mkdir -p "$out"
status=0
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/device.txt"
for f in $D/*.xz $D/check/data.bin.xz; do xz -d -f -T8 "$f"; done
chmod +x $D/dsc-runtime
RT=$D/dsc-runtime
b1() { echo "-- $1 round $2"; $RT bench $D/$1.plan --batches 1 --prefill 64 --prompt-len 32 --new-tokens 64 2>&1 | grep -E "^decode" | head -2; }
{
  echo "== kernel checks"
  $RT gpu-check $D/check --target sm_90a 2>&1 | tail -4
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
  echo "== decode against the CPU executor (all three on)"
  $RT gpu-decode $D/l2all.plan --prompt-len 16 --steps 64 --cpu-check-steps 3 2>&1 | tail -2
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
  $RT gpu-decode $D/v3tall.plan --prompt-len 8 --steps 32 --cpu-check-steps 8 2>&1 | tail -2
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
  # (variants a one-off compiler built beside the plans above, if any: l2<name>.plan checked
  # against the CPU, <name>.plan timed)
  extra=$(cd $D && ls | sed -n 's/^l2\(all_[a-z0-9]*\)\.plan$/\1/p')
  for p in $extra; do
    $RT gpu-decode $D/l2$p.plan --prompt-len 16 --steps 64 --cpu-check-steps 3 2>&1 | tail -1
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
  done
  echo "== V2-Lite shape, decode b1"
  if [ "${1:-}" = "--short" ]; then
    for p in base all $extra base all; do b1 $p 1; done
  else
    for p in base all pf ca rt $extra; do b1 $p 1; done
    for p in base all $extra; do b1 $p 2; done
  fi
} 2>&1 | tee "$out/log.txt"
[ "${1:-}" = "--short" ] && exit $status
first=$(python3 -c "
import json, struct
f = open('$D/all.plan', 'rb'); pre = f.read(104); h = json.loads(f.read(struct.unpack_from('<Q', pre, 16)[0]))
print(next(s['kernel'] for s in h['gpu']['steps'] if s['kernel'] and not s.get('min_rows')))")
mkdir -p "$out/tl"
OUT="$out/tl" bash scripts/gpu-timeline.sh $RT $D/all.plan "$first" --batches 1 --prefill 8 --new-tokens 96 2>&1 | tail -25 | tee "$out/tl.txt"
exit $status
