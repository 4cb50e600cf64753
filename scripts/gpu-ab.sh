#!/usr/bin/env bash
# Same-call A/B of plan pairs, run ON the H200 with a folder carried that holds dsc-runtime,
# a-<name>.plan and b-<name>.plan pairs (e.g. compiled without and with a codegen knob) and,
# optionally, check/ (a `dsc gpu-bundle --only ..` bundle of the B plans' new kernels).
# Per pair: the bundle check first, token streams compared (compare-plans), then the engine
# bench alternating A, B, A, B (lent H200s differ ~2% between calls: compare within one).
# AB_DIR (default .gpu/ab), AB_BATCHES (1,32,128), AB_PREFILL (512,4096), AB_SEQS (32), AB_NEW
# (new tokens per sequence in the bench, 64; the harness's bench/run.sh runs 128);
# AB_GEMM=512,4096: bench-gemm of both plans at those rows first (their GEMMs alone).
# AB_ATTN=512,4096,16384: bench-attention of both plans at those prefill lengths, alternating
# a, b, a, b (the attention kernel alone; e.g. DSC_FLASH_POS32=0 against the default).
# AB_ENV_A / AB_ENV_B: runtime environment of the a / b runs (e.g. one plan copied to both
# names and AB_ENV_A=DSC_PDL_MAX_TOKENS=32: a runtime knob A/B'd in one call).
set -uo pipefail
dir=${AB_DIR:-.gpu/ab}
out=${OUT:-$dir/out}
mkdir -p "$out"
rt=$dir/dsc-runtime
if [ -d "$dir/check" ]; then
  timeout 200 $rt gpu-check "$dir/check" --target sm_90a --json "$out/check.json" > "$out/check.log" 2>&1
  echo "bundle: rc=$? $(tail -1 "$out/check.log")"
fi
for a in "$dir"/a-*.plan; do
  n=$(basename "$a" .plan); n=${n#a-}
  b=$dir/b-$n.plan
  if [ -n "${AB_GEMM:-}" ]; then
    for v in a b; do
      timeout 120 $rt bench-gemm "$dir/$v-$n.plan" --m "$AB_GEMM" --json "$out/gemm-$v-$n.json" 2>&1 | grep -E "TFLOP" | sed "s/^/$v-$n /"
    done
  fi
  if [ -n "${AB_ATTN:-}" ]; then
    for r in 1 2; do
      for v in a b; do
        timeout 120 $rt bench-attention "$dir/$v-$n.plan" --prefill "$AB_ATTN" 2>&1 | grep -E "prefill" | sed "s/^/$v$r-$n /"
      done
    done
  fi
  timeout 120 $rt compare-plans "$a" "$b" --seqs "${AB_SEQS:-32}" --new-tokens 32 2>&1 | tail -1 | sed "s/^/$n streams: /"
  for r in 1 2; do
    for v in a b; do
      [ $v = a ] && e=${AB_ENV_A:-} || e=${AB_ENV_B:-}
      timeout 200 env $e $rt bench "$dir/$v-$n.plan" --batches "${AB_BATCHES:-1,32,128}" --prefill "${AB_PREFILL:-512,4096}" --new-tokens "${AB_NEW:-64}" --json "$out/$v-$n-$r.json" > "$out/$v-$n-$r.log" 2>&1
    done
  done
done
# the table: every run's decode tok/s per batch and prefill tok/s per length
python3 - "$out" <<'PY'
import glob, json, os, sys
rows = []
for f in sorted(glob.glob(os.path.join(sys.argv[1], "[ab]-*-[12].json"))):
    d = json.load(open(f))
    dec = " ".join(f"b{r['batch']}={r['decode_tokens_per_s']:.0f}({r.get('graph_ms') or 0:.3f}ms)" for r in d.get("decode", []))
    pre = " ".join(f"p{r['tokens']}={r['tokens_per_s']:.0f}" for r in d.get("prefill", []))
    print(f"{os.path.basename(f)[:-5]:<16} {dec}  {pre}")
PY
