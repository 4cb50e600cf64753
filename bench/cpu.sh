#!/usr/bin/env bash
# CPU inference benchmark (issue 38): dsc's compiled x86-64 kernels against llama.cpp
# (llama-cpp-python) on the same GGUF, same token ids, same thread count, in one run; the
# reference executor too. dsc and llama.cpp run alternately REPS times (a shared VM's neighbours
# move single runs by +-20%); the medians are compared, every run kept. Writes
# bench/results/cpu-<cpu vendor>-<date>.json with the commit.
# usage: bench/cpu.sh [THREADS] [REPS]   (defaults: every core, 5)
#        MODEL=kquant bench/cpu.sh ...   the K-quant kernels instead: a Q4_K_M GGUF of SmolLM2's
#        size made by llama.cpp (bench/make_kquant.py; results named cpu-kquant-<vendor>-<date>)
#        MODEL=q4_k_m bench/cpu.sh ...   SmolLM2 itself as llama.cpp's Q4_K_M (mostly Q5_0
#        fallbacks; bench/make_kquant.py --requantize; cpu-q4_k_m-<vendor>-<date>)
set -euo pipefail
cd "$(dirname "$0")/.."
threads="${1:-$(nproc)}"
reps="${2:-5}"
gguf=.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$gguf" ] || ./scripts/fetch-model.sh
toml=models/smollm2-135m.toml plan=.cache/plans/smollm2-135m.plan model="SmolLM2-135M-Instruct Q4_1 GGUF" tag=cpu
if [ "${MODEL:-}" = kquant ]; then
  toml=models/llama-kquant-bench.toml plan=.cache/plans/llama-kquant-bench.plan tag=cpu-kquant
  model="llama-kquant-bench Q4_K_M GGUF (bench/make_kquant.py: SmolLM2's size and tokenizer, hidden 512, random weights, quantized by llama.cpp)"
elif [ "${MODEL:-}" = q4_k_m ]; then
  toml=models/smollm2-135m-q4_k_m.toml plan=.cache/plans/smollm2-135m-q4_k_m.plan tag=cpu-q4_k_m
  model="SmolLM2-135M-Instruct Q4_K_M GGUF (llama.cpp's llama_model_quantize of the Q4_1 file: 166 Q5_0, 15 Q8_0, 16 Q4_K, 14 Q6_K tensors)"
fi
# (built without GGML_NATIVE: a native build on a Sapphire Rapids VM dies with an illegal
# instruction; AVX-512 where the CPU has it, else AVX2)
if ! python3 -c "import llama_cpp" 2>/dev/null; then
  avx512=OFF vnni=OFF
  grep -q avx512f /proc/cpuinfo && avx512=ON
  grep -q avx512_vnni /proc/cpuinfo && vnni=ON
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=$avx512 -DGGML_AVX512_VNNI=$vnni" \
    python3 -m pip install --quiet --disable-pip-version-check --no-cache-dir llama-cpp-python
fi
if [ "${MODEL:-}" = kquant ]; then
  gguf=.cache/models/llama-kquant-bench.Q4_K_M.gguf
  [ -f "$gguf" ] || python3 bench/make_kquant.py .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf "$gguf"
elif [ "${MODEL:-}" = q4_k_m ]; then
  gguf=.cache/models/SmolLM2-135M-Instruct.Q4_K_M.gguf
  [ -f "$gguf" ] || python3 bench/make_kquant.py --requantize .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf "$gguf"
fi
cargo build --release -p dsc-compiler
mkdir -p .cache/plans bench/results
./target/release/dsc compile "$toml" -o "$plan"
tmp=$(mktemp -d)
for i in $(seq 1 "$reps"); do
  ./target/release/dsc bench-cpu "$plan" --threads "$threads" --json "$tmp/dsc$i.json" > /dev/null
  python3 bench/cpu_peer.py "$gguf" --threads "$threads" > "$tmp/peer$i.json"
done
./target/release/dsc bench-cpu "$plan" --reference --decode 16 --prefill 64 --json "$tmp/ref.json" > /dev/null
vendor=$(awk -F': ' '/^vendor_id/ {print $2; exit}' /proc/cpuinfo | tr 'A-Z' 'a-z' | tr -cd 'a-z0-9')
out="bench/results/$tag-${vendor:-$(hostname -s)}-$(date -u +%F).json"
python3 - "$tmp" "$out" "$threads" "$reps" "$model" "${MODEL:+MODEL=$MODEL }" <<'PY'
import json, statistics, subprocess, sys, datetime, platform
tmp, out, threads, reps, model, env = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
runs = {k: [json.load(open(f"{tmp}/{k}{i}.json")) for i in range(1, reps + 1)] for k in ("dsc", "peer")}
r = json.load(open(f"{tmp}/ref.json"))


def median(rs):
    m = dict(rs[0])
    for key in ("prefill_tokens_per_s", "decode_tokens_per_s", "decode_ms_per_token"):
        m[key] = statistics.median(x[key] for x in rs)
        m[key.replace("_per_s", "_per_s_runs").replace("_per_token", "_per_token_runs")] = [x[key] for x in rs]
    return m


d, p = median(runs["dsc"]), median(runs["peer"])
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
res = {
    "command": f"{env}bench/cpu.sh {threads} {reps}",
    "commit": subprocess.check_output(["git", "rev-parse", "HEAD"], text=True).strip(),
    "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    "machine": f"{cpu}, {threads} threads",
    "model": model,
    "dsc_cpu": d, "llama_cpp": p, "dsc_reference": r,
}
json.dump(res, open(out, "w"), indent=2)
print(f"{'':<22}{'prefill tok/s':>14}{'decode tok/s':>14}   (medians of {reps} alternating runs; decode runs: dsc {[round(x) for x in d['decode_tokens_per_s_runs']]}, llama.cpp {[round(x) for x in p['decode_tokens_per_s_runs']]})")
for name, x in (("dsc --backend cpu", d), ("llama.cpp", p), ("dsc reference", r)):
    print(f"{name:<22}{x['prefill_tokens_per_s']:>14.1f}{x['decode_tokens_per_s']:>14.1f}")
print(f"(prefill {d['prefill_tokens']} tokens; decode {d['decode_tokens']} after 16; reference: prefill {r['prefill_tokens']}, decode {r['decode_tokens']})")
print(f"wrote {out}")
PY
