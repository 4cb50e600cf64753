#!/usr/bin/env bash
# Prefill GEMM sweep, run ON the H200 with .gpu/dsc-runtime and .gpu/gemm/ carried: every plan
# in .gpu/gemm/ (built by `GEMM_SWEEP="128,4,1,0 128,6,1,1" bash scripts/gpu-gemm-sweep.sh
# prepare` here: the Llama-3-8B shape compiled under DSC_GEMM_PIPE=<variant> = BN,stages,
# overlap,x-in-16-bits, see codegen kernels::pipe_tiling) through `dsc-runtime bench-gemm` at
# M = 512 and 4096 and a 512- and 4096-token prefill; the SmolLM2-shape plan of the first
# variant runs a 300-token prefill checked against the CPU executor (every prefill kernel,
# the cast included). JSON per plan under $OUT, a table last.
set -uo pipefail
if [ "${1:-}" = prepare ]; then
  cd "$(dirname "$0")/.."
  rm -rf .gpu/gemm && mkdir -p .gpu/gemm
  first=""
  for v in ${GEMM_SWEEP:-128,4,1,0}; do
    DSC_GEMM_PIPE=$v ./target/release/dsc compile models/llama3-8b-seeded.toml -o ".gpu/gemm/pipe-${v//,/_}.plan" 2>/dev/null
    [ -n "$first" ] || { first=$v; DSC_GEMM_PIPE=$v ./target/release/dsc compile models/smollm2-shape-seeded.toml -o ".gpu/gemm/smol-${v//,/_}.plan" 2>/dev/null; }
  done
  ls .gpu/gemm
  exit 0
fi
out=${OUT:-.gpu/out}
mkdir -p "$out"
for p in .gpu/gemm/smol-*.plan; do
  echo "$(basename "$p"): prefill 300 tokens vs the CPU executor"
  .gpu/dsc-runtime gpu-decode "$p" --prompt-len 300 --steps 4 --cpu-check-steps 2 2>&1 | tail -3
done
for p in .gpu/gemm/pipe-*.plan; do
  n=$(basename "$p" .plan)
  .gpu/dsc-runtime bench-gemm "$p" --m ${GEMM_M:-512,4096} --json "$out/$n.json" > "$out/$n.log" 2>&1 || echo "$n: FAILED"
  for t in 512 4096; do
    echo "$n $(.gpu/dsc-runtime gpu-decode "$p" --prompt-len $t --steps 2 --cpu-check-steps 0 2>&1 | grep -o 'prompt.*prefill [0-9.]* ms')" | tee -a "$out/prefill.log"
  done
done
python3 - "$out" <<'PY'
import json, sys, glob, os
rows = {}
for f in sorted(glob.glob(f"{sys.argv[1]}/pipe-*.json")):
    d = json.load(open(f))
    r = d if isinstance(d, list) else d.get("gemm", d.get("results", []))
    for g in r:
        shape = f"{g['m']}x{g['n']}x{g['k']}"
        rows.setdefault(shape, {})[os.path.basename(f)[5:-5]] = g["tflop_s"]
names = sorted({v for r in rows.values() for v in r})
print("TFLOP/s  " + "  ".join(f"{n:>9}" for n in names))
for s, r in rows.items():
    print(f"{s:<22}" + "  ".join(f"{r.get(n, 0):>9.1f}" for n in names))
PY
