#!/usr/bin/env bash
# Set up and run the main job on the default model: fetch SmolLM2-135M-Instruct (Q4_1 GGUF),
# build dsc, compile the model to a plan, inspect it, and generate text.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
./scripts/fetch-model.sh
cargo build --release -p dsc-compiler
mkdir -p .cache/plans
./target/release/dsc compile models/smollm2-135m.toml -o .cache/plans/smollm2-135m.plan
./target/release/dsc inspect .cache/plans/smollm2-135m.plan
./target/release/dsc run .cache/plans/smollm2-135m.plan --chat --prompt "${1:-What is the capital of France?}" --max-tokens 48
