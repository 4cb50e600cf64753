#!/usr/bin/env bash
# Serving on the H200, run ON the GPU machine from the repo root with .gpu/ carried
# (scripts/gpu-prepare.sh builds it): carry [".gpu/dsc-runtime", ".gpu/serve"].
# For each plan in .gpu/serve/*.plan: `dsc-runtime serve --backend gpu`, the load script
# (64 concurrent streaming clients, then 1 client for single-stream latency), graceful stop.
# RUNTIME=path serves with another runtime binary (e.g. the previous commit's, for a same-call
# A/B); TAG=name goes into the output files' names; REPEAT=n runs the 64-client load n times.
# SERVE_BENCH=1 also runs the serving benchmark (bench/serve.py, copied as .gpu/serve/serve.py)
# on each plan: 1,000 requests of 128 in / 128 out at max throughput, then a sweep of request
# rates drawn as a PNG (SWEEP=rates, default 8,16,32,64,inf; IN/OUT/PROMPTS override).
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
  if [ -n "${SERVE_BENCH:-}" ]; then
    python3 .gpu/serve/serve.py --base http://127.0.0.1:$port --model "$model" --api-key k --num-prompts ${PROMPTS:-1000} --input-len ${IN:-128} --output-len ${OUT_LEN:-128} --rate inf --json "$out/bench-serve-$name-max.json" || status=1
    python3 .gpu/serve/serve.py --base http://127.0.0.1:$port --model "$model" --api-key k --num-prompts ${PROMPTS:-1000} --input-len ${IN:-128} --output-len ${OUT_LEN:-128} --sweep ${SWEEP:-8,16,32,64,inf} --goodput ttft=1000,tpot=50 --json "$out/bench-serve-$name-sweep.json" --png "$out/bench-serve-$name-sweep.png" || status=1
  fi
  curl -s localhost:$port/metrics > "$out/metrics-$name.txt"
  grep -E "^dsc_(gpu_utilization|gpu_memory_used|kv_blocks|preemptions|engine_steps)" "$out/metrics-$name.txt" | head -12
  kill -TERM $pid; wait $pid || status=1
  tail -1 "$out/serve-$name.log"
  port=$((port + 1))
done
exit $status
