#!/usr/bin/env bash
# CPU inference benchmark (issue 38): dsc's compiled x86-64 kernels against llama.cpp
# (llama-cpp-python) on the same GGUF, same token ids, same thread count, in one run; the
# reference executor too. Writes bench/results/cpu-<host>-<date>.json with the commit.
# usage: bench/cpu.sh [THREADS]   (default: every core)
set -euo pipefail
cd "$(dirname "$0")/.."
threads="${1:-$(nproc)}"
gguf=.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf
plan=.cache/plans/smollm2-135m.plan
[ -f "$gguf" ] || ./scripts/fetch-model.sh
# (built without GGML_NATIVE: a native build on a Sapphire Rapids VM dies with an illegal
# instruction; AVX-512 where the CPU has it, else AVX2)
if ! python3 -c "import llama_cpp" 2>/dev/null; then
  avx512=OFF vnni=OFF
  grep -q avx512f /proc/cpuinfo && avx512=ON
  grep -q avx512_vnni /proc/cpuinfo && vnni=ON
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=$avx512 -DGGML_AVX512_VNNI=$vnni" \
    python3 -m pip install --quiet --disable-pip-version-check --no-cache-dir llama-cpp-python
fi
cargo build --release -p dsc-compiler
mkdir -p .cache/plans bench/results
./target/release/dsc compile models/smollm2-135m.toml -o "$plan"
tmp=$(mktemp -d)
./target/release/dsc bench-cpu "$plan" --threads "$threads" --json "$tmp/dsc.json" > /dev/null
python3 bench/cpu_peer.py "$gguf" --threads "$threads" > "$tmp/peer.json"
./target/release/dsc bench-cpu "$plan" --reference --decode 16 --prefill 64 --json "$tmp/ref.json" > /dev/null
out="bench/results/cpu-$(hostname -s)-$(date -u +%F).json"
python3 - "$tmp" "$out" "$threads" <<'PY'
import json, subprocess, sys, datetime, platform
tmp, out, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
d, p, r = (json.load(open(f"{tmp}/{n}.json")) for n in ("dsc", "peer", "ref"))
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
res = {
    "command": f"bench/cpu.sh {threads}",
    "commit": subprocess.check_output(["git", "rev-parse", "HEAD"], text=True).strip(),
    "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    "machine": f"{cpu}, {threads} threads",
    "model": "SmolLM2-135M-Instruct Q4_1 GGUF",
    "dsc_cpu": d, "llama_cpp": p, "dsc_reference": r,
}
json.dump(res, open(out, "w"), indent=2)
print(f"{'':<22}{'prefill tok/s':>14}{'decode tok/s':>14}")
for name, x in (("dsc --backend cpu", d), ("llama.cpp", p), ("dsc reference", r)):
    print(f"{name:<22}{x['prefill_tokens_per_s']:>14.1f}{x['decode_tokens_per_s']:>14.1f}")
print(f"(prefill {d['prefill_tokens']} tokens; decode {d['decode_tokens']} after 16; reference: prefill {r['prefill_tokens']}, decode {r['decode_tokens']})")
print(f"wrote {out}")
PY
