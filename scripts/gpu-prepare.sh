#!/usr/bin/env bash
# Build what the GPU machine needs into .gpu/ (git-ignored), for three `run` calls:
#   1. carry [".gpu/check", ".gpu/rtx"]: bash scripts/gpu-check.sh
#      (the runtime xz-compressed, 2.8 MB: with the bundle's data even the gzipped one, 4.0 MB,
#      passed a call's 64 MiB since session 21; where the tracked tree has grown past it too,
#      carry [".gpu/rtx"] first: mkdir -p ~/cache && cp .gpu/rtx/dsc-runtime.xz ~/cache/, then
#      carry [".gpu/check"]: mkdir -p .gpu/rtx && cp ~/cache/dsc-runtime.xz .gpu/rtx/ &&
#      bash scripts/gpu-check.sh)
#      (every generated kernel vs the CPU executor's outputs); then carry
#      [".gpu/dsc-runtime", ".gpu/llama3-8b.plan"]: bash scripts/gpu-check.sh (8B decode, prefill)
#   2. carry [".gpu/p1"]: mkdir -p ~/cache && mv .gpu/p1/smol.plan.part.aa ~/cache/, then
#      carry [".gpu/p1b"]: mv .gpu/p1b/smol.plan.part.ab ~/cache/
#   3. right after (the machine stays warm 30 s), carry [".gpu/p2"]: bash scripts/gpu-e2e.sh
#      (SmolLM2 plan, split in three because one call carries at most 64 MiB)
# Serving: also builds .gpu/serve/ (SmolLM2 shape and Llama-3-8B shape, seeded weights with
# SmolLM2's tokenizer, + the load script); carry [".gpu/dsc-runtime", ".gpu/serve"]:
# bash scripts/gpu-serve.sh
# Performance (issue 6): carry [".gpu/dsc-runtime", ".gpu/bench"]: bash bench/run.sh
# Tensor parallelism (kind nvidia-h200-x2): also builds .gpu/tp/ (Llama-3-8B shape whole, tp=1,
# tp=2); carry [".gpu/check", ".gpu/dsc-runtime", ".gpu/tp"]: bash scripts/gpu-tp.sh
# A/B sweep (.gpu/sweep/: the default plans, and the same with an optimizer rule off,
# SWEEP_RULE=name, or compiled under SWEEP_ENV="VAR=value"): first the kernel check (carry
# [".gpu/check", ".gpu/dsc-runtime"]: bash scripts/gpu-check.sh), then at once (warm machine)
# carry [".gpu/sweep", ".gpu/dsc-runtime"]: BATCHES=1,8,32 bash scripts/gpu-sweep.sh
# (e.g. SWEEP_ENV="DSC_FEW_X16=0 DSC_PIPE_MIN_ROWS=129": batched decode as before session 6;
# DSC_ATTN_KEYS=8: the decode attention's keys per warp step; DSC_ATTN_GROUP=0: no grouped
# (block per KV head) decode attention; DSC_SILU_HALF=0: silu_mul without the down
# projection's bf16 copy; DSC_SPLITK_NORM=1: the split-K reduce folded into the next RMSNorm,
# measured slower; DSC_TMA=all / DSC_TMA=0: W tiles by TMA in every pipelined matmul / none;
# DSC_ATTN_PREFETCH=1: the decode attention prefetches the o projection's weights into L2,
# measured slower.
# The bundle holds TMA cases: gpu-check.sh runs under `timeout 150`)
# Prefill GEMM tilings: scripts/gpu-gemm-sweep.sh (its header)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p dsc-compiler -p dsc-runtime
mkdir -p .gpu .cache
cp target/release/dsc-runtime .gpu/
gzip -9 -c target/release/dsc-runtime > .gpu/dsc-runtime.gz
mkdir -p .gpu/rtx && xz -9 -T2 -c target/release/dsc-runtime > .gpu/rtx/dsc-runtime.xz
# (under SWEEP_ENV, when set: a codegen knob's kernels are then what the check verifies)
env ${SWEEP_ENV:-} ./target/release/dsc gpu-bundle --dir .gpu/check
# the MLIR/LLVM dumps are for people and the sm_80 PTX for an A100, not the H200 (they would
# crowd the 64 MiB a call carries, which also counts the tracked files)
mkdir -p .gpu/check-dumps && mv .gpu/check/kernels.ll .gpu/check/kernels.mlir .gpu/check/kernels.sm_80.ptx .gpu/check-dumps/
# (the PTX gzipped, 3.4 -> 0.9 MB, and the cases' data, 62 -> 51 MB: gpu-check.sh unpacks
# them there. Session 14: data 60.2 MB + PTX 1.3 + the gzipped runtime 4.0 + the tracked
# files 5.0 = 66.5 of the 67.1 MB a call carries — ~0.6 MB left: new cases need smaller pools
# elsewhere, a probe's cases go behind its knob (as DSC_ATTN_O=1's), or the check splits
# into two calls with `dsc gpu-bundle --only`)
gzip -f .gpu/check/kernels.sm_90a.ptx
# (the data by xz since session 17: 52.1 MB where gzip made 55.9 — the q/k/v-from-x case had
# brought the call past its limit; and the cases' list gzipped, 0.3 MB -> 16 KB)
xz -T2 -6 -f .gpu/check/data.bin
gzip -9 -f .gpu/check/bundle.json
./target/release/dsc compile models/llama3-8b-seeded.toml -o .gpu/llama3-8b.plan
mkdir -p .gpu/tp
cp .gpu/llama3-8b.plan .gpu/tp/llama3-8b.plan
for n in 1 2; do ./target/release/dsc compile models/llama3-8b-seeded.toml --tp $n -o .gpu/tp/llama3-8b-tp$n.plan; done
rm -rf .gpu/serve && mkdir -p .gpu/serve
./target/release/dsc compile models/smollm2-shape-seeded.toml -o .gpu/serve/smollm2-shape.plan
# the 8B shape with SmolLM2's tokenizer (its vocabulary fits in 128256)
sed "s/^name = .*/name = \"llama3-8b-seeded\"/" models/llama3-8b-seeded.toml > .cache/llama3-8b-serve.toml
printf '\n[tokenizer]\ngguf = "%s"\n' "$PWD/.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf" >> .cache/llama3-8b-serve.toml
./target/release/dsc compile .cache/llama3-8b-serve.toml -o .gpu/serve/llama3-8b.plan
cp tests/serve/load.py bench/serve.py .gpu/serve/
# the performance harness (bench/run.sh): bench plans, the PyTorch peer scripts, the chart
rm -rf .gpu/bench && mkdir -p .gpu/bench
cp .gpu/llama3-8b.plan .gpu/bench/llama3-8b.plan
rm -rf .gpu/sweep && mkdir -p .gpu/sweep
cp .gpu/llama3-8b.plan .gpu/sweep/0-8b.plan
cp .gpu/serve/smollm2-shape.plan .gpu/sweep/smol.plan
# A/B: SWEEP_RULE=name compiles the plans once more with that optimizer rule off;
# SWEEP_ENV="VAR=value" once more under that compile-time environment (codegen knobs)
if [ -n "${SWEEP_RULE:-}" ]; then
  ./target/release/dsc compile models/llama3-8b-seeded.toml --rule $SWEEP_RULE=off -o .gpu/sweep/8b-no-$SWEEP_RULE.plan
  ./target/release/dsc compile models/smollm2-shape-seeded.toml --rule $SWEEP_RULE=off -o .gpu/sweep/smol-no-$SWEEP_RULE.plan
fi
if [ -n "${SWEEP_ENV:-}" ]; then
  env $SWEEP_ENV ./target/release/dsc compile models/llama3-8b-seeded.toml -o .gpu/sweep/8b-env.plan
  env $SWEEP_ENV ./target/release/dsc compile models/smollm2-shape-seeded.toml -o .gpu/sweep/smol-env.plan
fi
cp .gpu/serve/smollm2-shape.plan .gpu/bench/smollm2-135m.plan
cp ../shared/bench/torch_kernels.py ../shared/bench/torch_compiled.py bench/chart.py .gpu/bench/
./target/release/dsc compile models/smollm2-135m.toml -o .cache/smol.plan
# (101 MB since the quantized batched GEMVs: three parts, two calls moving parts to ~/cache)
rm -rf .gpu/p1 .gpu/p2 .gpu/p1b && mkdir -p .gpu/p1 .gpu/p1b .gpu/p2
rm -f .cache/smol.plan.part.*
split -b 40M .cache/smol.plan .cache/smol.plan.part.
mv .cache/smol.plan.part.aa .gpu/p1/smol.plan.part.aa
mv .cache/smol.plan.part.ab .gpu/p1b/smol.plan.part.ab
mv .cache/smol.plan.part.ac .gpu/p2/smol.plan.part.ac
# (the runtime gzipped: plain, with the plan's part and the tracked files, it passes the 64 MiB
# a call carries; gpu-e2e.sh unpacks it)
gzip -9 -c target/release/dsc-runtime > .gpu/p2/dsc-runtime.gz
cp ../shared/reference/smollm2-q4_1-numpy-public.json .gpu/p2/
sha256sum .cache/smol.plan | cut -d' ' -f1 > .gpu/p2/plan.sha256
du -sh .gpu/check .gpu/p1 .gpu/p1b .gpu/p2
