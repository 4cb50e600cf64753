#!/usr/bin/env bash
# The long reference case (issue 33): the opening of data/coriolanus-act1.txt as one prompt of
# ~1,600 tokens and its greedy continuation, computed by the exact f32 numpy reference
# (../shared/reference/numpy_ref.py: the GGUF dequantized by the `gguf` package, f32 math) —
# the same reference the shared prompts have, near the model's 2,048-token context.
# Usage: scripts/long-reference.sh [CHARS] (needs target/release/dsc, the default model, numpy, gguf)
set -euo pipefail
cd "$(dirname "$0")/.."
chars=${1:-5600}
gguf=.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf
plan=.cache/smol.plan
out=tests/fixtures/reference/smollm2-q4_1-numpy-long.json
[ -f "$plan" ] || ./target/release/dsc compile models/smollm2-135m.toml -o "$plan"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
./target/release/dsc tokenize "$plan" --file data/coriolanus-act1.txt --chars "$chars" > "$tmp/ids.json"
python3 - "$tmp/ids.json" "$tmp/in.json" "$chars" <<'PY'
import json, sys
ids = json.load(open(sys.argv[1]))["ids"]
# numpy_ref.py reads the prompt ids and the continuation length (greedy_ids) from its input
json.dump([{"name": f"long-{len(ids)}", "prompt_ids": ids, "top5_first": [[-1, 0.0]], "greedy_ids": [0] * 32}], open(sys.argv[2], "w"))
PY
python3 ../shared/reference/numpy_ref.py "$gguf" "$tmp/in.json" "$tmp/out.json"
python3 - "$tmp/out.json" "$out" "$chars" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for p in r:
    p["text_file"] = "data/coriolanus-act1.txt"; p["text_chars"] = int(sys.argv[3])
json.dump(r, open(sys.argv[2], "w"))
print(sys.argv[2], [(p["name"], len(p["prompt_ids"]), len(p["greedy_ids"]), min(p["greedy_margins"])) for p in r])
PY
