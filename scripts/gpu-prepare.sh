#!/usr/bin/env bash
# Build what the GPU machine needs into .gpu/ (git-ignored): the runtime-only binary and the
# kernel-check bundle (PTX from our codegen + inputs + CPU reference outputs).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p dsc-compiler -p dsc-runtime
mkdir -p .gpu
cp target/release/dsc-runtime .gpu/
./target/release/dsc gpu-bundle --dir .gpu/check
./target/release/dsc compile models/llama3-8b-seeded.toml -o .gpu/llama3-8b.plan
du -sh .gpu
