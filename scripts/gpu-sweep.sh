#!/usr/bin/env bash
# Decode/prefill sweep over a folder of plans, run ON the H200 with .gpu/dsc-runtime and
# .gpu/sweep/ carried (e.g. plans compiled with different GEMV tilings,
# DSC_ATTN_KEYS=8, or with and without --optimize). Checks the first plan's first decode
# steps against the CPU executor, then benches every plan; DSC_PROFILE=1 on the first plan
# gives its per-kernel table. Results under $OUT (or .gpu/out); a table printed last.
set -uo pipefail
out=${OUT:-.gpu/out}
mkdir -p "$out"
dir=${1:-.gpu/sweep}
batches=${BATCHES:-1,8,32}
first=$(ls "$dir"/*.plan | head -1)
.gpu/dsc-runtime gpu-decode "$first" --prompt-len 16 --steps 32 --cpu-check-steps 2 --json "$out/check.json" 2>&1 | tail -4
# a plan compiled under SWEEP_ENV (gpu-prepare.sh) is checked against the CPU too
if [ -f "$dir/8b-env.plan" ]; then
  echo "8b-env:"; .gpu/dsc-runtime gpu-decode "$dir/8b-env.plan" --prompt-len 16 --steps 8 --cpu-check-steps 2 2>&1 | tail -3
fi
# ... and at a long context on the SmolLM2 shape (the split decode attention takes contexts
# of 512+ keys: lower::ATTN_SPLIT_FROM_KEYS), with the decode attention alone (one-pass and
# split) at three contexts
for p in "$dir/smol.plan" "$dir/smol-env.plan"; do
  [ -f "$p" ] && { echo "$(basename $p), 1000-token prompt:"; .gpu/dsc-runtime gpu-decode "$p" --prompt-len 1000 --steps 4 --cpu-check-steps 2 2>&1 | tail -3; }
done
for p in "$first" "$dir/8b-env.plan"; do
  [ -f "$p" ] && { echo "$(basename $p): decode attention alone"; .gpu/dsc-runtime bench-attention "$p" --prefill 64 --decode-context 256,512,1024,8192 2>/dev/null | grep decode; }
done
# (the device returns only a few files: everything goes into $out/runs/, summarised in
# $out/sweep.json, and the per-run logs into $out/sweep.log)
mkdir -p /tmp/sweep-runs
for p in "$dir"/*.plan; do
  n=$(basename "$p" .plan)
  echo "== $n" >> "$out/sweep.log"
  .gpu/dsc-runtime bench "$p" --batches "$batches" --prefill 512 --new-tokens 64 --json "/tmp/sweep-runs/$n.json" >> "$out/sweep.log" 2>&1 || echo "$n: FAILED (see sweep.log)"
done
# LONG=N (e.g. 4000): every plan's decode once more from an N-token prompt (LONG_BATCHES,
# default 1,8), as <plan>-long
if [ -n "${LONG:-}" ]; then
  for p in "$dir"/*.plan; do
    n=$(basename "$p" .plan)-long
    echo "== $n" >> "$out/sweep.log"
    .gpu/dsc-runtime bench "$p" --batches "${LONG_BATCHES:-1,8}" --prompt-len "$LONG" --prefill 512 --new-tokens 32 --json "/tmp/sweep-runs/$n.json" >> "$out/sweep.log" 2>&1 || echo "$n: FAILED (see sweep.log)"
  done
fi
# AB_ENV="VAR=value": the first plan (AB_ALL=1: every plan) once more with that runtime
# environment (as <plan>+env)
if [ -n "${AB_ENV:-}" ]; then
  for p in "$dir"/*.plan; do
    [ -z "${AB_ALL:-}" ] && [ "$p" != "$first" ] && continue
    n=$(basename "$p" .plan)+env
    echo "== $n ($AB_ENV)" >> "$out/sweep.log"
    env $AB_ENV .gpu/dsc-runtime bench "$p" --batches "$batches" --prefill 512 --new-tokens 64 --json "/tmp/sweep-runs/$n.json" >> "$out/sweep.log" 2>&1 || echo "$n: FAILED"
  done
fi
DSC_PROFILE=1 .gpu/dsc-runtime bench "$first" --batches ${PROFILE_BATCH:-1} --prefill 16 --new-tokens 32 --json "/tmp/sweep-runs/profile.json" >> "$out/sweep.log" 2>&1
# PROFILE_ALL=1: every other plan's per-kernel table too (as profile-<plan>, in sweep.log and
# sweep.json; e.g. GEMV tilings compared kernel by kernel)
if [ -n "${PROFILE_ALL:-}" ]; then
  for p in "$dir"/*.plan; do
    [ "$p" = "$first" ] && continue
    n=$(basename "$p" .plan)
    echo "== profile-$n" >> "$out/sweep.log"
    DSC_PROFILE=1 .gpu/dsc-runtime bench "$p" --batches ${PROFILE_BATCH:-1} --prefill 16 --new-tokens 32 --json "/tmp/sweep-runs/profile-$n.json" >> "$out/sweep.log" 2>&1
  done
fi
python3 - "$out" <<'PY'
import json, sys, glob, os
out = sys.argv[1]
runs = {os.path.basename(f)[:-5]: json.load(open(f)) for f in sorted(glob.glob("/tmp/sweep-runs/*.json"))}
json.dump(runs, open(f"{out}/sweep.json", "w"), indent=1)
prof = runs["profile"]["decode"][0]["profile"]
print("profile (first plan): kernel, launches/step, us/step")
for k, n, us in prof[:14]:
    print(f"  {k:<40} {n:>5.0f} {us:>9.1f}")
for name, j in runs.items():
    if name.startswith("profile-"):
        print(f"profile {name[8:]}: " + ", ".join(f"{k.split('_bf16')[0]} {us:.0f}" for k, n, us in j["decode"][0]["profile"][:8]))
for name, j in runs.items():
    if name.startswith("profile"):
        continue
    d = "  ".join(f"b{x['batch']} {x['decode_tokens_per_s']:.0f} tok/s ({x['ms_per_step']:.2f} ms)" for x in j["decode"])
    p = "  ".join(f"prefill {x['tokens']} {x['tokens_per_s']:.0f} tok/s" for x in j["prefill"])
    print(f"{name:<14} {d}  {p}")
PY
