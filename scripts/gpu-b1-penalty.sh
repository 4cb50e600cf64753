#!/usr/bin/env bash
# The harness's b1 penalty (docs/perf.md "Session 17", item 5): the b1 decode step's graph
# replays slower in a process whose KV pools are sized for more sequences (bench --batches
# 1,128 vs --batches 1) — it follows the pools' size, which moves every later allocation.
# Run ON the H200 with a runtime and a SmolLM2-shape plan carried, e.g.
#   bash scripts/gpu-b1-penalty.sh .gpu/qk/dsc-runtime .gpu/qk/b.plan
# Prints b1 tok/s and the graph replay for: b1 alone, b1 in a 128-sequence process, and the
# latter with the arena moved (DSC_ARENA_PAD / DSC_ARENA_ALIGN, runtime measurement knobs).
set -uo pipefail
rt=$1; plan=$2
run() { env $2 "$rt" bench "$plan" --batches "$1" --prefill 16 --new-tokens 128 2>&1 | grep -E "^decode b1:|rror" | head -2 | sed "s/^/[$1 $2] /"; }
run 1 X=0
run 1,128 X=0
for pad in 4096 65536 1048576 2097152; do run 1,128 DSC_ARENA_PAD=$pad; done
for al in 65536 2097152; do run 1,128 DSC_ARENA_ALIGN=$al; run 1 DSC_ARENA_ALIGN=$al; done
