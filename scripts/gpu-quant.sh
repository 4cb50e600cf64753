#!/usr/bin/env bash
# Quantized plans on the H200 (issue 33): the quantized batched-GEMV kernels against the CPU
# executor, the SmolLM2 shape with Q4_1 weights from a seed decoding with its first steps checked
# against the CPU executor, and its decode speed beside the bf16 shape's in the same run.
# Here:  bash scripts/gpu-quant.sh --prepare      (fills .gpu/quant: runtime, bundle, plans)
# There: carry [".gpu/quant"], run `bash scripts/gpu-quant.sh` ; results under $OUT.
# (STAGES="check decode bench bench8b policy" picks stages; BATCHES=1,8,32,128 the bench's batch
# sizes; `policy` takes PLANS="q-int4-awq ..." whose parts were carried to ~/cache beforehand)
set -uo pipefail
cd "$(dirname "$0")/.."
D=.gpu/quant
if [ "${1:-}" = "--prepare" ]; then
  set -e
  cargo build --release -p dsc-compiler -p dsc-runtime
  rm -rf $D && mkdir -p $D
  xz -T2 -6 -c target/release/dsc-runtime > $D/dsc-runtime.xz
  ./target/release/dsc gpu-bundle --dir $D/check --only ${ONLY:-matmul_few32}
  rm -f $D/check/kernels.ll $D/check/kernels.mlir $D/check/kernels.sm_80.ptx
  xz -T2 -6 -f $D/check/data.bin
  ./target/release/dsc compile models/smollm2-shape-seeded.toml -o $D/smollm2-bf16.plan
  ./target/release/dsc compile models/smollm2-shape-q4_1-seeded.toml -o $D/smollm2-q4_1.plan
  ./target/release/dsc compile models/llama3-8b-seeded.toml -o $D/llama3-8b-bf16.plan
  ./target/release/dsc compile models/llama3-8b-q4_1-seeded.toml -o $D/llama3-8b-q4_1.plan
  cp data/coriolanus-act1.txt $D/
  du -sh $D
  exit 0
fi
out=${OUT:-/tmp/out}
mkdir -p "$out"
status=0
python3 -c "import lzma, shutil; shutil.copyfileobj(lzma.open('$D/dsc-runtime.xz'), open('$D/dsc-runtime', 'wb'))" && chmod +x $D/dsc-runtime
stages=${STAGES:-check decode bench}
if [[ " $stages " == *" check "* ]]; then
  python3 -c "import lzma, shutil; shutil.copyfileobj(lzma.open('$D/check/data.bin.xz'), open('$D/check/data.bin', 'wb'))"
  $D/dsc-runtime gpu-check $D/check --target sm_90a --json "$out/quant-kernels.json" 2>&1 | tail -${CHECK_LINES:-30}
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi
if [[ " $stages " == *" decode "* ]]; then
  for p in smollm2-q4_1; do
    $D/dsc-runtime gpu-decode $D/$p.plan --prompt-len ${PROMPT_LEN:-40} --steps 64 --cpu-check-steps 3 --json "$out/quant-decode-$p.json" 2>&1 | tail -7
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
  done
fi
if [[ " $stages " == *" bench "* ]]; then
  for p in smollm2-bf16 smollm2-q4_1; do
    $D/dsc-runtime bench $D/$p.plan --batches ${BATCHES:-1,8,32,128} --prefill ${PREFILL:-512} --prompt-len 32 --new-tokens 64 --json "$out/quant-bench-$p.json" 2>&1 | grep -E "batch|prefill +[0-9]+ tokens"
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
  done
fi
if [[ " $stages " == *" bench8b "* ]]; then
  # the Llama-3-8B shape: bf16 beside every matrix in Q4_1 (int4 in 32-value blocks)
  for p in llama3-8b-bf16 llama3-8b-q4_1; do
    $D/dsc-runtime bench $D/$p.plan --batches ${BATCHES8B:-1,32} --prefill 512 --prompt-len 32 --new-tokens 32 --json "$out/quant-bench-$p.json" 2>&1 | grep -E "batch|prefill +[0-9]+ tokens"
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
  done
fi
if [[ " $stages " == *" policy "* ]]; then
  # plans `dsc compile --quant` made of the real SmolLM2 GGUF, carried in parts to ~/cache
  # (PLANS="q-int4-awq ..."): perplexity on the H200 and decode speed
  for p in ${PLANS:-}; do
    cat ~/cache/$p.plan.part.* > ~/cache/$p.plan
    $D/dsc-runtime ppl ~/cache/$p.plan $D/coriolanus-act1.txt --backend gpu 2>&1 | tee "$out/ppl-$p.txt" | tail -1
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
    $D/dsc-runtime bench ~/cache/$p.plan --batches 1,8,32,128 --prefill 512 --prompt-len 32 --new-tokens 64 --json "$out/quant-bench-$p.json" 2>&1 | grep -E "batch|prefill +[0-9]+ tokens"
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
  done
fi
exit $status
