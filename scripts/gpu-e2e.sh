#!/usr/bin/env bash
# On the GPU machine (third of three calls; the first two moved .gpu/p1/* and .gpu/p1b/* to ~/cache): rebuild the
# SmolLM2 plan from its parts, check its sha256, and run the end-to-end GPU check against the
# CPU executor and the reference continuations. Results under $OUT.
set -uo pipefail
out=${OUT:-.gpu/out}; mkdir -p "$out"
cat ~/cache/smol.plan.part.aa ~/cache/smol.plan.part.ab .gpu/p2/smol.plan.part.ac > ~/cache/smol.plan
# (the runtime travels gzipped, see gpu-prepare.sh)
[ -f .gpu/p2/dsc-runtime.gz ] && { gunzip -c .gpu/p2/dsc-runtime.gz > .gpu/p2/dsc-runtime; chmod +x .gpu/p2/dsc-runtime; }
echo "$(cat .gpu/p2/plan.sha256)  $HOME/cache/smol.plan" | sha256sum -c - || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
.gpu/p2/dsc-runtime gpu-e2e ~/cache/smol.plan .gpu/p2/smollm2-q4_1-numpy-public.json --json "$out/e2e.json" 2>&1 | tee "$out/e2e.log"
st=${PIPESTATUS[0]}
.gpu/p2/dsc-runtime run ~/cache/smol.plan --backend gpu --chat --prompt "What is the capital of France?" --max-tokens 32 2>&1 | tee "$out/run.log"
# decode speed with and without CUDA graphs
.gpu/p2/dsc-runtime gpu-decode ~/cache/smol.plan --prompt-len 16 --steps 128 --json "$out/smol-decode-graphs.json" 2>&1 | tee -a "$out/decode.log"
DSC_NO_CUDA_GRAPHS=1 .gpu/p2/dsc-runtime gpu-decode ~/cache/smol.plan --prompt-len 16 --steps 128 --json "$out/smol-decode-nographs.json" 2>&1 | tee -a "$out/decode.log"
exit $st
