#!/usr/bin/env bash
# The default plans compiled by BASE (a git ref, default origin's main as this clone has it:
# `main`) and by the working tree, their PTX compared up to label numbering and kernel symbol
# names (scripts/plan_ptx.py). The plans: the SmolLM2 shape (seeded bf16), the Llama-3-8B
# shape (seeded), the real SmolLM2 Q4_1 and SmolLM2 at tp=2. Needs scripts/setup.sh and
# scripts/fetch-model.sh once. Prints one line per plan and target; exit 0 when all match.
#
#   scripts/plan-ptx-diff.sh 40f95d4
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:-main}
out=${OUT_DIR:-.cache/ptx-diff}
rm -rf "$out" && mkdir -p "$out/base" "$out/new"
wt=$(mktemp -d)
trap 'git worktree remove --force "$wt" >/dev/null 2>&1 || true' EXIT
git worktree add --detach "$wt" "$base" >/dev/null
mkdir -p "$wt/.cache" && ln -sfn "$PWD/.cache/models" "$wt/.cache/models"
compile_all() { # $1: repo dir, $2: dsc binary, $3: output dir
  (cd "$1" && "$2" compile models/smollm2-shape-seeded.toml -o "$3/smollm2-shape.plan" \
    && "$2" compile models/llama3-8b-seeded.toml -o "$3/llama3-8b.plan" \
    && "$2" compile models/smollm2-135m.toml -o "$3/smollm2-135m.plan" \
    && "$2" compile models/smollm2-135m.toml --tp 2 -o "$3/smollm2-135m-tp2.plan") 2>&1 | grep -E "^wrote" || true
}
# The base builds in its own target dir (.cache/ptx-diff-target, kept: the first run builds the
# dependencies, ~15 min on 2 cores; later runs only the workspace): two checkouts of one
# workspace share crate hashes, so one target dir for both mixes their libraries.
exe() { cargo build -p dsc-compiler --bin dsc --message-format=json "$@" | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "dsc":
        print(m["executable"])'; }
base_dsc=$(CARGO_TARGET_DIR="$PWD/.cache/ptx-diff-target" exe --manifest-path "$wt/Cargo.toml")
cp "$base_dsc" "$out/dsc-base"
new_dsc=$(exe)
cp "$new_dsc" "$out/dsc-new"
compile_all "$wt" "$PWD/$out/dsc-base" "$PWD/$out/base"
compile_all "$PWD" "$PWD/$out/dsc-new" "$PWD/$out/new"
python3 scripts/plan_ptx.py "$out/base" "$out/new"
