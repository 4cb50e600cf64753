#!/usr/bin/env bash
# Serving on the H200, run ON the GPU machine from the repo root with .gpu/ carried
# (scripts/gpu-prepare.sh builds it): carry [".gpu/dsc-runtime", ".gpu/serve"].
# For each plan in .gpu/serve/*.plan: `dsc-runtime serve --backend gpu`, the load script
# (64 concurrent streaming clients, then 1 client for single-stream latency), graceful stop.
# RUNTIME=path serves with another runtime binary (e.g. the previous commit's, for a same-call
# A/B); TAG=name goes into the output files' names; REPEAT=n runs the 64-client load n times.
set -uo pipefail
out=${OUT:-.gpu/out}
rt=${RUNTIME:-.gpu/dsc-runtime}
tag=${TAG:-}
repeat=${REPEAT:-1}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0
status=0
port=8100
for plan in .gpu/serve/*.plan; do
  name=$(basename "$plan" .plan)$tag
  model=$($rt inspect "$plan" | awk '/^model:/ {print $2; exit}')
  $rt serve "$plan" --backend gpu --port $port --api-key k --max-seqs 64 > "$out/serve-$name.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 240); do curl -fs localhost:$port/ready >/dev/null 2>&1 && break; sleep 0.5; done
  echo "== $name ($model): $(head -2 "$out/serve-$name.log" | tr '\n' ' ')"
  for c in $(for _ in $(seq 1 "$repeat"); do echo 64; done) 1; do
    python3 .gpu/serve/load.py http://127.0.0.1:$port "$model" k --clients $c --max-tokens 64 --allow-mismatch --json "$out/load-$name-c$c.json" > "$out/load-$name-c$c.log" 2>&1 || status=1
    tail -1 "$out/load-$name-c$c.log"
    python3 - "$out/load-$name-c$c.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"  clients {r['clients']}: {r['generated_tokens_per_s']:.0f} tok/s, TTFT p50 {r['ttft_s']['p50']*1e3:.0f} ms p99 {r['ttft_s']['p99']*1e3:.0f} ms, e2e p50 {r['e2e_s']['p50']*1e3:.0f} ms p99 {r['e2e_s']['p99']*1e3:.0f} ms, complete {r['complete']}, equal to solo {r['equal_to_solo']}")
PY
  done
  curl -s localhost:$port/metrics > "$out/metrics-$name.txt"
  grep -E "^dsc_(gpu_utilization|gpu_memory_used|kv_blocks|preemptions|engine_steps)" "$out/metrics-$name.txt" | head -12
  kill -TERM $pid; wait $pid || status=1
  tail -1 "$out/serve-$name.log"
  port=$((port + 1))
done
exit $status
