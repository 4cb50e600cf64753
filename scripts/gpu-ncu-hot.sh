#!/usr/bin/env bash
# Where one kernel's time goes, on the H200: ncu `--set full` on one launch of the kernels
# matching REGEX while `dsc-runtime ARGS..` runs, then the stall reasons (sampled) and the
# SASS lines with the most stall samples. Run ON the GPU machine with the runtime and plan
# carried, e.g. (session 14, the prefill attention at 4k):
#   bash scripts/gpu-ncu-hot.sh flash_attention 3 .gpu/x/dsc-runtime bench-attention .gpu/x/8b.plan --prefill 4096
#   bash scripts/gpu-ncu-hot.sh rms_matmul_swiglu 200 .gpu/x/dsc-runtime bench .gpu/x/smol.plan --batches 1 --prefill 16 --new-tokens 16
# (SKIP: launches of the kernel to skip first.) Writes $OUT/ncu-hot-{stalls,sass}.txt.
set -uo pipefail
re=$1; skip=$2; shift 2
out=${OUT:-/tmp}
rep=/tmp/ncu-hot
timeout 300 ncu --clock-control none --set full --import-source no -k "regex:$re" --launch-skip "$skip" --launch-count 1 -o "$rep" -f "$@" > /tmp/ncu-hot.log 2>&1
echo "ncu rc=$? $(tail -1 /tmp/ncu-hot.log)"
ncu --import "$rep.ncu-rep" --page raw --csv 2>/dev/null | python3 -c "
import csv, sys
r = list(csv.reader(sys.stdin)); h, v = r[0], r[2]
xs = []
for i, n in enumerate(h):
    if 'pcsamp_warps_issue_stalled' in n and not n.endswith('not_issued'):
        try: xs.append((float(v[i].replace(',', '')), n.replace('smsp__pcsamp_warps_issue_stalled_', '')))
        except ValueError: pass
t = sum(x for x, _ in xs) or 1
for x, n in sorted(xs, reverse=True)[:14]: print(f'{100 * x / t:5.1f}%  {n}')
" | tee "$out/ncu-hot-stalls.txt"
ncu --import "$rep.ncu-rep" --page source --print-source sass --csv 2>/dev/null | python3 -c "
import csv, sys
rows = list(csv.reader(sys.stdin))
k = [i for i, r in enumerate(rows) if 'Source' in r][0]
h = rows[k]; si = h.index('Source'); wi = h.index('Warp Stall Sampling (All Samples)')
data = []
for i, r in enumerate(rows[k + 1:]):
    if len(r) < len(h): continue
    try: w = float(r[wi].replace(',', ''))
    except ValueError: w = 0
    data.append((w, i, r[si]))
t = sum(d[0] for d in data) or 1
print(f'{len(data)} SASS instructions, {t:.0f} samples; the hottest:')
for w, i, s in sorted(data, reverse=True)[:40]: print(f'{100 * w / t:5.1f}% {i:5d}  {s}')
" | tee "$out/ncu-hot-sass.txt" | head -44
