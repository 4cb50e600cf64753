#!/usr/bin/env bash
# GPU check, run ON the GPU machine from the repo root, with .gpu/ carried (built by
# scripts/gpu-prepare.sh): runs every generated kernel against the CPU reference outputs
# in the bundle (if .gpu/check was carried), then 128 decode steps of the Llama-3-8B-shape
# plan (if .gpu/llama3-8b.plan was carried); results under $OUT. The bundle and the runtime
# nearly fill one call's 64 MiB: carry the plan in a second call.
set -uo pipefail
out=${OUT:-.gpu/out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
status=0
# (the runtime carried gzipped beside the bundle: scripts/gpu-prepare.sh)
if [ -f .gpu/dsc-runtime.gz ]; then gunzip -c .gpu/dsc-runtime.gz > .gpu/dsc-runtime && chmod +x .gpu/dsc-runtime; fi
# (or xz-compressed, by python's lzma: gpu-prepare.sh's .gpu/rtx, what fits beside the bundle)
if [ -f .gpu/rtx/dsc-runtime.xz ]; then python3 -c "import lzma, shutil; shutil.copyfileobj(lzma.open('.gpu/rtx/dsc-runtime.xz'), open('.gpu/dsc-runtime', 'wb'))" && chmod +x .gpu/dsc-runtime; fi
if [ -d .gpu/check ]; then
  # (gpu-prepare.sh ships the PTX and the data gzipped: the bundle and the runtime fill a call's 64 MiB)
  [ -f .gpu/check/kernels.sm_90a.ptx.gz ] && gunzip -f .gpu/check/kernels.sm_90a.ptx.gz
  [ -f .gpu/check/data.bin.gz ] && gunzip -f .gpu/check/data.bin.gz
  # (xz by python's lzma: no xz tool needed there)
  [ -f .gpu/check/data.bin.xz ] && python3 -c "import lzma, shutil; shutil.copyfileobj(lzma.open('.gpu/check/data.bin.xz'), open('.gpu/check/data.bin', 'wb'))" && rm .gpu/check/data.bin.xz
  [ -f .gpu/check/bundle.json.gz ] && gunzip -f .gpu/check/bundle.json.gz
  .gpu/dsc-runtime gpu-check .gpu/check --target sm_90a --json "$out/kernels-sm_90a.json" 2>&1 | tee "$out/kernels.log"
  status=${PIPESTATUS[0]}
  # the SASS of the generated module, to see what the hardware runs
  if command -v cuobjdump >/dev/null && command -v ptxas >/dev/null; then
    ptxas -arch=sm_90a .gpu/check/kernels.sm_90a.ptx -o /tmp/k.cubin && cuobjdump --dump-sass /tmp/k.cubin > "$out/kernels.sass" 2>&1
    echo "SASS: $(grep -c MUFU "$out/kernels.sass") MUFU, $(grep -c HMMA "$out/kernels.sass") HMMA (mma.sync), $(grep -c HGMMA "$out/kernels.sass") HGMMA (wgmma) instructions"
    grep -B2 -m3 HMMA "$out/kernels.sass" | head -8
  fi
fi
# the Llama-3-8B-shape plan (seeded weights, generated on the device): 128 decode steps,
# the first 2 checked against the CPU executor
if [ -f .gpu/llama3-8b.plan ]; then
  .gpu/dsc-runtime gpu-decode .gpu/llama3-8b.plan --prompt-len 16 --steps 128 --cpu-check-steps 2 --json "$out/llama3-8b-decode.json" 2>&1 | tee "$out/llama3-8b.log"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi
# prefill on the tensor cores: the sm_90a kernels (pipelined wgmma; label "wgmma") vs
# mma.sync (DSC_NO_WGMMA=1)
if [ -f .gpu/llama3-8b.plan ]; then
  for p in 64 512; do
    for v in wgmma mma; do
      env $( [ $v = mma ] && echo DSC_NO_WGMMA=1 ) .gpu/dsc-runtime gpu-decode .gpu/llama3-8b.plan --prompt-len $p --steps 4 --cpu-check-steps 0 --json "$out/prefill-$p-$v.json" 2>&1 | grep -E "prefill" | sed "s/^/$v: /"
    done
  done
fi
exit $status
