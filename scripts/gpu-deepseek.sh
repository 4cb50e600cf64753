#!/usr/bin/env bash
# The DeepSeek family on the GPU (H200): the MoE / MLA / YaRN kernels against the CPU
# executor, the three tiny HF fixtures end to end (GPU vs CPU executor, teacher-forced, and the
# GPU's free greedy continuation against HF's), the V2-Lite-dims 2-layer plan decoding with
# its first steps checked against the CPU executor, and the V2-Lite shape's decode speed.
# Here:  bash scripts/gpu-deepseek.sh --prepare      (fills .gpu/ds: runtime, bundle, plans;
#        CHECK_ONLY=a,b picks the kernel checks, SLIM=1 the plans of one A/B call, below)
# There: carry [".gpu/ds"], run `bash scripts/gpu-deepseek.sh` ; results under $OUT.
# (STAGES="check e2e decode bench serve" picks stages; BATCHES=1,32 the bench's batch sizes;
# serve: the V2-Lite shape behind `dsc serve` under 64 concurrent clients, then an expert
# disabled through POST /admin/experts and 8 more clients; `timeline`, not in the default:
# the V2-Lite b1 decode step kernel by kernel inside its CUDA graph, scripts/gpu-timeline.sh)
set -uo pipefail
cd "$(dirname "$0")/.."
D=.gpu/ds
if [ "${1:-}" = "--prepare" ]; then
  set -e
  cargo build --release -p dsc-compiler -p dsc-runtime
  rm -rf $D && mkdir -p $D
  xz -T2 -6 -c target/release/dsc-runtime > $D/dsc-runtime.xz
  ./target/release/dsc gpu-bundle --dir $D/check --only ${CHECK_ONLY:-moe_,mla_,head_matmul,rope_yarn}
  rm -f $D/check/kernels.ll $D/check/kernels.mlir $D/check/kernels.sm_80.ptx
  xz -T2 -6 -f $D/check/data.bin
  # the tiny HF fixtures: f32 KV pools, and V3's with bf16 pools; their reference in
  # gpu-e2e's format (HF's prompt, greedy continuation and the margins there)
  for f in v2-lite-tiny v2-tiny v3-tiny v3-tiny:bf16; do
    name=${f%%:*}; kv=${f#*:}; [ "$kv" = "$f" ] && kv=f32
    printf '[model]\nname = "%s"\narchitecture = "deepseek"\n\n[weights]\nformat = "safetensors"\npath = "%s"\n\n[limits]\nmax_seq_len = 64\nkv_block_size = 4\nmax_batch = 4\n\n[precision]\nactivations = "f32"\nkv_cache = "%s"\n' \
      "$name" "$PWD/tests/fixtures/deepseek/$name" "$kv" > .cache/ds-$name-$kv.toml
    ./target/release/dsc compile .cache/ds-$name-$kv.toml -o $D/$name-$kv.plan
    python3 -c "
import json, sys
r = json.load(open('tests/fixtures/deepseek/$name/reference.json'))
n = len(r['prompt'])
json.dump([{'name': '$name', 'prompt_ids': r['prompt'], 'greedy_ids': r['greedy'], 'greedy_margins': r['full_top2_margin'][n - 1:n - 1 + len(r['greedy'])]}], open('$D/$name-ref.json', 'w'))"
  done
  # v3-tiny with bf16 weights: the one-token shared-expert slots (`fuse_moe_shared`) on a
  # shape whose decode steps the CPU executor checks
  printf '[model]\nname = "v3-tiny"\narchitecture = "deepseek"\n\n[weights]\nformat = "safetensors"\npath = "%s"\n\n[limits]\nmax_seq_len = 64\nkv_block_size = 4\nmax_batch = 4\n\n[precision]\nweights = "bf16"\nactivations = "f32"\n' \
    "$PWD/tests/fixtures/deepseek/v3-tiny" > .cache/ds-v3-tiny-bf16w.toml
  ./target/release/dsc compile .cache/ds-v3-tiny-bf16w.toml -o $D/v3-tiny-bf16w.plan
  # (and without the shared-expert slots, to tell them apart from the rest of the bf16 path)
  DSC_MOE_SHARED=0 ./target/release/dsc compile .cache/ds-v3-tiny-bf16w.toml -o $D/v3-tiny-bf16w-noshared.plan
  for m in v2-lite-2layer v2-lite v3-4layer; do
    ./target/release/dsc compile models/deepseek-$m-seeded.toml -o $D/$m.plan
  done
  # serving: the V2-Lite shape with SmolLM2's tokenizer (its vocabulary fits in 102,400)
  sed "s#^config = \"#config = \"$PWD/models/#" models/deepseek-v2-lite-seeded.toml > .cache/ds-v2-lite-serve.toml
  printf '\n[tokenizer]\ngguf = "%s"\n' "$PWD/.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf" >> .cache/ds-v2-lite-serve.toml
  ./target/release/dsc compile .cache/ds-v2-lite-serve.toml -o $D/v2-lite-serve.plan
  cp tests/serve/load.py $D/
  if [ -n "${SLIM:-}" ]; then
    # (one call's 64 MiB: the V2-Lite plan beside one without the one-token shared-expert
    # slots, DSC_MOE_SHARED=0, for BENCH_MODELS="v2-lite-noshared v2-lite"; no V3 4-layer
    # plan, of the tiny f32 plans only V3's — E2E_PLANS="v3-tiny-f32 v3-tiny-bf16")
    DSC_MOE_SHARED=0 ./target/release/dsc compile models/deepseek-v2-lite-seeded.toml -o $D/v2-lite-noshared.plan
    rm -f $D/v3-4layer.plan $D/v2-lite-tiny-f32.plan $D/v2-tiny-f32.plan
  fi
  du -sh $D
  exit 0
fi
out=${OUT:-/tmp/out}
mkdir -p "$out"
status=0
python3 -c "import lzma, shutil; shutil.copyfileobj(lzma.open('$D/dsc-runtime.xz'), open('$D/dsc-runtime', 'wb'))" && chmod +x $D/dsc-runtime
stages=${STAGES:-check e2e decode bench serve}
if [[ " $stages " == *" check "* ]]; then
  python3 -c "import lzma, shutil; shutil.copyfileobj(lzma.open('$D/check/data.bin.xz'), open('$D/check/data.bin', 'wb'))"
  $D/dsc-runtime gpu-check $D/check --target sm_90a --json "$out/ds-kernels.json" 2>&1 | tail -30
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi
if [[ " $stages " == *" e2e "* ]]; then
  for p in ${E2E_PLANS:-v2-lite-tiny-f32 v2-tiny-f32 v3-tiny-f32 v3-tiny-bf16}; do
    echo "== $p"
    $D/dsc-runtime gpu-e2e $D/$p.plan $D/${p%-*}-ref.json --json "$out/ds-e2e-$p.json" 2>&1 | tail -4
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
  done
fi
if [[ " $stages " == *" decode "* ]]; then
  $D/dsc-runtime gpu-decode $D/v2-lite-2layer.plan --prompt-len 16 --steps 64 --cpu-check-steps 3 --json "$out/ds-decode-v2-lite-2layer.json" 2>&1 | tail -6
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
  for p in v3-tiny-bf16w v3-tiny-bf16w-noshared; do
    $D/dsc-runtime gpu-decode $D/$p.plan --prompt-len 8 --steps 32 --cpu-check-steps 8 --json "$out/ds-decode-$p.json" 2>&1 | tail -4
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
  done
fi
if [[ " $stages " == *" bench "* ]]; then
  for m in ${BENCH_MODELS:-v2-lite}; do
    $D/dsc-runtime bench $D/$m.plan --batches ${BATCHES:-1,32} --prefill ${PREFILL:-512} --prompt-len 32 --new-tokens 64 --json "$out/ds-bench-$m.json" 2>&1 | tail -12
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
  done
fi
if [[ " $stages " == *" serve "* ]]; then
  # 64 concurrent streaming clients, then expert failover at run time: disable an expert
  # through the admin endpoint and serve on
  port=8200
  $D/dsc-runtime serve $D/v2-lite-serve.plan --backend gpu --port $port --api-key k --max-seqs 64 > "$out/ds-serve.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 240); do curl -fs localhost:$port/ready >/dev/null 2>&1 && break; sleep 0.5; done
  model=$($D/dsc-runtime inspect $D/v2-lite-serve.plan | awk '/^model:/ {print $2; exit}')
  python3 $D/load.py http://127.0.0.1:$port "$model" k --clients 64 --max-tokens 64 --allow-mismatch --json "$out/ds-load-c64.json" 2>&1 | tail -2 || status=1
  curl -s -H "Authorization: Bearer k" -H "Content-Type: application/json" -d '{"layer": 1, "expert": 5, "enabled": false}' localhost:$port/admin/experts | head -c 300; echo
  python3 $D/load.py http://127.0.0.1:$port "$model" k --clients 8 --max-tokens 32 --allow-mismatch --json "$out/ds-load-failover-c8.json" 2>&1 | tail -1 || status=1
  curl -s localhost:$port/metrics | grep -E "^dsc_(kv_blocks|moe_disabled|preemptions|requests_total)" | head -12
  # (the per-expert load the routers counted on the device: selections per layer, which is
  # top_k x the tokens routed)
  curl -s localhost:$port/metrics | python3 -c "
import sys, collections
per = collections.Counter()
for l in sys.stdin:
    if l.startswith('dsc_moe_expert_tokens'):
        per[l.split('layer=\"')[1].split('\"')[0]] += float(l.split()[-1])
print('routed selections per MoE layer (first 3):', sorted(per.items(), key=lambda kv: int(kv[0]))[:3], 'layers:', len(per))
"
  curl -s localhost:$port/metrics | grep -E "^dsc_moe_load_imbalance" | head -3
  kill -TERM $pid; wait $pid || status=1
  tail -1 "$out/ds-serve.log"
fi
if [[ " $stages " == *" timeline "* ]]; then
  # (a b1 step starts with the first layer's q/kv_a GEMV, the embedding gather folded in)
  first=$(python3 -c "
import json, struct
f = open('$D/v2-lite.plan', 'rb'); pre = f.read(104); h = json.loads(f.read(struct.unpack_from('<Q', pre, 16)[0]))
print(next(s['kernel'] for s in h['gpu']['steps'] if s['kernel'] and not s.get('min_rows')))")
  mkdir -p "$out/tl"
  OUT="$out/tl" bash scripts/gpu-timeline.sh $D/dsc-runtime $D/v2-lite.plan "$first" --batches 1 --prefill 8 --new-tokens 96 2>&1 | head -40
fi
exit $status
