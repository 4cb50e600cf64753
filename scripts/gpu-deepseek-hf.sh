#!/usr/bin/env bash
# DeepSeek at full width against HF transformers, on the GPU machine (torch + transformers):
# the seeded V2-Lite-dims plan's weights exported as an HF checkpoint, HF's f32 logits beside
# dsc's on the CPU executor and on the GPU (BACKENDS="cpu gpu"), teacher-forced over 16 tokens.
# Here: bash scripts/gpu-deepseek-hf.sh --prepare   (fills .gpu/dshf: runtime, plan, scripts)
# There: carry [".gpu/dshf"], run `bash .gpu/dshf/run.sh` ; results under $OUT.
set -euo pipefail
[ "${1:-}" = "--prepare" ] && cd "$(dirname "$0")/.."
if [ "${1:-}" = "--prepare" ]; then
  mkdir -p .gpu/dshf
  cargo build --release -p dsc-compiler -p dsc-runtime
  cp target/release/dsc-runtime .gpu/dshf/
  for m in v2-lite-2layer v3-4layer v3-4layer-f32kv; do
    ./target/release/dsc compile models/deepseek-$m-seeded.toml -o .gpu/dshf/$m.plan
  done
  cp models/deepseek-v2-lite-2layer.config.json .gpu/dshf/v2-lite-2layer.config.json
  cp models/deepseek-v3-4layer.config.json .gpu/dshf/v3-4layer.config.json
  cp models/deepseek-v3-4layer.config.json .gpu/dshf/v3-4layer-f32kv.config.json
  cp tests/fixtures/deepseek/hf_compare.py .gpu/dshf/
  cp scripts/gpu-deepseek-hf.sh .gpu/dshf/run.sh
  du -sh .gpu/dshf
  exit 0
fi
D=.gpu/dshf
OUT=${OUT:-/tmp/out}
IDS=100000,17,3013,45,998,12000,7,65535,2048,33,5000,777,88888,4,1234,102399
for m in ${MODELS:-v2-lite-2layer v3-4layer v3-4layer-f32kv}; do
  time $D/dsc-runtime export-weights $D/$m.plan -o /tmp/hf-$m
  cp $D/$m.config.json /tmp/hf-$m/config.json
  for be in ${BACKENDS:-cpu gpu}; do
    time $D/dsc-runtime logits $D/$m.plan --ids $IDS --backend $be -o /tmp/dsc-$m-$be.json
    python3 $D/hf_compare.py /tmp/hf-$m /tmp/dsc-$m-$be.json $OUT/deepseek-hf-$m-$be.json
  done
  rm -rf /tmp/hf-$m
done
